//! CPU reference ops: the slow, obviously-right twins of the CUDA kernels. f32 throughout.

use rayon::prelude::*;

use super::paged::for_positions;
pub use super::paged::PagedKv;
use crate::model::config::RopeStyle;

/// `out[t] = x[t] / rms(x[t]) * w` for each row of `x` (`[n, dim]`).
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let dim = w.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        rmsnorm_row(xr, w, eps, or);
    }
}

/// One row of RMSNorm; the sum of squares is accumulated in f64 because the residual stream of
/// some models reaches |x| ~ 25,000 (squares ~ 6e8) and f32 sums of 500+ such terms lose bits.
pub fn rmsnorm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// In-place RMSNorm of every `head_dim` slice of `x` (Qwen3's per-head q/k norm).
pub fn rmsnorm_heads_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let hd = w.len();
    let mut tmp = vec![0f32; hd];
    for head in x.chunks_exact_mut(hd) {
        rmsnorm_row(head, w, eps, &mut tmp);
        head.copy_from_slice(&tmp);
    }
}

/// The table is the model's (`model::rope`), shared with the CUDA backend.
pub use crate::model::rope::rope_table;

/// Rotates every head of one token's `x` (`[n_heads, head_dim]`) by that token's cos/sin row.
pub fn rope_token(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (a, b) = match style {
                RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                RopeStyle::Halves => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos[i] - x1 * sin[i];
            head[b] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]`.
/// Large inputs (prefill: `[n_tok, ffn_dim]`) are split across threads: `exp` dominates.
pub fn silu_mul_inplace(gate: &mut [f32], up: &[f32]) {
    fn run(gate: &mut [f32], up: &[f32]) {
        for (g, &u) in gate.iter_mut().zip(up) {
            let s = *g / (1.0 + (-*g).exp());
            *g = s * u;
        }
    }
    const CHUNK: usize = 16 * 1024;
    if gate.len() <= CHUNK {
        run(gate, up);
    } else {
        gate.par_chunks_mut(CHUNK).zip(up.par_chunks(CHUNK)).for_each(|(g, u)| run(g, u));
    }
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Causal attention of one query token over positions `0..=pos` of its sequence.
/// `q`: `[n_heads, head_dim]`; `out`: `[n_heads, head_dim]`. Grouped-query: query head h reads
/// KV head `h / (n_heads / n_kv_heads)`. Scores and softmax in f32 with max subtraction.
pub fn attend_token(kv: &PagedKv, block_table: &[u32], pos: usize, q: &[f32], n_heads: usize, out: &mut [f32]) {
    let hd = kv.head_dim;
    let group = n_heads / kv.n_kv_heads;
    let mut scores = Vec::with_capacity(pos + 1);
    for (h, (qh, oh)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).take(n_heads).enumerate() {
        attend_head(kv, block_table, pos, qh, h / group, &mut scores, oh);
    }
}

/// One query head over positions `0..=pos`: `out = softmax(q . K^T / sqrt(hd)) . V` for KV head
/// `kvh`. `scores` is caller-owned scratch (reused across calls: no allocation per head).
pub fn attend_head(
    kv: &PagedKv,
    block_table: &[u32],
    pos: usize,
    q: &[f32],
    kvh: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::model::quant::simd_available() {
        use super::attn;
        // SAFETY: avx2 and fma were detected at run time (quant::simd_available); the kernels
        // check head_dim and the cache bounds themselves.
        unsafe {
            match kv.head_dim {
                32 => attn::attend_head::<4>(kv, block_table, pos, q, kvh, scores, out),
                64 => attn::attend_head::<8>(kv, block_table, pos, q, kvh, scores, out),
                128 => attn::attend_head::<16>(kv, block_table, pos, q, kvh, scores, out),
                _ => attend_head_avx2(kv, block_table, pos, q, kvh, scores, out),
            }
        }
        return;
    }
    attend_head_generic(kv, block_table, pos, q, kvh, scores, out);
}

/// The portable reference of [`attend_head`] (what the AVX2 kernels are tested against).
pub fn attend_head_reference(kv: &PagedKv, block_table: &[u32], pos: usize, q: &[f32], kvh: usize, out: &mut [f32]) {
    attend_head_generic(kv, block_table, pos, q, kvh, &mut Vec::new(), out);
}

/// The same body compiled with AVX2 + FMA enabled (the generic code is written in 8-lane
/// chunks so it vectorizes fully once the wider registers are allowed).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_head_avx2(
    kv: &PagedKv,
    block_table: &[u32],
    pos: usize,
    q: &[f32],
    kvh: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_head_generic(kv, block_table, pos, q, kvh, scores, out);
}

/// `a . b` in 8 interleaved lanes (a fixed summation order that vectorizes).
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] * cb[l];
        }
    }
    let whole = a.len().min(b.len()) / 8 * 8;
    let tail: f32 = a[whole..].iter().zip(&b[whole..]).map(|(x, y)| x * y).sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

#[inline(always)]
fn attend_head_generic(
    kv: &PagedKv,
    block_table: &[u32],
    pos: usize,
    q: &[f32],
    kvh: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let scale = 1.0 / (hd as f32).sqrt();
    scores.clear();
    scores.resize(pos + 1, 0.0);
    let mut max = f32::NEG_INFINITY;
    for_positions!(kv, block_table, pos, kvh, |p, o| {
        let s = dot_lanes(q, &kv.k[o..o + hd]) * scale;
        scores[p] = s;
        max = max.max(s);
    });
    let mut denom = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        denom += *s;
    }
    let inv = 1.0 / denom;
    let out = &mut out[..hd];
    out.fill(0.0);
    for_positions!(kv, block_table, pos, kvh, |p, o| {
        let w = scores[p] * inv;
        for (a, &b) in out.iter_mut().zip(&kv.v[o..o + hd]) {
            *a += w * b;
        }
    });
}

/// Attention for a batch of tokens (`q`: `[n_tok, n_heads, head_dim]`), each with its own
/// sequence block table and position; parallel over (token, head) pairs.
pub fn attend_batch(kv: &PagedKv, tables: &[&[u32]], positions: &[usize], q: &[f32], n_heads: usize, out: &mut [f32]) {
    let hd = kv.head_dim;
    let group = (n_heads / kv.n_kv_heads.max(1)).max(1);
    let n = positions.len().min(tables.len());
    let (q, out) = (&q[..n * n_heads * hd], &mut out[..n * n_heads * hd]);
    // Work of one pair ~ context length; small batches run inline (a fork costs more).
    let work: usize = positions.iter().map(|&p| (p + 1) * n_heads).sum();
    let run = |scores: &mut Vec<f32>, (i, (o, qh)): (usize, (&mut [f32], &[f32]))| {
        let (t, h) = (i / n_heads, i % n_heads);
        attend_head(kv, tables[t], positions[t], qh, h / group, scores, o);
    };
    if work < 2048 || rayon::current_num_threads() == 1 {
        let mut scores = Vec::new();
        out.chunks_exact_mut(hd).zip(q.chunks_exact(hd)).enumerate().for_each(|item| run(&mut scores, item));
    } else {
        out.par_chunks_exact_mut(hd).zip(q.par_chunks_exact(hd)).enumerate().for_each_init(Vec::new, run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_unit_rows() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut o = [0f32; 4];
        rmsnorm(&x, &[1.0, 1.0, 2.0, 1.0], 0.0, &mut o);
        // rms = sqrt(25 / 4) = 2.5
        assert_eq!(o, [1.2, 1.6, 0.0, 0.0]);
    }

    #[test]
    fn rope_styles_rotate_the_right_pairs() {
        let (cos, sin) = rope_table(&[1], &[std::f32::consts::FRAC_PI_2, 0.0]);
        let mut a = [1.0f32, 0.0, 1.0, 0.0];
        rope_token(&mut a, 4, &cos, &sin, RopeStyle::Adjacent);
        // pair (0,1) rotated by 90 degrees, pair (2,3) by 0
        assert!((a[0]).abs() < 1e-6 && (a[1] - 1.0).abs() < 1e-6 && a[2] == 1.0);
        let mut b = [1.0f32, 0.0, 0.0, 0.0];
        rope_token(&mut b, 4, &cos, &sin, RopeStyle::Halves);
        // pair (0,2) rotated by 90 degrees
        assert!(b[0].abs() < 1e-6 && (b[2] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn fast_attention_matches_reference() {
        // Two sequences with scattered blocks, head_dim 64 and 128, several context lengths
        // (partial groups of 8 and partial blocks).
        for hd in [64usize, 128] {
            let (nkv, bs, nblocks) = (2usize, 4usize, 12usize);
            let len = nblocks * bs * nkv * hd;
            let k: Vec<f32> = (0..len).map(|i| ((i * 7919) % 997) as f32 / 997.0 - 0.5).collect();
            let v: Vec<f32> = (0..len).map(|i| ((i * 104729) % 991) as f32 / 991.0 - 0.5).collect();
            let kv = PagedKv { k: &k, v: &v, block_size: bs, n_kv_heads: nkv, head_dim: hd };
            let table = [7u32, 2, 9, 0, 11, 5, 1, 3];
            let q: Vec<f32> = (0..hd).map(|i| ((i * 31) % 13) as f32 / 3.0 - 2.0).collect();
            for pos in [0usize, 5, 7, 8, 9, 17, 31] {
                for kvh in 0..nkv {
                    let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
                    attend_head_reference(&kv, &table, pos, &q, kvh, &mut a);
                    attend_head(&kv, &table, pos, &q, kvh, &mut Vec::new(), &mut b);
                    for (x, y) in a.iter().zip(&b) {
                        assert!((x - y).abs() < 1e-5, "hd {hd} pos {pos} kvh {kvh}: {x} vs {y}");
                    }
                }
            }
        }
    }

    #[test]
    fn attention_over_one_position_returns_its_value() {
        let k = vec![1.0f32; 8];
        let v: Vec<f32> = (0..8).map(|i| i as f32).collect();
        // block_size 2, 1 kv head, head_dim 4; block table [1] puts position 0 in block 1 offset 0.
        let kv = PagedKv { k: &k, v: &v, block_size: 1, n_kv_heads: 1, head_dim: 4 };
        let mut out = vec![0f32; 8];
        attend_token(&kv, &[1], 0, &[0.5; 8], 2, &mut out);
        assert_eq!(out, vec![4.0, 5.0, 6.0, 7.0, 4.0, 5.0, 6.0, 7.0]);
    }
}
