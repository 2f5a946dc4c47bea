//! The host side of the Gated DeltaNet parity tests (deltanet.rs): a layer's head sizes
//! (`Case`) and the kernel parameter structs they give, the chunk tables, random inputs of a
//! recurrence over several sequences, and the CPU twins run over the same chunks
//! (backend::cpu::deltanet per sequence and head).

use dustoff::backend::cpu::deltanet::{
    conv1d_silu, delta_rule_chunked, delta_rule_step, gates_inplace, l2norm_inplace,
};
use dustoff::backend::cuda::ops::deltanet::{DnGatedNorm, DnPrep, DnRecur, StatePool};
use dustoff::backend::cuda::ops::launch::Dev;

use super::Gpu;

/// Token counts of the sequences of one launch: those of a real step (decode, short and long
/// prompt chunks).
pub(super) const COUNTS: [usize; 6] = [1, 2, 7, 9, 33, 64];
/// The slot of sequence i in the recurrence tests: not in order (the chunk table names them).
pub(super) const SLOTS: [usize; 6] = [2, 5, 0, 4, 1, 3];

/// `[n_chunks, (first, tokens, slot)...]` for chunks of `counts` tokens laid out in order,
/// sequence i in slot `slots[i]`.
pub(super) fn chunk_table(counts: &[usize], slots: &[usize]) -> Vec<i32> {
    let mut t = vec![counts.len() as i32];
    let mut first = 0;
    for (&n, &s) in counts.iter().zip(slots) {
        t.extend([first as i32, n as i32, s as i32]);
        first += n;
    }
    t
}

/// [`chunk_table`] with room for `max_chunks` chunks (the launch's grid): the rows past the
/// table's chunks are zero, and their blocks must exit.
pub(super) fn padded_table(counts: &[usize], slots: &[usize], max_chunks: usize) -> Vec<i32> {
    let mut t = chunk_table(counts, slots);
    t.resize(1 + 3 * max_chunks, 0);
    t
}

/// Random decay rates `-exp(1.5 v)` of `n_v` value heads (`ssm_a` as the loaders store it).
pub(super) fn decay_rates(g: &mut Gpu, n_v: usize) -> Vec<f32> {
    g.randn(n_v, 1.0).iter().map(|v| -(v * 1.5).exp()).collect()
}

/// What one linear layer's prep + recurrence reads and writes, on the host.
pub(super) struct Case {
    pub nk: usize,
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
    pub tiled: bool,
}

impl Case {
    pub fn channels(&self) -> usize {
        2 * self.nk * self.dk + self.nv * self.dv
    }
    /// proj row: [C (unused here) | V (unused) | b (n_v) | a (n_v)].
    pub fn proj_stride(&self) -> usize {
        self.channels() + self.nv * self.dv + 2 * self.nv
    }
    pub fn mat(&self) -> usize {
        self.dk * self.dv
    }
    /// Columns of the gates b and a in a projection row.
    pub fn gate_offs(&self) -> (usize, usize) {
        let (c, vd) = (self.channels(), self.nv * self.dv);
        (c + vd, c + vd + self.nv)
    }

    /// `dn_prep_f32` over `n` tokens: `mixed` `[n, C]`, `proj` `[n, proj_stride]`, the decay
    /// rates and dt bias `[n_v]` each.
    pub fn prep(&self, mixed: Dev<f32>, proj: Dev<f32>, (neg_a, dt_bias): (Dev<f32>, Dev<f32>), n: usize) -> DnPrep {
        let (b_off, a_off) = self.gate_offs();
        DnPrep {
            mixed,
            proj,
            neg_a,
            dt_bias,
            n_tok: n,
            n_k: self.nk,
            d_k: self.dk,
            n_v: self.nv,
            channels: self.channels(),
            proj_stride: self.proj_stride(),
            b_off,
            a_off,
        }
    }

    /// `dn_recur_f32` over `n` tokens of the prepared `mixed` and `proj` into `out`
    /// (`[n, n_v d_v]`), each slot's matrices `conv_len` values into its layer state in `pool`.
    pub fn recur(
        &self,
        (mixed, proj, out): (Dev<f32>, Dev<f32>, Dev<f32>),
        pool: StatePool,
        conv_len: usize,
        n: usize,
    ) -> DnRecur {
        let (b_off, a_off) = self.gate_offs();
        DnRecur {
            mixed,
            proj,
            out,
            pool,
            conv_len,
            n_tok: n,
            n_k: self.nk,
            n_v: self.nv,
            d_k: self.dk,
            d_v: self.dv,
            channels: self.channels(),
            proj_stride: self.proj_stride(),
            b_off,
            a_off,
            tiled: self.tiled,
        }
    }
}

impl Case {
    /// `dn_gated_norm_f32` in place on `o` (`[n, n_v d_v]`), gated by the z columns of `proj`
    /// (right after the q|k|v channels of each row), weights `w` (`[d_v]`).
    pub fn gated_norm(&self, o: Dev<f32>, proj: Dev<f32>, w: Dev<f32>, n: usize, eps: f32) -> DnGatedNorm {
        let (channels, z_stride) = (self.channels(), self.proj_stride());
        DnGatedNorm { o, z: proj.offset(channels), z_stride, w, n_tok: n, n_v: self.nv, d_v: self.dv, eps }
    }
}

/// CPU: the conv + SiLU of each of `counts`' sequences (in slot `slots[i]`) over the first `c`
/// channels of the rows of `x` (`[n, stride]`), with its window (`[k - 1, c]`) `layer_off`
/// into its slot of `pool` (slots of `per_slot`), updated in place. Returns `[n, c]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn cpu_conv(
    x: &[f32],
    stride: usize,
    w: &[f32],
    (c, k): (usize, usize),
    (counts, slots): (&[usize], &[usize]),
    pool: &mut [f32],
    per_slot: usize,
    layer_off: usize,
) -> Vec<f32> {
    let n: usize = counts.iter().sum();
    let mut out = vec![0f32; n * c];
    let mut t0 = 0;
    for (&cnt, &slot) in counts.iter().zip(slots) {
        let xs: Vec<f32> = (t0..t0 + cnt).flat_map(|t| x[t * stride..t * stride + c].to_vec()).collect();
        let st = &mut pool[slot * per_slot + layer_off..slot * per_slot + layer_off + (k - 1) * c];
        conv1d_silu(&xs, st, w, c, k, &mut out[t0 * c..(t0 + cnt) * c]);
        t0 += cnt;
    }
    out
}

/// CPU: what `dn_prep_f32` does to `n` tokens in place: L2 norms of the q and k heads of
/// `mixed` (`[n, C]`), the q scale `1 / sqrt(d_k)`, and the gates in `proj` (`[n, proj_stride]`).
pub(super) fn cpu_prep(cs: &Case, n: usize, mixed: &mut [f32], proj: &mut [f32], neg_a: &[f32], dt_bias: &[f32]) {
    let (c, ps) = (cs.channels(), cs.proj_stride());
    let (b_off, a_off) = cs.gate_offs();
    let scale = 1.0 / (cs.dk as f32).sqrt();
    for t in 0..n {
        let m = &mut mixed[t * c..(t + 1) * c];
        for head in m[..2 * cs.nk * cs.dk].chunks_exact_mut(cs.dk) {
            l2norm_inplace(head, 1e-6);
        }
        m[..cs.nk * cs.dk].iter_mut().for_each(|v| *v *= scale);
        let row = &mut proj[t * ps..(t + 1) * ps];
        let (left, a) = row.split_at_mut(a_off);
        gates_inplace(&mut left[b_off..b_off + cs.nv], &mut a[..cs.nv], neg_a, dt_bias);
    }
}

/// Random inputs of one linear layer's prep + recurrence over the `COUNTS` sequences in
/// `SLOTS` of a pool of 6 slots (`per_slot` each: a conv state `[3, C]`, then the matrices).
pub(super) struct Recurrence {
    pub mixed: Vec<f32>,
    pub proj: Vec<f32>,
    pub neg_a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub pool: Vec<f32>,
    pub mats_off: usize,
    pub per_slot: usize,
}

/// The CPU twins' results: the output (`[n, n_v d_v]`), `mixed` and `proj` after the prep,
/// and the pool after the recurrence.
pub(super) struct CpuRecurrence {
    pub out: Vec<f32>,
    pub mixed: Vec<f32>,
    pub proj: Vec<f32>,
    pub pool: Vec<f32>,
}

impl Recurrence {
    pub fn random(g: &mut Gpu, cs: &Case) -> Self {
        let (c, n) = (cs.channels(), COUNTS.iter().sum::<usize>());
        let mats_off = 3 * c; // after a conv state [3, C]
        let per_slot = mats_off + cs.nv * cs.mat();
        let mixed = g.randn(n * c, 1.0);
        let proj = g.randn(n * cs.proj_stride(), 2.0);
        let neg_a = decay_rates(g, cs.nv);
        let dt_bias = g.randn(cs.nv, 1.0);
        // Start from states a previous chunk left (small values, as after decay).
        let pool = g.randn(6 * per_slot, 0.2);
        Recurrence { mixed, proj, neg_a, dt_bias, pool, mats_off, per_slot }
    }

    /// CPU: l2norm + gates, then the delta rule per chunk from its slot's matrices, step by
    /// step or (`chunk`) in the chunked form with chunks of that many tokens.
    pub fn cpu(&self, cs: &Case, chunk: Option<usize>) -> CpuRecurrence {
        let (c, ps, vd) = (cs.channels(), cs.proj_stride(), cs.nv * cs.dv);
        let n: usize = COUNTS.iter().sum();
        let (b_off, a_off) = cs.gate_offs();
        let (mut mixed, mut proj, mut mats) = (self.mixed.clone(), self.proj.clone(), self.pool.clone());
        cpu_prep(cs, n, &mut mixed, &mut proj, &self.neg_a, &self.dt_bias);
        let mut out = vec![0f32; n * vd];
        let mut t0 = 0;
        for (&cnt, &slot) in COUNTS.iter().zip(&SLOTS) {
            for h in 0..cs.nv {
                let kh = if cs.tiled { h % cs.nk } else { h / (cs.nv / cs.nk) };
                let base = slot * self.per_slot + self.mats_off + h * cs.mat();
                let (q_at, k_at, v_at) = (kh * cs.dk, (cs.nk + kh) * cs.dk, 2 * cs.nk * cs.dk + h * cs.dv);
                if let Some(ch) = chunk {
                    // The chunked CPU twin over the chunk's tokens of this head, gathered.
                    let (mut q, mut k, mut v, mut g, mut beta) = (vec![], vec![], vec![], vec![], vec![]);
                    for t in t0..t0 + cnt {
                        let m = &mixed[t * c..(t + 1) * c];
                        q.extend_from_slice(&m[q_at..q_at + cs.dk]);
                        k.extend_from_slice(&m[k_at..k_at + cs.dk]);
                        v.extend_from_slice(&m[v_at..v_at + cs.dv]);
                        g.push(proj[t * ps + a_off + h]);
                        beta.push(proj[t * ps + b_off + h]);
                    }
                    let mut o = vec![0f32; cnt * cs.dv];
                    delta_rule_chunked(&mut mats[base..base + cs.mat()], &q, &k, &v, &g, &beta, ch, &mut o);
                    for (i, t) in (t0..t0 + cnt).enumerate() {
                        out[t * vd + h * cs.dv..][..cs.dv].copy_from_slice(&o[i * cs.dv..(i + 1) * cs.dv]);
                    }
                    continue;
                }
                for t in t0..t0 + cnt {
                    let m = &mixed[t * c..(t + 1) * c];
                    let (q, k, v) = (&m[q_at..q_at + cs.dk], &m[k_at..k_at + cs.dk], &m[v_at..v_at + cs.dv]);
                    let (g, beta) = (proj[t * ps + a_off + h], proj[t * ps + b_off + h]);
                    let o = &mut out[t * vd + h * cs.dv..][..cs.dv];
                    delta_rule_step(&mut mats[base..base + cs.mat()], q, k, v, g, beta, o);
                }
            }
            t0 += cnt;
        }
        CpuRecurrence { out, mixed, proj, pool: mats }
    }
}
