//! The tokenizer against llama.cpp's reference ids for the sample model (tests/data/smollm2).

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use dustoff::model::gguf::GgufFile;
use dustoff::tokenizer::{ChatMessage, StreamDecoder, Tokenizer, TokenizerError};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sample() -> Tokenizer {
    let path = root().join("samples/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let g = GgufFile::open(&path).unwrap_or_else(|e| panic!("sample model: {e}"));
    Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("tokenizer from {}: {e}", path.display()))
}

fn cases(name: &str) -> Vec<Value> {
    let path = root().join("tests/data/smollm2").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn every_reference_case_matches_llama_cpp() {
    let tok = sample();
    let all = cases("tokenizer_cases.jsonl");
    assert_eq!(all.len(), 60);
    let mut failures = Vec::new();
    for c in &all {
        let id = c["id"].as_str().unwrap();
        let text = c["text"].as_str().unwrap();
        let (ps, bos) = (c["parse_special"].as_bool().unwrap(), c["add_bos"].as_bool().unwrap());
        let want = ids_of(&c["ids"]);
        let got = tok.encode(text, bos, ps).unwrap();
        if got != want {
            failures.push(format!("{id}: got {got:?}\n  want {want:?}"));
        }
        // Round trip: special tokens decode to their text, so this holds with or without them.
        assert_eq!(tok.decode(&got).unwrap(), text, "{id}: decode(encode(text))");
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), all.len(), failures.join("\n"));
}

#[test]
fn special_tokens_parse_only_when_asked() {
    let tok = sample();
    let text = "Text with <|im_end|> in the middle";
    assert!(tok.encode(text, false, true).unwrap().contains(&2));
    assert!(!tok.encode(text, false, false).unwrap().contains(&2));
    // add_bos prepends exactly the BOS id, whatever the model's default.
    let plain = tok.encode("Hello world", false, true).unwrap();
    let with_bos = tok.encode("Hello world", true, true).unwrap();
    assert_eq!(with_bos[0], 1);
    assert_eq!(&with_bos[1..], &plain[..]);
    assert_eq!(tok.encode("", true, false).unwrap(), vec![1]);
}

#[test]
fn metadata_of_the_sample_model() {
    let tok = sample();
    assert_eq!(tok.vocab_size(), 49_152);
    assert_eq!(tok.bos_id(), Some(1));
    assert!(!tok.add_bos_default());
    // eos = <|im_end|> (2) first, then <|endoftext|> (0), an end-of-document marker.
    assert_eq!(tok.eos_ids(), &[2, 0]);
    assert_eq!(tok.token_text(2).as_deref(), Some("<|im_end|>"));
    assert_eq!(tok.token_text(905).as_deref(), Some("Ġworld"));
    assert_eq!(tok.decode(&[905]).unwrap(), " world");
    assert_eq!(tok.token_text(49_152), None);
    assert!(matches!(tok.decode(&[49_152]), Err(TokenizerError::UnknownId { id: 49_152, .. })));
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
}

/// Splits a ChatML prompt back into messages; returns None if it is not one.
fn parse_chatml(prompt: &str) -> Option<Vec<ChatMessage>> {
    let body = prompt.strip_suffix("<|im_start|>assistant\n")?;
    let mut msgs = Vec::new();
    for turn in body.split_terminator("<|im_end|>\n") {
        let turn = turn.strip_prefix("<|im_start|>")?;
        let (role, content) = turn.split_once('\n')?;
        msgs.push(ChatMessage { role: role.into(), content: content.into() });
    }
    Some(msgs)
}

#[test]
fn chat_template_renders_the_reference_prompts() {
    let tok = sample();
    let default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
    let mut n_chat = 0;
    for c in cases("greedy_cases.jsonl") {
        let id = c["id"].as_str().unwrap();
        let prompt = c["prompt_text"].as_str().unwrap();
        let want_ids = ids_of(&c["prompt_ids"]);
        assert!(c["parse_special"].as_bool().unwrap() && !c["add_bos"].as_bool().unwrap());
        assert_eq!(tok.encode(prompt, false, true).unwrap(), want_ids, "{id}: prompt ids");
        if !c["chat"].as_bool().unwrap() {
            continue;
        }
        n_chat += 1;
        let msgs = parse_chatml(prompt).unwrap_or_else(|| panic!("{id}: not a ChatML prompt"));
        let rendered = tok.apply_chat_template(&msgs, true).unwrap();
        assert_eq!(rendered, prompt, "{id}: rendered template");
        assert_eq!(tok.encode(&rendered, false, true).unwrap(), want_ids, "{id}");
        // Without a system message the template inserts SmolLM's default one.
        if msgs[0].role == "system" && msgs[0].content == default_system {
            assert_eq!(tok.apply_chat_template(&msgs[1..], true).unwrap(), prompt, "{id}: default system");
        }
        let no_prompt = tok.apply_chat_template(&msgs, false).unwrap();
        assert_eq!(no_prompt, prompt.strip_suffix("<|im_start|>assistant\n").unwrap());
    }
    assert_eq!(n_chat, 10);
}

#[test]
fn streaming_the_reference_continuations_equals_decode() {
    let tok = sample();
    for c in cases("greedy_cases.jsonl") {
        let ids = ids_of(&c["llamacpp_greedy_ids"]);
        let mut d = StreamDecoder::new(&tok);
        let mut text = String::new();
        for &id in &ids {
            text += &d.push(id).unwrap();
        }
        text += &d.finish().unwrap();
        assert_eq!(text, tok.decode(&ids).unwrap(), "{}", c["id"]);
        assert_eq!(text, c["llamacpp_greedy_text"].as_str().unwrap(), "{}", c["id"]);
    }
}

#[test]
fn hf_dir_without_tokenizer_json_names_the_file() {
    let err = Tokenizer::from_hf_dir(Path::new("/nonexistent-model-dir")).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Build-time benchmark (ignored: timings live in benchmarks, not in tests). Run with
//   cargo test --release --test tokenizer_reference -- --ignored --nocapture
// It times `from_gguf` on the sample (49,152 tokens) and on a synthetic GGUF that extends the
// sample's vocabulary to ~151,000 tokens (Qwen2-sized) with consistent merges.

/// Minimal GGUF v3 writer for tokenizer metadata only (no tensors).
struct GgufWriter(Vec<u8>, u64);

impl GgufWriter {
    fn new() -> Self {
        GgufWriter(Vec::new(), 0)
    }
    fn string(&mut self, s: &str) {
        self.0.extend_from_slice(&(s.len() as u64).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn key(&mut self, k: &str, ty: u32) {
        self.1 += 1;
        self.string(k);
        self.0.extend_from_slice(&ty.to_le_bytes());
    }
    fn kv_str(&mut self, k: &str, v: &str) {
        self.key(k, 8);
        self.string(v);
    }
    fn kv_u32(&mut self, k: &str, v: u32) {
        self.key(k, 4);
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn kv_strs(&mut self, k: &str, v: &[String]) {
        self.key(k, 9);
        self.0.extend_from_slice(&8u32.to_le_bytes());
        self.0.extend_from_slice(&(v.len() as u64).to_le_bytes());
        v.iter().for_each(|s| self.string(s));
    }
    fn kv_i32s(&mut self, k: &str, v: &[i32]) {
        self.key(k, 9);
        self.0.extend_from_slice(&5u32.to_le_bytes());
        self.0.extend_from_slice(&(v.len() as u64).to_le_bytes());
        v.iter().for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
    fn finish(self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes()); // tensors
        out.extend_from_slice(&self.1.to_le_bytes());
        out.extend_from_slice(&self.0);
        out.resize(out.len().div_ceil(32) * 32, 0);
        out
    }
}

/// The sample's tokenizer metadata, extended to `target` tokens by merging pairs of existing
/// normal tokens (each new token gets the merge that builds it), written under `pre`.
fn synthetic_gguf(target: usize, pre: &str) -> PathBuf {
    let g = GgufFile::open(root().join("samples/models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let mut tokens: Vec<String> =
        g.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap().into_iter().map(String::from).collect();
    let mut types: Vec<i32> =
        g.get_i64_array("tokenizer.ggml.token_type").unwrap().unwrap().into_iter().map(|t| t as i32).collect();
    let mut merges: Vec<String> =
        g.get_str_array("tokenizer.ggml.merges").unwrap().unwrap().into_iter().map(String::from).collect();
    let mut known: std::collections::HashSet<String> = tokens.iter().cloned().collect();
    let base = tokens.len();
    'outer: for i in 300..base {
        for j in [
            1000 + i % 7000,
            500 + i % 3000,
            2000 + i % 20000,
            300 + i * 7 % 40000,
            300 + i * 13 % 45000,
            300 + i * 31 % 48000,
            300 + i * 17 % 30000,
        ] {
            if tokens.len() >= target {
                break 'outer;
            }
            let (a, b) = (&tokens[i], &tokens[j]);
            if types[i] != 1 || types[j] != 1 || b.starts_with('Ġ') {
                continue;
            }
            let ab = format!("{a}{b}");
            if known.insert(ab.clone()) {
                merges.push(format!("{a} {b}"));
                tokens.push(ab);
                types.push(1);
            }
        }
    }
    let mut w = GgufWriter::new();
    w.kv_str("tokenizer.ggml.model", "gpt2");
    w.kv_str("tokenizer.ggml.pre", pre);
    w.kv_strs("tokenizer.ggml.tokens", &tokens);
    w.kv_i32s("tokenizer.ggml.token_type", &types);
    w.kv_strs("tokenizer.ggml.merges", &merges);
    w.kv_u32("tokenizer.ggml.bos_token_id", 1);
    w.kv_u32("tokenizer.ggml.eos_token_id", 2);
    let path = std::env::temp_dir().join(format!("dustoff-tok-{}-{pre}-{target}.gguf", std::process::id()));
    std::fs::write(&path, w.finish()).unwrap();
    path
}

fn median_ms(mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let s = std::time::Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[2]
}

#[test]
#[ignore]
fn bench_build_from_gguf() {
    let paragraph = cases("tokenizer_cases.jsonl")
        .into_iter()
        .find(|c| c["id"] == "tok60_paragraph_2000_ps")
        .map(|c| c["text"].as_str().unwrap().to_string())
        .unwrap();
    let sample = root().join("samples/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut runs = vec![(sample, "smollm (sample)".to_string(), false)];
    for pre in ["smollm", "qwen2", "llama-bpe"] {
        runs.push((synthetic_gguf(151_000, pre), format!("{pre} (synthetic)"), true));
    }
    for (path, label, remove) in runs {
        let g = GgufFile::open(&path).unwrap();
        let build = median_ms(|| drop(Tokenizer::from_gguf(&g).unwrap()));
        let tok = Tokenizer::from_gguf(&g).unwrap();
        let n_tok = tok.encode(&paragraph, false, true).unwrap().len();
        let enc = median_ms(|| {
            for _ in 0..100 {
                tok.encode(&paragraph, false, true).unwrap();
            }
        });
        println!(
            "{label}: vocab {}, from_gguf median {build:.1} ms; encode {:.0} tokens/s ({n_tok} tokens x 100 in {enc:.1} ms)",
            tok.vocab_size(),
            (n_tok * 100) as f64 / (enc / 1e3)
        );
        if remove {
            std::fs::remove_file(&path).ok();
        }
    }
}

/// llama.cpp's vocabulary test for the `qwen35` pre-tokenizer (shared/testdata/qwen35-vocab):
/// a vocab-only GGUF (no tensors), texts separated by `__ggml_vocab_test__` lines, and
/// llama.cpp's ids for each text (one line per text, no BOS).
#[test]
fn qwen35_pre_tokenizer_matches_llama_cpp() {
    let dir = common::shared_testdata().join("qwen35-vocab");
    let gguf = dir.join("ggml-vocab-qwen35.gguf");
    let tok = dustoff::model::loader::load_tokenizer(&gguf)
        .unwrap_or_else(|e| panic!("vocab-only GGUF {}: {e}", gguf.display()))
        .tokenizer;
    let inp = std::fs::read_to_string(dir.join("ggml-vocab-qwen35.gguf.inp")).unwrap();
    let out = std::fs::read_to_string(dir.join("ggml-vocab-qwen35.gguf.out")).unwrap();
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // The file ends with a separator: the last piece is empty and is no case.
    let texts = &texts[..texts.len() - 1];
    let wants: Vec<&str> = out.split('\n').collect();
    assert!(texts.len() >= 40 && wants.len() > texts.len(), "{} texts, {} id lines", texts.len(), wants.len());
    let mut failures = Vec::new();
    for (i, (text, want)) in texts.iter().zip(&wants).enumerate() {
        let want: Vec<u32> = want.split_whitespace().map(|t| t.parse().unwrap()).collect();
        let got = tok.encode(text, false, false).unwrap();
        if got != want {
            failures.push(format!("case {i} {text:?}: got {got:?}\n  want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), texts.len(), failures.join("\n"));
}
