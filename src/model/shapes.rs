//! Real architectures' shapes, for synthetic (random-weight) models: benchmarks and tests can
//! check a machine before the weights arrive.

use super::config::{Arch, ModelConfig, RopeScaling, RopeStyle};

/// Names accepted by `--synthetic`.
pub const SHAPES: &[&str] = &["qwen3-8b", "qwen2.5-7b", "llama3-8b", "smollm2-135m", "qwen3-0.6b"];

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
            rope_style: if arch == Arch::Llama { RopeStyle::Adjacent } else { RopeStyle::Halves },
            rope_scaling: RopeScaling::None,
            max_context: 32768,
            tied_embeddings: tied,
            hybrid: None,
        }
    }
    Some(match name {
        "qwen3-8b" => c(Arch::Qwen3, 36, 4096, 12288, 32, 8, 128, 151_936, 1e6, 1e-6, false),
        "qwen3-0.6b" => c(Arch::Qwen3, 28, 1024, 3072, 16, 8, 128, 151_936, 1e6, 1e-6, true),
        "qwen2.5-7b" => c(Arch::Qwen2, 28, 3584, 18944, 28, 4, 128, 152_064, 1e6, 1e-6, false),
        "llama3-8b" => c(Arch::Llama, 32, 4096, 14336, 32, 8, 128, 128_256, 5e5, 1e-5, false),
        "smollm2-135m" => c(Arch::Llama, 30, 576, 1536, 9, 3, 64, 49_152, 1e5, 1e-5, true),
        _ => return None,
    })
}

impl ModelConfig {
    /// Parameters of the matrices a decode step reads in full (everything but the embedding
    /// table, of which one row is read; the output head counts even when tied).
    pub fn decode_matrix_params(&self) -> u64 {
        let per_layer =
            self.dim * (self.q_dim() + 2 * self.kv_dim()) + self.q_dim() * self.dim + 3 * self.dim * self.ffn_dim;
        (self.n_layers * per_layer + self.vocab_size * self.dim) as u64
    }
}
