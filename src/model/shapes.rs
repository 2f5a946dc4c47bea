//! Real architectures' shapes, for synthetic (random-weight) models: benchmarks and tests can
//! check a machine before the weights arrive.

use super::arch::{by_gguf_name, Arch};
use super::config::{ModelConfig, MoeConfig, RopeScaling};
use super::hybrid::{HeadGrouping, HybridConfig};

/// Names accepted by `--synthetic`.
pub const SHAPES: &[&str] = &[
    "qwen3-8b",
    "qwen2.5-7b",
    "llama3-8b",
    "smollm2-135m",
    "qwen3-0.6b",
    "qwen3-30b-a3b",
    "qwen2-57b-a14b",
    "qwen3.5-9b",
    "qwen3.5-27b",
    "qwen3.6-35b-a3b",
];

pub fn shape(name: &str) -> Option<ModelConfig> {
    #[allow(clippy::too_many_arguments)]
    fn c(
        arch: Arch,
        n_layers: usize,
        dim: usize,
        ffn_dim: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        vocab_size: usize,
        rope_theta: f32,
        rms_eps: f32,
        tied: bool,
    ) -> ModelConfig {
        ModelConfig {
            arch,
            n_layers,
            dim,
            ffn_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            rms_eps,
            rope_theta,
            rope_style: arch.family().gguf_rope_style,
            rope_scaling: RopeScaling::None,
            max_context: 32768,
            tied_embeddings: tied,
            moe: None,
            hybrid: None,
        }
    }
    // Each shape names its family by its GGUF name.
    let a = by_gguf_name;
    Some(match name {
        "qwen3-8b" => c(a("qwen3")?, 36, 4096, 12288, 32, 8, 128, 151_936, 1e6, 1e-6, false),
        "qwen3-0.6b" => c(a("qwen3")?, 28, 1024, 3072, 16, 8, 128, 151_936, 1e6, 1e-6, true),
        "qwen2.5-7b" => c(a("qwen2")?, 28, 3584, 18944, 28, 4, 128, 152_064, 1e6, 1e-6, false),
        "llama3-8b" => c(a("llama")?, 32, 4096, 14336, 32, 8, 128, 128_256, 5e5, 1e-5, false),
        "smollm2-135m" => c(a("llama")?, 30, 576, 1536, 9, 3, 64, 49_152, 1e5, 1e-5, true),
        // Qwen3-30B-A3B: 48 sparse layers of 128 experts (8 used, width 768); the dense width
        // 6144 is its config's `intermediate_size`, used by no layer.
        "qwen3-30b-a3b" => ModelConfig {
            moe: Some(all_sparse(128, 8, 768, 48)),
            ..c(a("qwen3moe")?, 48, 2048, 6144, 32, 4, 128, 151_936, 1e6, 1e-6, false)
        },
        // Qwen2-57B-A14B (its released config.json): 28 layers, each sparse: 64 experts of width
        // 2560, 8 used, not renormalised (`norm_topk_prob` false), plus a gated shared expert of
        // width 20480; Qwen2 attention (28 query / 4 KV heads of 128, Q/K/V biases); the dense
        // width 18944 is its `intermediate_size`, used by no layer; untied head.
        "qwen2-57b-a14b" => ModelConfig {
            moe: Some(MoeConfig { norm_topk_prob: false, shared_ffn_dim: Some(20480), ..all_sparse(64, 8, 2560, 28) }),
            ..c(a("qwen2moe")?, 28, 3584, 18944, 28, 4, 128, 151_936, 1e6, 1e-6, false)
        },
        // Qwen3.5-9B (text model of the released config): 32 layers, every 4th full attention
        // (16 query / 4 KV heads of 256, output gate, 64 rotated dims, theta 1e7), the others
        // Gated DeltaNet (16 key heads and 32 value heads of 128, conv kernel 4); untied head.
        "qwen3.5-9b" => ModelConfig {
            hybrid: Some(qwen35_linear(32, 32)),
            ..c(a("qwen35")?, 32, 4096, 12288, 16, 4, 256, 248_320, 1e7, 1e-6, false)
        },
        // Qwen3.6-35B-A3B = Qwen3.5-35B-A3B (one topology; transformers' qwen3_5_moe docs, and
        // the released configs as restated by THUDM/slime scripts/models/qwen3.5-35B-A3B.sh):
        // 40 layers, every 4th full attention (16 query / 2 KV heads of 256, output gate, 25% =
        // 64 rotated dims, theta 1e7), the others Gated DeltaNet (16 key / 32 value heads of
        // 128, conv kernel 4); every layer sparse: 256 experts, 8 used, width 512, plus a gated
        // shared expert of width 512 (`expert_ffn_dim` here, the same in the config); untied
        // head over 248,320 tokens. No dense FFN (`ffn_dim` 0, as in the GGUF files).
        "qwen3.6-35b-a3b" | "qwen3.5-35b-a3b" => ModelConfig {
            hybrid: Some(qwen35_linear(40, 32)),
            moe: Some(MoeConfig { shared_ffn_dim: Some(512), ..all_sparse(256, 8, 512, 40) }),
            ..c(a("qwen35moe")?, 40, 2048, 0, 16, 2, 256, 248_320, 1e7, 1e-6, false)
        },
        // Qwen3.5-27B (= Qwen3.6-27B's topology; model cards): 64 layers, every 4th full
        // attention (24 query / 4 KV heads of 256, output gate, 64 rotated dims, theta 1e7), the
        // others Gated DeltaNet (16 key heads and 48 value heads of 128); dense FFN 17,408;
        // untied head over 248,320 tokens.
        "qwen3.5-27b" | "qwen3.6-27b" => ModelConfig {
            hybrid: Some(qwen35_linear(64, 48)),
            ..c(a("qwen35")?, 64, 5120, 17408, 24, 4, 256, 248_320, 1e7, 1e-6, false)
        },
        _ => return None,
    })
}

/// Every layer sparse: `n_experts` experts of width `expert_ffn_dim`, `n_used` per token, the
/// chosen weights renormalized (`norm_topk_prob`, true in the Qwen3 shapes), no shared expert.
fn all_sparse(n_experts: usize, n_used: usize, expert_ffn_dim: usize, n_layers: usize) -> MoeConfig {
    MoeConfig {
        n_experts,
        n_used,
        expert_ffn_dim,
        norm_topk_prob: true,
        shared_ffn_dim: None,
        sparse_layers: vec![true; n_layers],
    }
}

/// The Qwen3.5 layer plan of `n_layers`: every 4th full attention (output gate, 64 rotated
/// dims), the others Gated DeltaNet with 16 key heads and `n_v_heads` value heads of 128, conv
/// kernel 4 (32 value heads in the 9B and the 35B-A3B, 48 in the 27B).
fn qwen35_linear(n_layers: usize, n_v_heads: usize) -> HybridConfig {
    HybridConfig {
        recurrent: (0..n_layers).map(|i| (i + 1) % 4 != 0).collect(),
        n_k_heads: 16,
        n_v_heads,
        d_k: 128,
        d_v: 128,
        conv_kernel: 4,
        grouping: HeadGrouping::Tiled,
        rotary_dim: 64,
        attn_output_gate: true,
    }
}

impl ModelConfig {
    /// Parameters of the matrices a decode step reads in full (everything but the embedding
    /// table, of which one row is read; the output head counts even when tied). A sparse layer
    /// counts its router, the `n_used` experts one token reads and the shared expert (with its
    /// gate row) when it has one.
    pub fn decode_matrix_params(&self) -> u64 {
        let attn = self.dim * (self.q_dim() + 2 * self.kv_dim()) + self.q_dim() * self.dim;
        let ffn = |layer: usize| match &self.moe {
            Some(m) if m.is_sparse(layer) => {
                let shared = m.shared_ffn_dim.map_or(0, |sf| 3 * self.dim * sf + self.dim);
                m.n_experts * self.dim + m.n_used * 3 * self.dim * m.expert_ffn_dim + shared
            }
            _ => 3 * self.dim * self.ffn_dim,
        };
        ((0..self.n_layers).map(|l| attn + ffn(l)).sum::<usize>() + self.vocab_size * self.dim) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::{attention_shape, AttnField};
    use super::*;

    #[test]
    fn qwen3_30b_a3b_reads_about_3b_parameters_per_token() {
        let c = shape("qwen3-30b-a3b").unwrap();
        // Per layer: attention 2048 x (4096 + 2 x 512) + 4096 x 2048 = 18.87M, router 0.26M,
        // 8 experts x 3 x 2048 x 768 = 37.75M; x 48, plus the 311M output head: 3.05B.
        let p = c.decode_matrix_params();
        assert_eq!(p, 48 * (18_874_368 + 262_144 + 37_748_736) + 151_936 * 2048);
        assert!((3.0e9..3.1e9).contains(&(p as f64)), "{p}");
        // The dense shapes are unchanged by the MoE term.
        let d = shape("qwen3-8b").unwrap();
        assert_eq!(d.decode_matrix_params(), 36 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 12288) + 151_936 * 4096u64);
    }

    #[test]
    fn qwen2_57b_a14b_reads_its_shared_expert_and_about_14b_parameters_per_token() {
        let c = shape("qwen2-57b-a14b").unwrap();
        let m = c.moe.as_ref().unwrap();
        assert_eq!(
            (m.n_experts, m.n_used, m.expert_ffn_dim, m.shared_ffn_dim, m.norm_topk_prob),
            (64, 8, 2560, Some(20480), false)
        );
        // Per layer: attention 3584 x (3584 + 2 x 512) + 3584 x 3584 = 29.36M, router 0.23M,
        // 8 experts x 3 x 3584 x 2560 = 220.2M, shared expert 3 x 3584 x 20480 + 3584 = 220.2M;
        // x 28, plus the 545M output head: 13.7B (the "A14B" counts the embedding row too).
        let p = c.decode_matrix_params();
        assert_eq!(p, 28 * (29_360_128 + 229_376 + 220_200_960 + 220_204_544) + 151_936 * 3584);
        assert!((13.5e9..14.0e9).contains(&(p as f64)), "{p}");
        assert!(c.layer_kinds().iter().all(|k| k.has_shared_expert() && k.has_kv()));
    }

    #[test]
    fn every_shape_keeps_the_attention_rules_the_loaders_check() {
        for name in SHAPES {
            let c = shape(name).unwrap();
            let named = |f: AttnField| format!("{f:?}");
            let hd = attention_shape(c.dim, c.n_heads, c.n_kv_heads, Some(c.head_dim), &named);
            assert_eq!(hd, Ok(c.head_dim), "{name}");
        }
    }

    #[test]
    fn qwen35_shapes_put_full_attention_at_every_fourth_layer() {
        for (name, layers, sparse) in [("qwen3.5-9b", 32, 0), ("qwen3.6-35b-a3b", 40, 40)] {
            let c = shape(name).unwrap();
            let h = c.hybrid.as_ref().unwrap();
            assert_eq!((c.n_layers, h.recurrent.len()), (layers, layers), "{name}");
            let full: Vec<usize> = (0..layers).filter(|&i| !h.recurrent[i]).collect();
            assert_eq!(full, (3..layers).step_by(4).collect::<Vec<_>>(), "{name}");
            assert_eq!((h.n_k_heads, h.n_v_heads, h.d_k, h.d_v, h.rotary_dim), (16, 32, 128, 128, 64), "{name}");
            let n_sparse = c.moe.as_ref().map_or(0, |m| (0..layers).filter(|&i| m.is_sparse(i)).count());
            assert_eq!(n_sparse, sparse, "{name}");
        }
    }
}
