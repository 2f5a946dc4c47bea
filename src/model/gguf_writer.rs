//! GGUF v3 writer, and the metadata of a model converted from a Hugging Face directory.
//!
//! Layout: `"GGUF"`, version 3, tensor count, metadata count, the metadata (key, type id, value),
//! the tensor infos (name, dims innermost first, type id, offset from the data section), padding
//! to `general.alignment` (32), then each tensor's data at its aligned offset.
//!
//! Conventions follow llama.cpp's converter so that other tools load the file: keys
//! `{arch}.block_count`, `{arch}.attention.head_count`..., `tokenizer.ggml.*` taken from
//! `tokenizer.json` / `tokenizer_config.json`, tensor names `blk.N.attn_q.weight`..., 1-D tensors
//! (norms, biases) in F32. Llama-architecture Q/K rows are permuted for adjacent-pair RoPE
//! ([`permute_qk_rows`]); Qwen files keep the HF order (llama.cpp runs them as "neox" RoPE).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::config::{ModelConfig, RopeScaling};
use super::gguf::Value;
use super::quant::GgmlType;
use crate::tokenizer::Tokenizer;

pub const ALIGNMENT: usize = 32;

/// llama.cpp token types.
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_UNUSED: i32 = 5;
/// `general.file_type` of a model whose matrices are F16 (llama.cpp's LLAMA_FTYPE_MOSTLY_F16).
const FILE_TYPE_F16: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum GgufWriteError {
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error(transparent)]
    TokenizerLoad(#[from] crate::tokenizer::TokenizerError),
    #[error("tensor '{tensor}': {got} bytes of data, {want} expected for its shape and type")]
    DataSize { tensor: String, got: usize, want: usize },
    #[error("{0}")]
    Interrupted(#[from] crate::sys::interrupt::Interrupted),
}

/// A tensor to write. `shape` is row-major, outermost first (`[rows, cols]` or `[n]`); GGUF
/// stores the reverse (`[cols, rows]`).
#[derive(Clone, Debug)]
pub struct TensorOut {
    pub name: String,
    pub dtype: GgmlType,
    pub shape: Vec<usize>,
}

impl TensorOut {
    /// Bytes of the tensor's data (its shape in its type).
    pub fn n_bytes(&self) -> usize {
        let cols = self.shape.last().copied().unwrap_or(1);
        let rows: usize = self.shape.iter().rev().skip(1).product();
        self.dtype.row_bytes(cols).unwrap_or(0) * rows
    }
}

fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            // GGUF arrays are homogeneous; an empty array is written as an array of u32.
            out.extend(items.first().map_or(4, value_type).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(out, i));
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
}

/// Writes a GGUF v3 file. `data(i)` yields the bytes of `tensors[i]` (called once each, in
/// order, so a converter can stream a model larger than memory). The file appears under `path`
/// only when complete (written as `path.partial`, then renamed); a SIGINT/SIGTERM (once
/// `sys::interrupt` is installed) stops it before the next tensor, the partial file removed.
pub fn write_gguf<E: From<GgufWriteError>>(
    path: &Path,
    kv: &[(String, Value)],
    tensors: &[TensorOut],
    mut data: impl FnMut(usize) -> Result<Vec<u8>, E>,
) -> Result<(), E> {
    let partial = path.with_extension("gguf.partial");
    let io = |source| GgufWriteError::Io { path: partial.clone(), source };
    let mut head = Vec::new();
    head.extend(b"GGUF");
    head.extend(3u32.to_le_bytes());
    head.extend((tensors.len() as u64).to_le_bytes());
    let has_alignment = kv.iter().any(|(k, _)| k == "general.alignment");
    head.extend(((kv.len() + usize::from(!has_alignment)) as u64).to_le_bytes());
    let mut put_kv = |k: &str, v: &Value| {
        put_str(&mut head, k);
        head.extend(value_type(v).to_le_bytes());
        put_value(&mut head, v);
    };
    if !has_alignment {
        put_kv("general.alignment", &Value::U32(ALIGNMENT as u32));
    }
    kv.iter().for_each(|(k, v)| put_kv(k, v));
    let mut offset = 0usize;
    let mut offsets = Vec::with_capacity(tensors.len());
    for t in tensors {
        put_str(&mut head, &t.name);
        head.extend((t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            head.extend((d as u64).to_le_bytes());
        }
        head.extend(t.dtype.id().to_le_bytes());
        head.extend((offset as u64).to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.n_bytes()).next_multiple_of(ALIGNMENT);
    }
    head.resize(head.len().next_multiple_of(ALIGNMENT), 0);

    // A missing folder of the output is made, as for a safetensors directory.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| E::from(io(e)))?;
    }
    let mut w = BufWriter::with_capacity(1 << 20, File::create(&partial).map_err(|e| E::from(io(e)))?);
    w.write_all(&head).map_err(|e| E::from(io(e)))?;
    let mut written = 0usize;
    for (i, t) in tensors.iter().enumerate() {
        let pad = offsets[i] - written;
        w.write_all(&vec![0u8; pad]).map_err(|e| E::from(io(e)))?;
        // Between tensors, where stopping leaves nothing half-made: the partial file goes.
        if let Err(stop) = crate::sys::interrupt::check(|| {
            format!("before {} was complete ({} of {} tensors); nothing was written", path.display(), i, tensors.len())
        }) {
            drop(w);
            let _ = std::fs::remove_file(&partial);
            return Err(E::from(GgufWriteError::from(stop)));
        }
        let bytes = data(i)?;
        if bytes.len() != t.n_bytes() {
            let _ = std::fs::remove_file(&partial);
            return Err(E::from(GgufWriteError::DataSize {
                tensor: t.name.clone(),
                got: bytes.len(),
                want: t.n_bytes(),
            }));
        }
        w.write_all(&bytes).map_err(|e| E::from(io(e)))?;
        written = offsets[i] + bytes.len();
    }
    w.flush().map_err(|e| E::from(io(e)))?;
    drop(w);
    std::fs::rename(&partial, path).map_err(|source| E::from(GgufWriteError::Io { path: path.to_path_buf(), source }))
}

/// Reorders the rows of a Q or K projection (`[n_heads * head_dim, cols]`, `row_bytes` each)
/// from the HF "rotate half" order to llama.cpp's adjacent-pair order: within each head, output
/// row `2i + s` is input row `s * head_dim / 2 + i`, so HF's pair (i, i + head_dim/2) becomes
/// (2i, 2i + 1). A bias vector is the same with one-element rows.
pub fn permute_qk_rows(src: &[u8], n_rows: usize, n_heads: usize) -> Vec<u8> {
    let rb = src.len() / n_rows.max(1);
    let hd = n_rows / n_heads.max(1);
    let half = hd / 2;
    let mut out = Vec::with_capacity(src.len());
    for h in 0..n_heads {
        for i in 0..half {
            for s in 0..2 {
                let r = h * hd + s * half + i;
                out.extend_from_slice(&src[r * rb..(r + 1) * rb]);
            }
        }
    }
    out
}

/// Llama 3 RoPE scaling as llama.cpp stores it: a `rope_freqs.weight` tensor of per-pair
/// frequency divisors (`[head_dim / 2]`) instead of metadata.
pub fn llama3_freq_factors(c: &ModelConfig) -> Option<Vec<f32>> {
    let RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } = c.rope_scaling else {
        return None;
    };
    let (factor, lo, hi, ctx) =
        (factor as f64, low_freq_factor as f64, high_freq_factor as f64, original_context as f64);
    let unscaled = ModelConfig { rope_scaling: RopeScaling::None, ..c.clone() };
    Some(
        unscaled
            .rope_inv_freq()
            .iter()
            .map(|&f| {
                let wavelen = 2.0 * std::f64::consts::PI / f as f64;
                if wavelen < ctx / hi {
                    1.0
                } else if wavelen > ctx / lo {
                    factor as f32
                } else {
                    let smooth = (ctx / wavelen - lo) / (hi - lo);
                    (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                }
            })
            .collect(),
    )
}

/// What the architecture metadata needs beyond [`ModelConfig`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvExtras {
    /// Width of the shared expert (`expert_shared_feed_forward_length`) as a checkpoint's
    /// tensors have it; else `MoeConfig::shared_ffn_dim`.
    pub shared_ffn: Option<usize>,
    /// `mrope_section` of a Qwen3.5 config (`rope.dimension_sections`, padded to 4); when
    /// missing, the rotated pairs split as the released configs split them.
    pub rope_sections: Option<Vec<u32>>,
}

/// The architecture metadata of a model (llama.cpp key names).
pub fn model_kv(c: &ModelConfig, name: &str) -> Vec<(String, Value)> {
    model_kv_with(c, name, &KvExtras::default())
}

/// [`model_kv`] with what the configuration does not hold. Hybrid models get the keys
/// llama.cpp's converter writes for them: `ssm.*`, `attention.recurrent_layers`,
/// `full_attention_interval`, `rope.dimension_count` (the rotated dims) and, for the Qwen3.5
/// families, `rope.dimension_sections`; a model without a dense FFN has no
/// `feed_forward_length`.
pub fn model_kv_with(c: &ModelConfig, name: &str, x: &KvExtras) -> Vec<(String, Value)> {
    let a = c.arch.name();
    let u = |v: usize| Value::U32(v as u32);
    let mut kv = vec![
        ("general.architecture".to_string(), Value::String(a.into())),
        ("general.type".to_string(), Value::String("model".into())),
        ("general.name".to_string(), Value::String(name.into())),
        ("general.file_type".to_string(), Value::U32(FILE_TYPE_F16)),
        ("general.quantization_version".to_string(), Value::U32(2)),
        (format!("{a}.block_count"), u(c.n_layers)),
        (format!("{a}.context_length"), u(c.max_context)),
        (format!("{a}.embedding_length"), u(c.dim)),
    ];
    if c.ffn_dim > 0 {
        kv.push((format!("{a}.feed_forward_length"), u(c.ffn_dim)));
    }
    let rotary = c.hybrid.as_ref().map_or(c.head_dim, |h| h.rotary_dim);
    kv.extend([
        (format!("{a}.attention.head_count"), u(c.n_heads)),
        (format!("{a}.attention.head_count_kv"), u(c.n_kv_heads)),
        (format!("{a}.attention.key_length"), u(c.head_dim)),
        (format!("{a}.attention.value_length"), u(c.head_dim)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(c.rms_eps)),
        (format!("{a}.rope.freq_base"), Value::F32(c.rope_theta)),
        (format!("{a}.rope.dimension_count"), u(rotary)),
        (format!("{a}.vocab_size"), u(c.vocab_size)),
    ]);
    if let RopeScaling::Linear { factor } = c.rope_scaling {
        kv.push((format!("{a}.rope.scaling.type"), Value::String("linear".into())));
        kv.push((format!("{a}.rope.scaling.factor"), Value::F32(factor)));
    }
    if c.arch.family().gguf_rope_sections {
        let pairs = (rotary / 2) as u32;
        let mut s = x.rope_sections.clone().unwrap_or_else(|| {
            let a = pairs.div_ceil(3);
            vec![a, a, pairs.saturating_sub(2 * a)]
        });
        s.resize(4, 0);
        kv.push((
            format!("{a}.rope.dimension_sections"),
            Value::Array(s.into_iter().map(|v| Value::I32(v as i32)).collect()),
        ));
    }
    // Which layers are sparse is told by their `ffn_gate_inp` tensors (see `MoeConfig::from_gguf`).
    if let Some(m) = &c.moe {
        kv.push((format!("{a}.expert_count"), u(m.n_experts)));
        kv.push((format!("{a}.expert_used_count"), u(m.n_used)));
        kv.push((format!("{a}.expert_feed_forward_length"), u(m.expert_ffn_dim)));
        if let Some(sf) = x.shared_ffn.or(m.shared_ffn_dim) {
            kv.push((format!("{a}.expert_shared_feed_forward_length"), u(sf)));
        }
        kv.push((format!("{a}.expert_weights_norm"), Value::Bool(m.norm_topk_prob)));
    }
    if let Some(h) = &c.hybrid {
        kv.extend([
            (format!("{a}.ssm.conv_kernel"), u(h.conv_kernel)),
            (format!("{a}.ssm.state_size"), u(h.d_k)),
            (format!("{a}.ssm.group_count"), u(h.n_k_heads)),
            (format!("{a}.ssm.time_step_rank"), u(h.n_v_heads)),
            (format!("{a}.ssm.inner_size"), u(h.value_dim())),
            (
                format!("{a}.attention.recurrent_layers"),
                Value::Array(h.recurrent.iter().map(|&r| Value::Bool(r)).collect()),
            ),
        ]);
        // The interval of the pattern "every k-th layer full attention", when it is one.
        if let Some(k) = h.recurrent.iter().position(|&r| !r).map(|i| i + 1) {
            if super::hybrid::by_interval(h.recurrent.len(), k) == h.recurrent {
                kv.push((format!("{a}.full_attention_interval"), u(k)));
            }
        }
    }
    kv
}

/// The `tokenizer.ggml.pre` name of an HF pre-tokenizer, recognised by its structure (llama.cpp
/// identifies it by hashing tokenizer outputs; the regexes below are what those names mean).
fn pre_name(pre: &Json) -> Option<&'static str> {
    let ty = |v: &Json| v.get("type").and_then(Json::as_str).map(str::to_string);
    let use_regex = |v: &Json| v.get("use_regex").and_then(Json::as_bool).unwrap_or(true);
    match ty(pre)?.as_str() {
        "ByteLevel" if use_regex(pre) => Some("gpt2"),
        "Sequence" => {
            let items = pre.get("pretokenizers")?.as_array()?;
            match items.as_slice() {
                [d, b] if ty(d)? == "Digits" && ty(b)? == "ByteLevel" && use_regex(b) => {
                    d.get("individual_digits").and_then(Json::as_bool).filter(|&x| x).map(|_| "smollm")
                }
                [s, b] if ty(s)? == "Split" && ty(b)? == "ByteLevel" && !use_regex(b) => {
                    let re = s.get("pattern")?.get("Regex")?.as_str()?;
                    let letters = r"[^\r\n\p{L}\p{N}]?\p{L}+|";
                    if re.contains(&format!(r"{letters}\p{{N}}{{1,3}}|")) {
                        Some("llama-bpe")
                    } else if re.contains(&format!(r"{letters}\p{{N}}|")) {
                        Some("qwen2")
                    } else if re.contains(r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|") {
                        // Qwen3.5: combining marks count as letters.
                        Some("qwen35")
                    } else {
                        None
                    }
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// `tokenizer.ggml.*` metadata from an HF directory's `tokenizer.json` (byte-level BPE only) and
/// the special tokens and chat template of `tokenizer_config.json` / `generation_config.json`.
/// The token list is padded to `n_vocab` (the embedding rows) with unused `[PADi]` tokens.
pub fn tokenizer_kv(dir: &Path, n_vocab: usize) -> Result<Vec<(String, Value)>, GgufWriteError> {
    let path = dir.join("tokenizer.json");
    let bad = |reason: String| GgufWriteError::Tokenizer { path: path.clone(), reason };
    let text = std::fs::read_to_string(&path).map_err(|source| GgufWriteError::Io { path: path.clone(), source })?;
    let j: Json = serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let model = j.get("model").ok_or_else(|| bad("no \"model\"".into()))?;
    if model.get("type").and_then(Json::as_str) != Some("BPE") {
        return Err(bad("only byte-level BPE tokenizers can be written to GGUF".into()));
    }
    let pre = j.get("pre_tokenizer").and_then(pre_name).ok_or_else(|| {
        bad("pre-tokenizer not recognised (gpt2, smollm, llama-bpe, qwen2 and qwen35 styles are)".into())
    })?;
    let vocab = model.get("vocab").and_then(Json::as_object).ok_or_else(|| bad("no model.vocab object".into()))?;
    let mut tokens: Vec<Option<String>> = vec![None; n_vocab];
    let mut types = vec![TOKEN_NORMAL; n_vocab];
    let mut place = |id: u64, text: &str, ty: i32| -> Result<(), GgufWriteError> {
        let slot =
            tokens.get_mut(id as usize).ok_or_else(|| bad(format!("token {text:?} has id {id} beyond {n_vocab}")))?;
        *slot = Some(text.to_string());
        types[id as usize] = ty;
        Ok(())
    };
    for (text, id) in vocab {
        place(id.as_u64().ok_or_else(|| bad(format!("vocab[{text:?}] is not an id")))?, text, TOKEN_NORMAL)?;
    }
    for a in j.get("added_tokens").and_then(Json::as_array).map(Vec::as_slice).unwrap_or(&[]) {
        let (Some(id), Some(text)) = (a.get("id").and_then(Json::as_u64), a.get("content").and_then(Json::as_str))
        else {
            return Err(bad("added_tokens entries need \"id\" and \"content\"".into()));
        };
        let special = a.get("special").and_then(Json::as_bool).unwrap_or(false);
        place(id, text, if special { TOKEN_CONTROL } else { TOKEN_USER_DEFINED })?;
    }
    let tokens: Vec<Value> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| match t {
            Some(t) => Value::String(t),
            None => {
                types[i] = TOKEN_UNUSED;
                Value::String(format!("[PAD{i}]"))
            }
        })
        .collect();
    let merges: Vec<Value> = model
        .get("merges")
        .and_then(Json::as_array)
        .ok_or_else(|| bad("no model.merges list".into()))?
        .iter()
        .map(|m| match m {
            Json::String(s) => Some(Value::String(s.clone())),
            Json::Array(p) => match p.as_slice() {
                [Json::String(a), Json::String(b)] => Some(Value::String(format!("{a} {b}"))),
                _ => None,
            },
            _ => None,
        })
        .collect::<Option<_>>()
        .ok_or_else(|| bad("merges must be \"a b\" strings or [a, b] pairs".into()))?;

    // Special ids, BOS policy and template exactly as dustoff's HF loader reads them.
    let tok = Tokenizer::from_hf_dir(dir)?;
    let mut kv = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(types.into_iter().map(Value::I32).collect())),
        ("tokenizer.ggml.merges".to_string(), Value::Array(merges)),
    ];
    if let Some(b) = tok.bos_id() {
        kv.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(b)));
    }
    if let Some(&e) = tok.eos_ids().first() {
        kv.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(e)));
    }
    // `pad_token` of tokenizer_config.json ("<pad>" or {"content": "<pad>"}), when it names a token.
    let cfg = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok();
    let pad = cfg.and_then(|t| serde_json::from_str::<Json>(&t).ok()).and_then(|c| {
        let p = c.get("pad_token")?;
        let text = p.as_str().or_else(|| p.get("content").and_then(Json::as_str))?;
        tok.encode(text, false, true).ok().filter(|ids| ids.len() == 1).map(|ids| ids[0])
    });
    if let Some(p) = pad {
        kv.push(("tokenizer.ggml.padding_token_id".into(), Value::U32(p)));
    }
    kv.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(tok.add_bos_default())));
    if let Some(t) = tok.chat_template() {
        kv.push(("tokenizer.chat_template".into(), Value::String(t.to_string())));
    }
    Ok(kv)
}

/// Writes `kv` with `key` set to `value` (left out for `None`) and no tensors to `path`, and
/// opens it: for tests of the rules that read only the header.
#[cfg(test)]
pub(crate) fn header_only_with(
    path: &Path,
    mut kv: Vec<(String, Value)>,
    key: &str,
    value: Option<Value>,
) -> super::gguf::GgufFile {
    kv.retain(|(k, _)| k != key);
    kv.extend(value.map(|v| (key.to_string(), v)));
    write_gguf::<GgufWriteError>(path, &kv, &[], |_| Ok(Vec::new())).unwrap();
    super::gguf::GgufFile::open(path).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_makes_halves_pairs_adjacent() {
        // 2 heads of head_dim 4, one-byte rows: head rows [x0 x1 | y0 y1] -> [x0 y0 x1 y1].
        let src: Vec<u8> = (0..8).collect();
        assert_eq!(permute_qk_rows(&src, 8, 2), vec![0, 2, 1, 3, 4, 6, 5, 7]);
    }

    #[test]
    fn writes_a_file_the_reader_accepts() {
        let dir = std::env::temp_dir().join(format!("dustoff-ggufw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.gguf");
        let kv = vec![
            ("a.str".to_string(), Value::String("x".into())),
            ("a.arr".to_string(), Value::Array(vec![Value::I32(1), Value::I32(-2)])),
        ];
        let ts = vec![
            TensorOut { name: "m".into(), dtype: GgmlType::F16, shape: vec![3, 5] },
            TensorOut { name: "v".into(), dtype: GgmlType::F32, shape: vec![3] },
        ];
        write_gguf::<GgufWriteError>(&p, &kv, &ts, |i| Ok(vec![i as u8 + 1; ts[i].n_bytes()])).unwrap();
        let g = super::super::gguf::GgufFile::open(&p).unwrap();
        assert_eq!(g.get_str("a.str").unwrap(), Some("x"));
        assert_eq!(g.get_i64_array("a.arr").unwrap(), Some(vec![1, -2]));
        let m = g.tensor_info("m").unwrap();
        assert_eq!((m.dims.clone(), m.offset % ALIGNMENT), (vec![5, 3], 0));
        assert!(g.tensor_data(m).iter().all(|&b| b == 1));
        assert!(g.tensor_data(g.tensor_info("v").unwrap()).iter().all(|&b| b == 2));
        std::fs::remove_dir_all(&dir).ok();
    }
}
