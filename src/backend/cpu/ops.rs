//! CPU reference ops: the slow, obviously-right twins of the CUDA kernels. f32 throughout.

use rayon::prelude::*;

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

/// Cos/sin table of the rotation angles: `[n_pos, head_dim / 2]` each. Angles are computed in
/// f64 (position x frequency loses bits in f32 at long positions).
pub fn rope_table(positions: &[usize], inv_freq: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut cos = Vec::with_capacity(positions.len() * inv_freq.len());
    let mut sin = Vec::with_capacity(positions.len() * inv_freq.len());
    for &p in positions {
        for &f in inv_freq {
            let a = p as f64 * f as f64;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}

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
pub fn silu_mul_inplace(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let s = *g / (1.0 + (-*g).exp());
        *g = s * u;
    }
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// A paged KV cache of one layer: `[n_blocks, block_size, n_kv_heads, head_dim]`, f32.
pub struct PagedKv<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl PagedKv<'_> {
    /// Offset of (position, kv head) in the cache arrays, through the sequence's block table.
    #[inline]
    pub fn offset(&self, block_table: &[u32], pos: usize, kv_head: usize) -> usize {
        let block = block_table[pos / self.block_size] as usize;
        ((block * self.block_size + pos % self.block_size) * self.n_kv_heads + kv_head) * self.head_dim
    }
}

/// Causal attention of one query token over positions `0..=pos` of its sequence.
/// `q`: `[n_heads, head_dim]`; `out`: `[n_heads, head_dim]`. Grouped-query: query head h reads
/// KV head `h / (n_heads / n_kv_heads)`. Scores and softmax in f32 with max subtraction.
pub fn attend_token(kv: &PagedKv, block_table: &[u32], pos: usize, q: &[f32], n_heads: usize, out: &mut [f32]) {
    let hd = kv.head_dim;
    let group = n_heads / kv.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut scores = vec![0f32; pos + 1];
    for h in 0..n_heads {
        let kvh = h / group;
        let qh = &q[h * hd..(h + 1) * hd];
        let mut max = f32::NEG_INFINITY;
        for (p, s) in scores.iter_mut().enumerate() {
            let o = kv.offset(block_table, p, kvh);
            let k = &kv.k[o..o + hd];
            *s = qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
            max = max.max(*s);
        }
        let mut denom = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            denom += *s;
        }
        let oh = &mut out[h * hd..(h + 1) * hd];
        oh.fill(0.0);
        for (p, &s) in scores.iter().enumerate() {
            let o = kv.offset(block_table, p, kvh);
            let w = s / denom;
            for (a, &b) in oh.iter_mut().zip(&kv.v[o..o + hd]) {
                *a += w * b;
            }
        }
    }
}

/// Attention for a batch of tokens (`q`: `[n_tok, n_heads, head_dim]`), each with its own
/// sequence block table and position; parallel over tokens.
pub fn attend_batch(
    kv: &PagedKv,
    tables: &[&[u32]],
    positions: &[usize],
    q: &[f32],
    n_heads: usize,
    out: &mut [f32],
) {
    let width = n_heads * kv.head_dim;
    out.par_chunks_mut(width).zip(q.par_chunks(width)).enumerate().for_each(|(t, (o, qt))| {
        attend_token(kv, tables[t], positions[t], qt, n_heads, o);
    });
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
        let (cos, sin) = rope_table(&[1], &[std::f32::consts::FRAC_PI_2 as f32, 0.0]);
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
    fn attention_over_one_position_returns_its_value() {
        let k = vec![1.0f32; 8];
        let v: Vec<f32> = (0..8).map(|i| i as f32).collect();
        // block_size 2, 1 kv head, head_dim 4; block table [1] puts position 0 in block 1 slot 0.
        let kv = PagedKv { k: &k, v: &v, block_size: 1, n_kv_heads: 1, head_dim: 4 };
        let mut out = vec![0f32; 8];
        attend_token(&kv, &[1], 0, &[0.5; 8], 2, &mut out);
        assert_eq!(out, vec![4.0, 5.0, 6.0, 7.0, 4.0, 5.0, 6.0, 7.0]);
    }
}
