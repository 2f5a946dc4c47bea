//! Hybrid models (Qwen3.5 `qwen35`, Qwen3.5-MoE `qwen35moe`, Qwen3-Next `qwen3next` in GGUF):
//! Gated DeltaNet linear-attention layers interleaved with gated full-attention layers; the MoE
//! ones have a mixture of experts with a gated shared expert as FFN (`model::moe`). This file
//! holds the extra configuration ([`HybridConfig`]) and its rules, and the per-layer weights
//! ([`HybridLayer`]); `gguf_config` / `hf` read the configuration, `gguf_bind` / `hf_bind` bind
//! the weights. The forward pass is `backend::cpu::hybrid`.
//!
//! What differs between the two forms of one model, and how it is made equal here:
//! - RMSNorm weights: the checkpoint stores them zero-centred (`(1 + w) * x_hat`) for the input,
//!   post-attention, final and q/k norms; llama.cpp's converter writes `1 + w`. The HF loader
//!   adds 1 so that every norm is `w * x_hat` downstream. The DeltaNet output norm is not
//!   zero-centred in either form.
//! - Decay: the checkpoint has `A_log`, the GGUF `ssm_a = -exp(A_log)`; both become `neg_a`.
//! - Value-head order: the checkpoint groups the value heads by the key head they read
//!   (`repeat_interleave`); the `qwen35*` converter tiles them (the `qwen3next` one does not).
//!   The file's order is kept and `HeadGrouping` says which key head a value head reads.
//! - Qwen3-Next checkpoints fuse `in_proj_qkvz` and `in_proj_ba`, grouped per key head (per key
//!   head: q, k, its value heads' v, their z; and b, a); the GGUF regroups qkvz into `attn_qkv`
//!   (all q | all k | all v) and `attn_gate` but keeps `ssm_ba` grouped. Both are regrouped
//!   at binding into the separate projections of Qwen3.5 ([`fused_qkvz_rows`], [`fused_ba_rows`]).

pub use super::arch::HeadGrouping;
use super::rules::ShapeError;
use super::tensor::Tensor;

/// What a hybrid model adds to `ModelConfig`. The full-attention layers use the config's
/// head counts and head size.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridConfig {
    /// Per layer: true for a Gated DeltaNet (linear-attention) layer, false for full attention.
    pub recurrent: Vec<bool>,
    /// Linear attention: key heads, value heads, key head size, value head size.
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
    /// Causal conv1d kernel length (4 in every released model).
    pub conv_kernel: usize,
    pub grouping: HeadGrouping,
    /// Full attention: dims of each head that RoPE rotates (the first ones; `partial_rotary_factor`).
    pub rotary_dim: usize,
    /// Full attention: `q_proj` also yields a per-head output gate (`attn_output_gate`).
    pub attn_output_gate: bool,
}

/// A quantity of the hybrid configuration, as [`HybridConfig`]'s rules blame it: each loader
/// maps it to its own file's name for the value (a GGUF key, a `config.json` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HybridField {
    /// Linear-attention key heads.
    KeyHeads,
    /// Linear-attention value heads.
    ValueHeads,
    /// Size of one key head.
    KeyHeadDim,
    /// Size of one value head.
    ValueHeadDim,
    /// Causal conv1d kernel length.
    ConvKernel,
    /// Dims of a full-attention head that RoPE rotates.
    RotaryDim,
}

impl HybridConfig {
    /// Channels of the q|k|v projection and of the conv1d: `2 n_k d_k + n_v d_v`.
    pub fn conv_channels(&self) -> usize {
        2 * self.n_k_heads * self.d_k + self.n_v_heads * self.d_v
    }
    /// Width of the value (and z) projection: `n_v d_v`.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.d_v
    }
    /// f32 values of one sequence's recurrent state in one linear layer: the last `K - 1` conv
    /// inputs and one `[d_k, d_v]` matrix per value head.
    pub fn state_len_per_layer(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels() + self.n_v_heads * self.d_k * self.d_v
    }
    /// Bytes of one sequence's recurrent state, all linear layers (f32).
    pub fn state_bytes_per_seq(&self) -> usize {
        self.recurrent.iter().filter(|&&r| r).count() * self.state_len_per_layer() * 4
    }
    /// What a memory plan says about the recurrent state, e.g. `recurrent state 0.28 MB/sequence
    /// (3 linear layers x (conv window 3 x 256 + 4 delta-rule matrices 32 x 32), f32)`.
    pub fn state_summary(&self) -> String {
        let n = self.recurrent.iter().filter(|&&r| r).count();
        format!(
            "recurrent state {:.2} MB/sequence ({n} linear layers x (conv window {} x {} + {} delta-rule matrices {} x {}), f32)",
            self.state_bytes_per_seq() as f64 / 1e6,
            self.conv_kernel - 1,
            self.conv_channels(),
            self.n_v_heads,
            self.d_k,
            self.d_v
        )
    }
    /// RoPE inverse frequencies over the rotated dims: `[rotary_dim / 2]`.
    pub fn rope_inv_freq(&self, theta: f32) -> Vec<f32> {
        let r = self.rotary_dim;
        (0..r / 2).map(|i| (theta as f64).powf(-(2.0 * i as f64) / r as f64) as f32).collect()
    }

    /// The linear-attention rules, written once for every loader (GGUF metadata, `config.json`):
    /// whole value heads per key head, positive head sizes, a conv kernel that spans a previous
    /// input, and an even number of rotated dims (RoPE rotates pairs) within the `head_dim`-wide
    /// head. `name` spells a quantity as the caller's file does, for the reasons that name a
    /// second one.
    pub(super) fn check(
        &self,
        head_dim: usize,
        name: &dyn Fn(HybridField) -> String,
    ) -> Result<(), ShapeError<HybridField>> {
        let fail = |field, reason| Err(ShapeError { field, reason });
        let (nk, nv) = (self.n_k_heads, self.n_v_heads);
        if nk == 0 {
            return fail(HybridField::KeyHeads, "0 must be positive".into());
        }
        if nv == 0 || !nv.is_multiple_of(nk) {
            let k = name(HybridField::KeyHeads);
            return fail(HybridField::ValueHeads, format!("{nv} must be a positive multiple of {k} {nk}"));
        }
        if self.d_k == 0 {
            return fail(HybridField::KeyHeadDim, "0 must be positive".into());
        }
        if self.d_v == 0 {
            return fail(HybridField::ValueHeadDim, "0 must be positive".into());
        }
        if self.conv_kernel < 2 {
            return fail(HybridField::ConvKernel, format!("{} must be at least 2", self.conv_kernel));
        }
        let r = self.rotary_dim;
        if r == 0 || !r.is_multiple_of(2) || r > head_dim {
            return fail(
                HybridField::RotaryDim,
                format!("{r} must be even, positive and at most the head size {head_dim}"),
            );
        }
        Ok(())
    }
}

/// Rows of Qwen3-Next's fused `in_proj_qkvz` `[nk (2 d_k + 2 r d_v), dim]` (`r = n_v / n_k`;
/// per key head: q, k, the v of its `r` value heads, their z) that make up the separate
/// projections: `(q|k|v rows [C], z rows [V])`, value heads in grouped order.
pub fn fused_qkvz_rows(h: &HybridConfig) -> (Vec<usize>, Vec<usize>) {
    let (nk, dk, dv) = (h.n_k_heads, h.d_k, h.d_v);
    let rv = h.n_v_heads / nk * dv;
    let block = 2 * dk + 2 * rv;
    let part = |off: usize, len: usize| (0..nk).flat_map(move |k| k * block + off..k * block + off + len);
    let qkv = part(0, dk).chain(part(dk, dk)).chain(part(2 * dk, rv)).collect();
    (qkv, part(2 * dk + rv, rv).collect())
}

/// Rows of Qwen3-Next's fused `in_proj_ba` / GGUF `ssm_ba` `[2 n_v, dim]` (per key head: the b
/// then the a of its `r` value heads): `(b rows [n_v], a rows [n_v])`.
pub fn fused_ba_rows(h: &HybridConfig) -> (Vec<usize>, Vec<usize>) {
    let (nk, r) = (h.n_k_heads, h.n_v_heads / h.n_k_heads);
    let part = |off: usize| (0..nk).flat_map(move |k| k * 2 * r + off..k * 2 * r + off + r).collect();
    (part(0), part(r))
}

/// Layer `i` is full attention when `(i + 1) % interval == 0` (Qwen3-Next, Qwen3.5).
pub(super) fn by_interval(n_layers: usize, interval: usize) -> Vec<bool> {
    (0..n_layers).map(|i| interval == 0 || !(i + 1).is_multiple_of(interval)).collect()
}

/// The weights of one Gated DeltaNet layer (`C` = q|k|v channels, `V` = `n_v d_v`).
#[derive(Clone, Debug)]
pub struct DeltaNetWeights {
    pub w_qkv: Tensor,     // [C, dim]: all q heads, all k heads, all v heads
    pub w_z: Tensor,       // [V, dim]: the output gate
    pub w_b: Tensor,       // [n_v, dim]: beta logits
    pub w_a: Tensor,       // [n_v, dim]: decay input
    pub conv: Vec<f32>,    // [C, K]
    pub neg_a: Vec<f32>,   // [n_v]: -exp(A_log)
    pub dt_bias: Vec<f32>, // [n_v]
    pub norm: Vec<f32>,    // [d_v]: output RMSNorm (not zero-centred)
    pub w_out: Tensor,     // [dim, V]
}

/// What a layer of a hybrid model mixes tokens with; the rest of `LayerWeights` (norms, FFN)
/// is shared with plain models.
#[derive(Clone, Debug)]
pub enum HybridLayer {
    /// Gated DeltaNet. The layer's `wq`, `wk`, `wv`, `wo` are absent (0 rows).
    Linear(Box<DeltaNetWeights>),
    /// Full attention with partial RoPE; with the output gate, `wq` is `[2 q_dim, dim]` and each
    /// head's rows are `[query (head_dim), gate (head_dim)]`.
    Attention,
}

impl HybridLayer {
    /// Bytes of the matrices a decode step reads that the plain fields do not hold.
    pub fn extra_matrix_bytes(&self) -> usize {
        self.extra_matrices().iter().map(|t| t.bytes().len()).sum()
    }

    /// Those matrices (a linear layer's projections; none for attention).
    pub fn extra_matrices(&self) -> Vec<&Tensor> {
        match self {
            HybridLayer::Linear(d) => vec![&d.w_qkv, &d.w_z, &d.w_b, &d.w_a, &d.w_out],
            HybridLayer::Attention => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_puts_full_attention_last_in_each_group() {
        assert_eq!(by_interval(6, 3), [true, true, false, true, true, false]);
        assert_eq!(by_interval(4, 4), [true, true, true, false]);
    }

    #[test]
    fn fused_qwen3_next_rows() {
        // 2 key heads of 2, 4 value heads of 1 (r = 2): per key head q[2] k[2] v[2] z[2].
        let h = HybridConfig {
            recurrent: vec![true],
            n_k_heads: 2,
            n_v_heads: 4,
            d_k: 2,
            d_v: 1,
            conv_kernel: 4,
            grouping: HeadGrouping::Interleaved,
            rotary_dim: 2,
            attn_output_gate: true,
        };
        let (qkv, z) = fused_qkvz_rows(&h);
        assert_eq!(qkv, [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13]);
        assert_eq!(z, [6, 7, 14, 15]);
        assert_eq!(fused_ba_rows(&h), (vec![0, 1, 4, 5], vec![2, 3, 6, 7]));
    }

    #[test]
    fn head_grouping() {
        // 2 key heads, 4 value heads.
        let inter: Vec<_> = (0..4).map(|h| HeadGrouping::Interleaved.key_head(h, 2, 4)).collect();
        let tiled: Vec<_> = (0..4).map(|h| HeadGrouping::Tiled.key_head(h, 2, 4)).collect();
        assert_eq!(inter, [0, 0, 1, 1]);
        assert_eq!(tiled, [0, 1, 0, 1]);
    }
}
