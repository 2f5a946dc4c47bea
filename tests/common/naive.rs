//! A plain f64 forward pass of a decoder model (Qwen3-style dense and MoE layers), written
//! from the formulas with no code of the backends: the independent reference of tests that
//! plant weights (router edge cases, activations past the F16 range).

use dustoff::model::config::ModelConfig;
use dustoff::model::moe::MoeWeights;
use dustoff::model::quant::dequantize_row;
use dustoff::model::weights::{ModelWeights, Tensor};

pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub w: Vec<f32>,
}

impl Mat {
    pub fn of(t: &Tensor) -> Mat {
        Mat { rows: t.rows, cols: t.cols, w: t.to_f32_vec() }
    }
    pub fn mul(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.cols);
        (0..self.rows)
            .map(|r| self.w[r * self.cols..(r + 1) * self.cols].iter().zip(x).map(|(&a, &b)| a as f64 * b).sum())
            .collect()
    }
}

pub struct NaiveMoe {
    router: Mat,
    experts: Vec<[Mat; 3]>,
    k: usize,
    norm: bool,
}

impl NaiveMoe {
    pub fn of(w: &MoeWeights) -> Self {
        let experts = w.experts.iter().map(|e| [Mat::of(&e.gate), Mat::of(&e.up), Mat::of(&e.down)]).collect();
        NaiveMoe { router: Mat::of(&w.router), experts, k: w.n_used, norm: w.norm_topk_prob }
    }

    /// The chosen experts (in choice order) and the output for one token.
    pub fn forward(&self, h: &[f64]) -> (Vec<u32>, Vec<f64>) {
        let logits = self.router.mul(h);
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let total: f64 = p.iter().sum();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let chosen = &order[..self.k];
        let denom = if self.norm { chosen.iter().map(|&e| p[e]).sum() } else { total };
        let mut out = vec![0f64; h.len()];
        for (e, [gate, up, down]) in self.experts.iter().enumerate() {
            let weight = if chosen.contains(&e) { p[e] / denom } else { 0.0 };
            let (g, u) = (gate.mul(h), up.mul(h));
            let act: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect();
            for (o, y) in out.iter_mut().zip(down.mul(&act)) {
                *o += weight * y;
            }
        }
        (chosen.iter().map(|&e| e as u32).collect(), out)
    }
}

pub fn rmsnorm(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(&v, &g)| v * inv * g as f64).collect()
}

/// Rotate-half RoPE of one head at position `pos`.
pub fn rope(v: &mut [f64], pos: usize, theta: f64) {
    let half = v.len() / 2;
    for i in 0..half {
        let a = pos as f64 * theta.powf(-2.0 * i as f64 / v.len() as f64);
        let (x0, x1) = (v[i], v[i + half]);
        v[i] = x0 * a.cos() - x1 * a.sin();
        v[i + half] = x1 * a.cos() + x0 * a.sin();
    }
}

/// The logits after the last of `tokens`: a plain f64 forward over the whole sequence.
pub fn naive_logits(c: &ModelConfig, w: &ModelWeights, tokens: &[u32]) -> Vec<f64> {
    naive_forward(c, w, tokens).logits
}

/// What [`naive_forward`] computes.
pub struct Naive {
    /// The logits after the last token.
    pub logits: Vec<f64>,
    /// Per layer, the largest |value| of the dense FFN's SwiGLU activation (the down
    /// projection's input) and of its output before the residual add, over every token.
    pub ffn_act_max: Vec<f64>,
    pub ffn_out_max: Vec<f64>,
}

/// A plain f64 forward over the whole sequence.
pub fn naive_forward(c: &ModelConfig, w: &ModelWeights, tokens: &[u32]) -> Naive {
    let (mut ffn_act_max, mut ffn_out_max) = (Vec::new(), Vec::new());
    let (hd, nh, nkv, eps) = (c.head_dim, c.n_heads, c.n_kv_heads, c.rms_eps as f64);
    let mut x: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            let mut row = vec![0f32; c.dim];
            dequantize_row(w.token_embd.dtype, w.token_embd.row(t as usize), &mut row);
            row.iter().map(|&v| v as f64).collect()
        })
        .collect();
    for l in &w.layers {
        let (wq, wk, wv, wo) = (Mat::of(&l.wq), Mat::of(&l.wk), Mat::of(&l.wv), Mat::of(&l.wo));
        let (mut q, mut k, mut v) = (vec![], vec![], vec![]);
        for (pos, xt) in x.iter().enumerate() {
            let h = rmsnorm(xt, &l.attn_norm, eps);
            let (mut qt, mut kt) = (wq.mul(&h), wk.mul(&h));
            for (buf, norm) in [(&mut qt, &l.q_norm), (&mut kt, &l.k_norm)] {
                for head in buf.chunks_exact_mut(hd) {
                    let normed = rmsnorm(head, norm.as_ref().unwrap(), eps);
                    head.copy_from_slice(&normed);
                    rope(head, pos, c.rope_theta as f64);
                }
            }
            q.push(qt);
            k.push(kt);
            v.push(wv.mul(&h));
        }
        let dense = l.moe.is_none().then(|| (Mat::of(&l.w_gate), Mat::of(&l.w_up), Mat::of(&l.w_down)));
        let sparse = l.moe.as_ref().map(NaiveMoe::of);
        for t in 0..x.len() {
            let mut att = vec![0f64; nh * hd];
            for head in 0..nh {
                let kvh = head / (nh / nkv);
                let qh = &q[t][head * hd..(head + 1) * hd];
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        qh.iter().zip(&k[s][kvh * hd..(kvh + 1) * hd]).map(|(a, b)| a * b).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for (s, sc) in scores.iter().enumerate() {
                    let p = (sc - max).exp() / z;
                    for d in 0..hd {
                        att[head * hd + d] += p * v[s][kvh * hd + d];
                    }
                }
            }
            let o = wo.mul(&att);
            x[t].iter_mut().zip(o).for_each(|(a, b)| *a += b);
        }
        let (mut act_max, mut out_max) = (0f64, 0f64);
        for xt in x.iter_mut() {
            let h = rmsnorm(xt, &l.ffn_norm, eps);
            let y = match (&dense, &sparse) {
                (Some((g, u, d)), _) => {
                    let act: Vec<f64> =
                        g.mul(&h).iter().zip(u.mul(&h)).map(|(&g, u)| g / (1.0 + (-g).exp()) * u).collect();
                    act_max = act.iter().fold(act_max, |m, v| m.max(v.abs()));
                    let y = d.mul(&act);
                    out_max = y.iter().fold(out_max, |m, v| m.max(v.abs()));
                    y
                }
                (None, Some(s)) => s.forward(&h).1,
                (None, None) => unreachable!(),
            };
            xt.iter_mut().zip(y).for_each(|(a, b)| *a += b);
        }
        ffn_act_max.push(act_max);
        ffn_out_max.push(out_max);
    }
    let h = rmsnorm(x.last().unwrap(), &w.output_norm, eps);
    Naive { logits: Mat::of(&w.output).mul(&h), ffn_act_max, ffn_out_max }
}
