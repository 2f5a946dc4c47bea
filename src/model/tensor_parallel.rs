//! Tensor parallel sharding (`--tensor-parallel N`): which part of every weight rank `r` of `N`
//! holds. The one place that knows the split; backends receive a rank's shard as an ordinary
//! (smaller) model and add one all-reduce after each block's two output projections.
//!
//! The rule (Megatron-style, contiguous groups):
//! - attention: rank `r` holds KV heads `[r * kv/N, (r + 1) * kv/N)` and the query heads that
//!   read them, `[r * h/N, (r + 1) * h/N)` (a query group never straddles two ranks). So the
//!   rows of `wq`/`wk`/`wv` (and their biases) of those heads, the columns of `wo` of its query
//!   heads, and a KV cache of its KV heads only;
//! - dense FFN: rows `[r * F/N, (r + 1) * F/N)` of gate and up, the same columns of down;
//! - mixture of experts: every expert (and the shared expert) split the same way by its own
//!   width; the router and the shared expert's gate replicated, so every rank routes alike;
//! - Gated DeltaNet (hybrid models): rank `r` holds key heads `[r * nk/N, (r + 1) * nk/N)` and
//!   the value heads that read them (contiguous for the checkpoint's interleaved grouping; for
//!   the tiled grouping of `qwen35` GGUF files every `nk`-th head, kept in the file's order, so
//!   the shard's own grouping still pairs them right): their q, k and v rows of the fused
//!   projection and of the conv1d, their z, b, a rows, decays and `dt_bias`, their columns of the
//!   output projection, and a recurrent state of its heads only. A gated full-attention layer's
//!   `wq` rows come in `[query, gate]` pairs per head and are split by head the same way;
//! - replicated: the embedding table, every norm, Q/K head norms, the output head.
//!
//! Each rank's output projection then yields a partial sum of the full product; the sum over
//! ranks (the all-reduce) is the plain model's output.
//!
//! Columns of a block-quantized matrix are cut at block boundaries only (the bytes of a row are
//! whole blocks): a split that would cut a block is refused with the tensor named, never
//! re-quantized.

use std::ops::Range;

use super::config::ModelConfig;
use super::hybrid::{DeltaNetWeights, HybridConfig, HybridLayer};
use super::layer::MixerKind;
use super::moe::{Expert, MoeWeights, SharedExpert};
use super::weights::{LayerWeights, ModelWeights, Tensor};

/// Why a model cannot be split `n` ways.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TpError {
    #[error("--tensor-parallel 0: give 1 or more ranks")]
    Zero,
    #[error(
        "--tensor-parallel {n}: the model has {n_kv_heads} KV heads ({n_heads} query heads) and each rank \
         must hold whole KV heads, so N must divide {n_kv_heads} (possible: {ok})"
    )]
    Heads { n: usize, n_heads: usize, n_kv_heads: usize, ok: String },
    #[error("--tensor-parallel {n}: {what} is {width} wide, which {n} ranks cannot split evenly")]
    Width { n: usize, what: String, width: usize },
    #[error(
        "--tensor-parallel {n}: tensor '{tensor}' ({dtype}, blocks of {block} values) would be cut inside a \
         block: {n} column groups of {part} values; choose N so that {part} is a multiple of {block}"
    )]
    Block { n: usize, tensor: String, dtype: String, block: usize, part: usize },
    #[error(
        "--tensor-parallel {n}: the linear-attention layers have {n_k} key heads ({n_v} value heads) and each \
         rank must hold whole key heads with their value heads, so N must divide {n_k} (possible: {ok})"
    )]
    LinearHeads { n: usize, n_k: usize, n_v: usize, ok: String },
}

/// Rank `rank` of `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rank {
    pub rank: usize,
    pub n: usize,
}

impl Rank {
    /// This rank's contiguous part of `0..total` (`total` divisible by `n`, checked before).
    pub fn part(self, total: usize) -> Range<usize> {
        let k = total / self.n;
        self.rank * k..(self.rank + 1) * k
    }
    /// Query heads of this rank.
    pub fn heads(self, c: &ModelConfig) -> Range<usize> {
        self.part(c.n_heads)
    }
    /// KV heads of this rank.
    pub fn kv_heads(self, c: &ModelConfig) -> Range<usize> {
        self.part(c.n_kv_heads)
    }
}

/// The divisors of `k`, listed for an error message.
fn divisors(k: usize) -> String {
    (1..=k).filter(|d| k.is_multiple_of(*d)).map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

/// Checks that `c` splits `n` ways (attention and linear-attention heads, FFN widths). Block
/// alignment of the columns is checked per tensor by [`shard`].
pub fn check(c: &ModelConfig, n: usize) -> Result<(), TpError> {
    if n == 0 {
        return Err(TpError::Zero);
    }
    if n == 1 {
        return Ok(());
    }
    let kinds = c.layer_kinds();
    if let (true, Some(h)) = (kinds.iter().any(|k| k.is_recurrent()), &c.hybrid) {
        // The value heads are a multiple of the key heads (checked at load), so they split too.
        if !h.n_k_heads.is_multiple_of(n) {
            return Err(TpError::LinearHeads { n, n_k: h.n_k_heads, n_v: h.n_v_heads, ok: divisors(h.n_k_heads) });
        }
    }
    if c.n_kv_heads == 0 || !c.n_kv_heads.is_multiple_of(n) || !c.n_heads.is_multiple_of(n) {
        return Err(TpError::Heads { n, n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, ok: divisors(c.n_kv_heads) });
    }
    if kinds.iter().any(|k| !k.is_sparse()) && !c.ffn_dim.is_multiple_of(n) {
        return Err(TpError::Width { n, what: "the FFN".into(), width: c.ffn_dim });
    }
    if let (true, Some(m)) = (kinds.iter().any(|k| k.is_sparse()), &c.moe) {
        if !m.expert_ffn_dim.is_multiple_of(n) {
            return Err(TpError::Width { n, what: "each expert's FFN".into(), width: m.expert_ffn_dim });
        }
    }
    Ok(())
}

/// The configuration of one rank's shard: `1/n` of the heads and FFN widths; everything else
/// (width of the residual stream, head size, vocabulary, RoPE) as the model's.
pub fn shard_config(c: &ModelConfig, n: usize) -> ModelConfig {
    let mut s = c.clone();
    s.n_heads = c.n_heads / n;
    s.n_kv_heads = c.n_kv_heads / n;
    s.ffn_dim = c.ffn_dim / n;
    if let Some(m) = &mut s.moe {
        m.expert_ffn_dim /= n;
    }
    if let Some(h) = &mut s.hybrid {
        h.n_k_heads /= n;
        h.n_v_heads /= n;
    }
    s
}

/// Rank `r`'s shard of the model: its configuration and weights (row slices of a mapped
/// tensor are views into the file, column slices copies). With `n == 1` the weights are the
/// model's own tensors (no copy), so the shard computes exactly what the plain model does.
pub fn shard(c: &ModelConfig, w: &ModelWeights, r: Rank) -> Result<(ModelConfig, ModelWeights), TpError> {
    check(c, r.n)?;
    if r.n == 1 {
        return Ok((c.clone(), w.clone()));
    }
    let hd = c.head_dim;
    let heads = r.heads(c);
    let kv = r.kv_heads(c);
    let (q_rows, kv_rows) = (heads.start * hd..heads.end * hd, kv.start * hd..kv.end * hd);
    // A gated attention layer's wq holds [query, gate] rows per head.
    let gated = c.layer_kinds().iter().any(|k| k.mixer == MixerKind::GatedAttention);
    let wq_rows = if gated { 2 * q_rows.start..2 * q_rows.end } else { q_rows.clone() };
    let layers = w
        .layers
        .iter()
        .map(|l| {
            let ffn = r.part(c.ffn_dim);
            let dense_ffn = l.moe.is_none();
            Ok(LayerWeights {
                attn_norm: l.attn_norm.clone(),
                // A linear layer's attention slots are empty (0 rows): nothing to split.
                wq: if l.wq.rows == 0 { l.wq.clone() } else { rows(&l.wq, &wq_rows) },
                wk: if l.wk.rows == 0 { l.wk.clone() } else { rows(&l.wk, &kv_rows) },
                wv: if l.wv.rows == 0 { l.wv.clone() } else { rows(&l.wv, &kv_rows) },
                wo: if l.wo.rows == 0 {
                    Tensor::absent(l.wo.name.clone(), q_rows.len())
                } else {
                    cols(&l.wo, &q_rows, r.n)?
                },
                bq: l.bq.as_ref().map(|b| b[q_rows.clone()].to_vec()),
                bk: l.bk.as_ref().map(|b| b[kv_rows.clone()].to_vec()),
                bv: l.bv.as_ref().map(|b| b[kv_rows.clone()].to_vec()),
                q_norm: l.q_norm.clone(),
                k_norm: l.k_norm.clone(),
                ffn_norm: l.ffn_norm.clone(),
                // A sparse layer's dense slots are empty: the empty shape of the shard's width.
                w_gate: if dense_ffn { rows(&l.w_gate, &ffn) } else { l.w_gate.clone() },
                w_up: if dense_ffn { rows(&l.w_up, &ffn) } else { l.w_up.clone() },
                w_down: if dense_ffn { cols(&l.w_down, &ffn, r.n)? } else { empty_cols(&l.w_down, ffn.len()) },
                moe: l.moe.as_ref().map(|m| shard_moe(m, r)).transpose()?,
                hybrid: match (&l.hybrid, &c.hybrid) {
                    (Some(HybridLayer::Linear(d)), Some(h)) => {
                        Some(HybridLayer::Linear(Box::new(shard_deltanet(d, h, r)?)))
                    }
                    (other, _) => other.clone(),
                },
            })
        })
        .collect::<Result<Vec<_>, TpError>>()?;
    let weights = ModelWeights {
        token_embd: w.token_embd.clone(),
        layers,
        output_norm: w.output_norm.clone(),
        output: w.output.clone(),
        rope_freq_factors: w.rope_freq_factors.clone(),
    };
    Ok((shard_config(c, r.n), weights))
}

/// Rank `r`'s key heads and their value heads of a Gated DeltaNet layer, in the layer's order:
/// `(key heads, value heads)`.
fn linear_heads(h: &HybridConfig, r: Rank) -> (Range<usize>, Vec<usize>) {
    let keys = r.part(h.n_k_heads);
    let values =
        (0..h.n_v_heads).filter(|&v| keys.contains(&h.grouping.key_head(v, h.n_k_heads, h.n_v_heads))).collect();
    (keys, values)
}

/// Rows `[i * size, (i + 1) * size)` of every `i` in `units`, offset by `base`.
fn unit_rows(units: impl IntoIterator<Item = usize>, size: usize, base: usize) -> impl Iterator<Item = usize> {
    units.into_iter().flat_map(move |i| base + i * size..base + (i + 1) * size)
}

fn shard_deltanet(d: &DeltaNetWeights, h: &HybridConfig, r: Rank) -> Result<DeltaNetWeights, TpError> {
    let (keys, values) = linear_heads(h, r);
    let (nk, dk, dv, kk) = (h.n_k_heads, h.d_k, h.d_v, h.conv_kernel);
    // q | k | v channels of the fused projection and of the conv1d ([C, K]).
    let channels: Vec<usize> = unit_rows(keys.clone(), dk, 0)
        .chain(unit_rows(keys.clone(), dk, nk * dk))
        .chain(unit_rows(values.iter().copied(), dv, 2 * nk * dk))
        .collect();
    let v_rows: Vec<usize> = unit_rows(values.iter().copied(), dv, 0).collect();
    let gather = |t: &Tensor, order: &[usize]| {
        t.gather_rows(t.name.clone(), order).expect("the shard's rows lie inside the tensor (checked shapes)")
    };
    let pick = |v: &[f32]| values.iter().map(|&i| v[i]).collect::<Vec<f32>>();
    let out_cols: Vec<Range<usize>> = values.iter().map(|&v| v * dv..(v + 1) * dv).collect();
    Ok(DeltaNetWeights {
        w_qkv: gather(&d.w_qkv, &channels),
        w_z: gather(&d.w_z, &v_rows),
        w_b: gather(&d.w_b, &values),
        w_a: gather(&d.w_a, &values),
        conv: channels.iter().flat_map(|&c| d.conv[c * kk..(c + 1) * kk].iter().copied()).collect(),
        neg_a: pick(&d.neg_a),
        dt_bias: pick(&d.dt_bias),
        norm: d.norm.clone(),
        w_out: cols_of(&d.w_out, &merge_ranges(out_cols), r.n)?,
    })
}

/// Adjacent ranges joined (fewer, longer copies; and a block-quantized cut is judged on the
/// joined run, which is what the bytes hold).
fn merge_ranges(mut v: Vec<Range<usize>>) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::with_capacity(v.len());
    for r in v.drain(..) {
        match out.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => out.push(r),
        }
    }
    out
}

fn shard_expert(e: &Expert, r: Rank) -> Result<Expert, TpError> {
    let f = r.part(e.gate.rows);
    Ok(Expert { gate: rows(&e.gate, &f), up: rows(&e.up, &f), down: cols(&e.down, &f, r.n)? })
}

fn shard_moe(m: &MoeWeights, r: Rank) -> Result<MoeWeights, TpError> {
    let shared = match &m.shared {
        None => None,
        Some(s) => {
            if !s.expert.gate.rows.is_multiple_of(r.n) {
                let what = format!("the shared expert ('{}')", s.expert.gate.name);
                return Err(TpError::Width { n: r.n, what, width: s.expert.gate.rows });
            }
            Some(SharedExpert { expert: shard_expert(&s.expert, r)?, gate: s.gate.clone() })
        }
    };
    Ok(MoeWeights {
        router: m.router.clone(),
        experts: m.experts.iter().map(|e| shard_expert(e, r)).collect::<Result<_, _>>()?,
        n_used: m.n_used,
        norm_topk_prob: m.norm_topk_prob,
        shared,
    })
}

/// Rows `range` of `t` (a view for a mapped tensor).
fn rows(t: &Tensor, range: &Range<usize>) -> Tensor {
    t.row_slice(t.name.clone(), range.start, range.len())
        .expect("the shard's rows lie inside the tensor (checked shapes)")
}

/// The `[0, cols]` dense slot of a sparse layer, at the shard's width.
fn empty_cols(t: &Tensor, cols: usize) -> Tensor {
    Tensor::empty(t.name.clone(), cols)
}

/// Columns `range` of every row of `t`, copied; refused when a cut falls inside a block.
pub fn cols(t: &Tensor, range: &Range<usize>, n: usize) -> Result<Tensor, TpError> {
    cols_of(t, std::slice::from_ref(range), n)
}

/// The columns of `ranges` (in that order) of every row of `t`, copied; refused when a cut
/// falls inside a block.
fn cols_of(t: &Tensor, ranges: &[Range<usize>], n: usize) -> Result<Tensor, TpError> {
    let (dtype, block) = (t.dtype, t.dtype.block_size());
    let mut spans = Vec::with_capacity(ranges.len());
    for range in ranges {
        let (Some(skip), Some(keep)) = (dtype.row_bytes(range.start), dtype.row_bytes(range.len())) else {
            return Err(TpError::Block {
                n,
                tensor: t.name.clone(),
                dtype: dtype.name().to_string(),
                block,
                part: range.len(),
            });
        };
        spans.push(skip..skip + keep);
    }
    let width: usize = ranges.iter().map(|r| r.len()).sum();
    let mut bytes = Vec::with_capacity(spans.iter().map(|s| s.len()).sum::<usize>() * t.rows);
    for row in 0..t.rows {
        let src = t.row(row);
        for s in &spans {
            bytes.extend_from_slice(&src[s.clone()]);
        }
    }
    Ok(Tensor::from_bytes(t.name.clone(), dtype, t.rows, width, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::GgmlType;

    fn cfg() -> ModelConfig {
        crate::model::shapes::shape("smollm2-135m").unwrap()
    }

    #[test]
    fn heads_split_in_whole_query_groups() {
        let c = cfg(); // 9 heads, 3 KV heads: groups of 3
        for rank in 0..3 {
            let r = Rank { rank, n: 3 };
            assert_eq!(r.kv_heads(&c), rank..rank + 1);
            assert_eq!(r.heads(&c), 3 * rank..3 * rank + 3);
            // Query head h reads KV head h / 3: every query head of the rank reads its KV head.
            assert!(r.heads(&c).all(|h| r.kv_heads(&c).contains(&(h / 3))));
        }
        let s = shard_config(&c, 3);
        assert_eq!((s.n_heads, s.n_kv_heads, s.ffn_dim, s.dim, s.head_dim), (3, 1, 512, 576, 64));
    }

    #[test]
    fn bad_splits_name_what_is_wrong() {
        let c = cfg();
        assert_eq!(check(&c, 0), Err(TpError::Zero));
        let e = check(&c, 2).unwrap_err();
        assert!(matches!(e, TpError::Heads { n: 2, n_kv_heads: 3, .. }), "{e}");
        assert!(e.to_string().contains("possible: 1, 3"), "{e}");
        let mut odd = c.clone();
        odd.ffn_dim = 1537;
        assert!(matches!(check(&odd, 3), Err(TpError::Width { width: 1537, .. })));
        // A Q4_K matrix of 576 columns split 3 ways would cut its 256-value blocks.
        let t = Tensor::from_bytes("blk.0.attn_output.weight", GgmlType::Q4K, 1, 512, vec![0; 288]);
        let e = cols(&t, &(0..256), 2).unwrap();
        assert_eq!((e.rows, e.cols), (1, 256));
        let e = cols(&t, &(128..256), 4).unwrap_err();
        assert!(e.to_string().contains("blk.0.attn_output.weight") && e.to_string().contains("multiple of 256"), "{e}");
    }

    #[test]
    fn shards_hold_the_right_rows_and_columns() {
        let mut c = cfg();
        c.n_layers = 1;
        let w = crate::model::synth::random_weights(&c, GgmlType::F32, 7);
        let full = &w.layers[0];
        let mut wo_cols = Vec::new();
        for rank in 0..3 {
            let (sc, sw) = shard(&c, &w, Rank { rank, n: 3 }).unwrap();
            let l = &sw.layers[0];
            assert_eq!((l.wq.rows, l.wk.rows, l.wo.cols, l.w_gate.rows, l.w_down.cols), (192, 64, 192, 512, 512));
            assert_eq!(sc.q_dim(), l.wq.rows);
            // Row 5 of this rank's wq is row 192 rank + 5 of the model's.
            assert_eq!(l.wq.row(5), full.wq.row(192 * rank + 5));
            assert_eq!(l.wk.row(3), full.wk.row(64 * rank + 3));
            assert_eq!(l.w_up.row(9), full.w_up.row(512 * rank + 9));
            wo_cols.push(l.wo.to_f32_vec());
            // Replicated parts are the model's.
            assert_eq!(sw.output.bytes(), w.output.bytes());
            assert_eq!(l.attn_norm, full.attn_norm);
        }
        // The ranks' columns of wo, side by side, are the model's wo.
        let wo = full.wo.to_f32_vec();
        for row in 0..c.dim {
            let joined: Vec<f32> = (0..3).flat_map(|r| wo_cols[r][row * 192..(row + 1) * 192].to_vec()).collect();
            assert_eq!(joined, wo[row * 576..(row + 1) * 576], "row {row}");
        }
    }

    #[test]
    fn one_rank_is_the_model_itself() {
        let mut c = cfg();
        c.n_layers = 1;
        let w = crate::model::synth::random_weights(&c, GgmlType::Q8_0, 3);
        let (sc, sw) = shard(&c, &w, Rank { rank: 0, n: 1 }).unwrap();
        assert_eq!(sc, c);
        assert_eq!(sw.layers[0].wo.bytes(), w.layers[0].wo.bytes());
    }
}
