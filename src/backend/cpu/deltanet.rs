//! Gated DeltaNet, the linear-attention layer of Qwen3-Next and Qwen3.5+ (three of every four
//! layers there), on the CPU: the plain reference that GPU kernels are tested against.
//!
//! Per token, after the input projections (the caller does those):
//! 1. the q|k|v channels (`[C]`, C = 2 * n_k * d_k + n_v * d_v) go through a causal depthwise
//!    conv1d of kernel `K` (4 in every released model) and SiLU; the last `K - 1` inputs are the
//!    layer's conv state;
//! 2. q and k are L2-normalized per head, q is scaled by `1/sqrt(d_k)`;
//! 3. `beta = sigmoid(b)`, decay `g = -exp(A_log) * softplus(a + dt_bias)` (f32, per value head);
//! 4. per value head, with its state `S` (`[d_k, d_v]`, f32) and the key head it reads:
//!    `S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q`;
//! 5. the output of each head is RMS-normalized, times the norm weight, times `SiLU(z)`.
//!
//! A prompt can run token by token ([`delta_rule_step`]) or in chunks ([`delta_rule_chunked`]):
//! the chunked form solves each chunk's updates as one triangular system, the shape a GPU prefill
//! kernel uses, and equals the step form up to rounding (tested below).

pub use crate::model::hybrid::HeadGrouping;

#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
fn softplus(x: f32) -> f32 {
    // log(1 + e^x) without overflow; torch's softplus (beta 1, threshold 20) returns x above 20.
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Causal depthwise conv1d with SiLU over `t` tokens. `x`: `[t, c]` inputs; `state`:
/// `[k - 1, c]`, the previous inputs, oldest first (zeros at a sequence's start), updated to the
/// last `k - 1` inputs; `w`: `[c, k]` (the checkpoint's `[c, 1, k]`); `out`: `[t, c]`.
pub fn conv1d_silu(x: &[f32], state: &mut [f32], w: &[f32], c: usize, k: usize, out: &mut [f32]) {
    let t = x.len() / c;
    debug_assert_eq!(state.len(), (k - 1) * c);
    debug_assert_eq!(w.len(), c * k);
    // The window for token i is inputs i-(k-1) ..= i, where negative indices read the state.
    let input = |i: isize, ch: usize| -> f32 {
        if i >= 0 {
            x[i as usize * c + ch]
        } else {
            state[(i + (k as isize - 1)) as usize * c + ch]
        }
    };
    for i in 0..t {
        for ch in 0..c {
            let mut acc = 0f32;
            for j in 0..k {
                acc += w[ch * k + j] * input(i as isize - (k as isize - 1) + j as isize, ch);
            }
            out[i * c + ch] = silu(acc);
        }
    }
    // New state: the last k-1 inputs of (state ++ x).
    let mut new_state = vec![0f32; state.len()];
    for s in 0..k - 1 {
        let i = t as isize - (k as isize - 1) + s as isize;
        for ch in 0..c {
            new_state[s * c + ch] = input(i, ch);
        }
    }
    state.copy_from_slice(&new_state);
}

/// `x / sqrt(sum(x^2) + eps)` in place (transformers' `l2norm`, eps 1e-6).
pub fn l2norm_inplace(x: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Per value head: `beta = sigmoid(b)` and the log-decay `g = -exp(a_log) * softplus(a + dt_bias)`.
pub fn gates(b: &[f32], a: &[f32], a_log: &[f32], dt_bias: &[f32], beta: &mut [f32], g: &mut [f32]) {
    let neg_a: Vec<f32> = a_log.iter().map(|v| -v.exp()).collect();
    gates_neg_a(b, a, &neg_a, dt_bias, beta, g);
}

/// [`gates`] with the decay rate given as `neg_a = -exp(A_log)` (what a `qwen35` GGUF stores).
pub fn gates_neg_a(b: &[f32], a: &[f32], neg_a: &[f32], dt_bias: &[f32], beta: &mut [f32], g: &mut [f32]) {
    beta.copy_from_slice(&b[..beta.len()]);
    g.copy_from_slice(&a[..g.len()]);
    gates_inplace(beta, g, neg_a, dt_bias);
}

/// [`gates_neg_a`] in place: `b` becomes beta, `a` becomes the log-decay g.
pub fn gates_inplace(b: &mut [f32], a: &mut [f32], neg_a: &[f32], dt_bias: &[f32]) {
    for h in 0..b.len() {
        b[h] = 1.0 / (1.0 + (-b[h]).exp());
        a[h] = neg_a[h] * softplus(a[h] + dt_bias[h]);
    }
}

/// One token of the delta rule for one value head. `s`: `[d_k, d_v]` state; `q`, `k`: `[d_k]`
/// (normalized, q scaled); `v`: `[d_v]`; `out`: `[d_v]`.
pub fn delta_rule_step(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: f32, beta: f32, out: &mut [f32]) {
    let dv = v.len();
    let decay = g.exp();
    s.iter_mut().for_each(|x| *x *= decay);
    // u = beta (v - S^T k)
    let mut u = v.to_vec();
    for (i, &ki) in k.iter().enumerate() {
        let row = &s[i * dv..(i + 1) * dv];
        u.iter_mut().zip(row).for_each(|(uj, &sij)| *uj -= ki * sij);
    }
    u.iter_mut().for_each(|x| *x *= beta);
    // S += k u^T; o = S^T q
    out.iter_mut().for_each(|o| *o = 0.0);
    for (i, (&ki, &qi)) in k.iter().zip(q).enumerate() {
        let row = &mut s[i * dv..(i + 1) * dv];
        for ((sij, &uj), o) in row.iter_mut().zip(&u).zip(out.iter_mut()) {
            *sij += ki * uj;
            *o += qi * *sij;
        }
    }
}

/// The delta rule over `t` tokens of one value head in chunks of `chunk` tokens; equals
/// `t` calls of [`delta_rule_step`]. `q`, `k`: `[t, d_k]`; `v`: `[t, d_v]`; `g`, `beta`: `[t]`;
/// `s`: `[d_k, d_v]` in/out; `out`: `[t, d_v]`.
///
/// Within a chunk starting from state `S0`, with `G_i` the cumulative log-decay up to token `i`
/// and `D_ij = exp(G_i - G_j)` (<= 1 for j <= i), the updates `u_i` satisfy
/// `u_i + beta_i sum_{j<i} D_ij (k_i . k_j) u_j = beta_i (v_i - exp(G_i) S0^T k_i)`, a unit lower
/// triangular system solved by forward substitution; then
/// `o_i = exp(G_i) S0^T q_i + sum_{j<=i} D_ij (q_i . k_j) u_j` and
/// `S_end = exp(G_last) S0 + sum_j D_last,j k_j u_j^T`.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_chunked(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    chunk: usize,
    out: &mut [f32],
) {
    let t = g.len();
    let dk = q.len() / t.max(1);
    let dv = v.len() / t.max(1);
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let mut start = 0;
    while start < t {
        let n = chunk.min(t - start);
        let row = |d: usize, i: usize| (start + i) * d..(start + i + 1) * d;
        // Cumulative log-decay within the chunk.
        let mut cum = vec![0f32; n];
        let mut acc = 0f32;
        for i in 0..n {
            acc += g[start + i];
            cum[i] = acc;
        }
        // S0^T x for x = k_i and q_i: [n, dv] each.
        let s0t = |x: &[f32]| -> Vec<f32> {
            let mut r = vec![0f32; dv];
            for (a, &xa) in x.iter().enumerate() {
                r.iter_mut().zip(&s[a * dv..(a + 1) * dv]).for_each(|(rj, &sj)| *rj += xa * sj);
            }
            r
        };
        let mut u = vec![0f32; n * dv];
        for i in 0..n {
            let ki = &k[row(dk, i)];
            let sk = s0t(ki);
            let e = cum[i].exp();
            let mut ui: Vec<f32> = v[row(dv, i)].iter().zip(&sk).map(|(&vj, &skj)| vj - e * skj).collect();
            for j in 0..i {
                let c = (cum[i] - cum[j]).exp() * dot(ki, &k[row(dk, j)]);
                ui.iter_mut().zip(&u[j * dv..(j + 1) * dv]).for_each(|(a, &b)| *a -= c * b);
            }
            ui.iter_mut().for_each(|x| *x *= beta[start + i]);
            u[i * dv..(i + 1) * dv].copy_from_slice(&ui);
        }
        for i in 0..n {
            let qi = &q[row(dk, i)];
            let e = cum[i].exp();
            let mut o: Vec<f32> = s0t(qi).into_iter().map(|x| e * x).collect();
            for j in 0..=i {
                let c = (cum[i] - cum[j]).exp() * dot(qi, &k[row(dk, j)]);
                o.iter_mut().zip(&u[j * dv..(j + 1) * dv]).for_each(|(a, &b)| *a += c * b);
            }
            out[(start + i) * dv..(start + i + 1) * dv].copy_from_slice(&o);
        }
        let last = cum[n - 1];
        s.iter_mut().for_each(|x| *x *= last.exp());
        for j in 0..n {
            let c = (last - cum[j]).exp();
            let kj = &k[row(dk, j)];
            let uj = &u[j * dv..(j + 1) * dv];
            for (a, &ka) in kj.iter().enumerate() {
                s[a * dv..(a + 1) * dv].iter_mut().zip(uj).for_each(|(sa, &ub)| *sa += c * ka * ub);
            }
        }
        start += n;
    }
}

/// The gated RMSNorm of a head's output: `rmsnorm(x) * w * silu(z)` (`x`, `z`, `w`: `[d_v]`).
/// The weight is used as stored (this norm is not zero-centred in the released checkpoints).
pub fn gated_rmsnorm(x: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for ((xv, &zv), &wv) in x.iter_mut().zip(z).zip(w) {
        *xv = *xv * inv * wv * silu(zv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// q, k, v, g, beta of `t` tokens.
    type Inputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

    fn inputs(t: usize, dk: usize, dv: usize) -> Inputs {
        let mut q = values(t * dk, 1);
        let mut k = values(t * dk, 2);
        for i in 0..t {
            l2norm_inplace(&mut q[i * dk..(i + 1) * dk], 1e-6);
            l2norm_inplace(&mut k[i * dk..(i + 1) * dk], 1e-6);
        }
        let scale = 1.0 / (dk as f32).sqrt();
        q.iter_mut().for_each(|x| *x *= scale);
        let v = values(t * dv, 3);
        let (mut beta, mut g) = (vec![0f32; t], vec![0f32; t]);
        let (b, a) = (values(t, 4), values(t, 5));
        for i in 0..t {
            gates(&b[i..i + 1], &a[i..i + 1], &[0.3], &[0.1], &mut beta[i..i + 1], &mut g[i..i + 1]);
        }
        (q, k, v, g, beta)
    }

    fn run_steps(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: &[f32], beta: &[f32]) -> Vec<f32> {
        let t = g.len();
        let (dk, dv) = (q.len() / t, v.len() / t);
        let mut out = vec![0f32; t * dv];
        for i in 0..t {
            let (qi, ki, vi) = (&q[i * dk..(i + 1) * dk], &k[i * dk..(i + 1) * dk], &v[i * dv..(i + 1) * dv]);
            delta_rule_step(s, qi, ki, vi, g[i], beta[i], &mut out[i * dv..(i + 1) * dv]);
        }
        out
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn one_step_from_zero_state_is_beta_v_times_q_dot_k() {
        // From S = 0: u = beta v, S = k u^T, o = (q . k) beta v.
        let (dk, dv) = (4, 3);
        let mut s = vec![0f32; dk * dv];
        let (q, k, v) = ([0.5, 0.0, 0.5, 0.0], [0.6, 0.8, 0.0, 0.0], [1.0, -2.0, 3.0]);
        let mut out = [0f32; 3];
        delta_rule_step(&mut s, &q, &k, &v, -0.7, 0.25, &mut out);
        let qk = 0.3f32;
        for j in 0..dv {
            assert!((out[j] - qk * 0.25 * v[j]).abs() < 1e-6, "{out:?}");
        }
        // A second identical key with beta 1 replaces what the state recalls for it by v2
        // (the delta rule's defining property: S^T k = v2 after the step, when |k| = 1 and no decay).
        let v2 = [0.0, 1.0, 0.0];
        delta_rule_step(&mut s, &q, &k, &v2, 0.0, 1.0, &mut out);
        for (j, want) in v2.iter().enumerate() {
            let recalled: f32 = (0..dk).map(|i| k[i] * s[i * dv + j]).sum();
            assert!((recalled - want).abs() < 1e-5, "recalled {recalled} want {want}");
        }
    }

    #[test]
    fn chunked_form_equals_steps() {
        let (t, dk, dv) = (37, 16, 8);
        let (q, k, v, g, beta) = inputs(t, dk, dv);
        let s_init = values(dk * dv, 9);
        let mut s_step = s_init.clone();
        let want = run_steps(&mut s_step, &q, &k, &v, &g, &beta);
        for chunk in [1, 4, 16, 64] {
            let mut s = s_init.clone();
            let mut out = vec![0f32; t * dv];
            delta_rule_chunked(&mut s, &q, &k, &v, &g, &beta, chunk, &mut out);
            assert!(max_diff(&out, &want) < 1e-4, "chunk {chunk}: outputs differ by {}", max_diff(&out, &want));
            assert!(max_diff(&s, &s_step) < 1e-4, "chunk {chunk}: states differ by {}", max_diff(&s, &s_step));
        }
    }

    #[test]
    fn conv_state_carries_across_calls() {
        let (c, k, t) = (5, 4, 9);
        let x = values(t * c, 11);
        let w = values(c * k, 12);
        let mut whole_state = vec![0f32; (k - 1) * c];
        let mut whole = vec![0f32; t * c];
        conv1d_silu(&x, &mut whole_state, &w, c, k, &mut whole);
        // Token by token with the rolling state gives the same outputs and final state.
        let mut state = vec![0f32; (k - 1) * c];
        let mut one = vec![0f32; c];
        for i in 0..t {
            conv1d_silu(&x[i * c..(i + 1) * c], &mut state, &w, c, k, &mut one);
            assert!(max_diff(&one, &whole[i * c..(i + 1) * c]) < 1e-6, "token {i}");
        }
        assert_eq!(state, whole_state);
        // Token 0 sees only itself (zero history): silu(w[ch][k-1] * x[0][ch]).
        for ch in 0..c {
            let want = silu(w[ch * k + k - 1] * x[ch]);
            assert!((whole[ch] - want).abs() < 1e-6);
        }
    }

    #[test]
    fn gates_match_their_formulas() {
        let (mut beta, mut g) = ([0f32; 2], [0f32; 2]);
        gates(&[0.0, 2.0], &[0.5, 30.0], &[0.0, 1.0], &[0.0, -5.0], &mut beta, &mut g);
        assert!((beta[0] - 0.5).abs() < 1e-7);
        assert!((beta[1] - 1.0 / (1.0 + (-2f32).exp())).abs() < 1e-7);
        assert!((g[0] + (1.0 + 0.5f32.exp()).ln()).abs() < 1e-6);
        // softplus(25) = 25 past the threshold; exp(1) * 25.
        assert!((g[1] + 1f32.exp() * 25.0).abs() < 1e-4);
    }
}
