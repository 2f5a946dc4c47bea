//! Random-weight models of a given shape (see `shapes`): for benchmarks and tests before real
//! weights arrive. Values are small and centred, like trained weights, at the scales of
//! `synth_scale` (the token embedding and the attention output their own); norms are 1.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::config::ModelConfig;
use super::moe::{Expert, MoeWeights, SharedExpert};
use super::quant::{quantize_row, GgmlType};
use super::synth_scale::scale_of;
use super::weights::{LayerWeights, ModelWeights, Tensor};

/// A random `[rows, cols]` matrix of a model of `layers` layers: uniform in +-sqrt(3/cols)
/// (unit-variance outputs for unit-variance inputs), the token embedding and the attention
/// output at their own scales (`synth_scale`: what spreads tokens over the experts).
fn matrix(name: &str, rows: usize, cols: usize, dtype: GgmlType, layers: usize, rng: &mut StdRng) -> Tensor {
    let a = scale_of(name, layers).amplitude(cols);
    let mut bytes = Vec::with_capacity(dtype.row_bytes(cols).unwrap_or(0) * rows);
    let mut row = vec![0f32; cols];
    for _ in 0..rows {
        row.iter_mut().for_each(|v| *v = rng.random_range(-a..a));
        bytes.extend(quantize_row(dtype, &row));
    }
    Tensor::from_bytes(name, dtype, rows, cols, bytes)
}

/// A model of shape `c` with random weights of type `dtype` (norms and biases in f32).
pub fn random_weights(c: &ModelConfig, dtype: GgmlType, seed: u64) -> ModelWeights {
    let mut rng = StdRng::seed_from_u64(seed);
    let ones = |n: usize| vec![1.0f32; n];
    let family = c.arch.family();
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        let bias = |rng: &mut StdRng, k: usize| {
            family.attention.qkv_bias.then(|| (0..k).map(|_| rng.random_range(-0.1..0.1)).collect())
        };
        let bq = bias(&mut rng, c.q_dim());
        let bk = bias(&mut rng, c.kv_dim());
        let bv = bias(&mut rng, c.kv_dim());
        let qk = family.attention.qk_norm;
        let (wq, wk, wv, wo) = (
            matrix(&n("attn_q.weight"), c.q_dim(), c.dim, dtype, c.n_layers, &mut rng),
            matrix(&n("attn_k.weight"), c.kv_dim(), c.dim, dtype, c.n_layers, &mut rng),
            matrix(&n("attn_v.weight"), c.kv_dim(), c.dim, dtype, c.n_layers, &mut rng),
            matrix(&n("attn_output.weight"), c.dim, c.q_dim(), dtype, c.n_layers, &mut rng),
        );
        // A random router (uniform like every matrix) spreads tokens over the experts as in
        // real use; it stays F32 as in GGUF files.
        let moe = match &c.moe {
            Some(m) if m.is_sparse(i) => {
                let router = matrix(&n("ffn_gate_inp.weight"), m.n_experts, c.dim, GgmlType::F32, c.n_layers, &mut rng);
                let f = m.expert_ffn_dim;
                let experts = (0..m.n_experts)
                    .map(|e| Expert {
                        gate: matrix(&n(&format!("ffn_gate_exps.weight[{e}]")), f, c.dim, dtype, c.n_layers, &mut rng),
                        up: matrix(&n(&format!("ffn_up_exps.weight[{e}]")), f, c.dim, dtype, c.n_layers, &mut rng),
                        down: matrix(&n(&format!("ffn_down_exps.weight[{e}]")), c.dim, f, dtype, c.n_layers, &mut rng),
                    })
                    .collect();
                // The shared expert (Qwen2-MoE), its gate row F32 like the router.
                let shared = m.shared_ffn_dim.map(|sf| {
                    let expert = Expert {
                        gate: matrix(&n("ffn_gate_shexp.weight"), sf, c.dim, dtype, c.n_layers, &mut rng),
                        up: matrix(&n("ffn_up_shexp.weight"), sf, c.dim, dtype, c.n_layers, &mut rng),
                        down: matrix(&n("ffn_down_shexp.weight"), c.dim, sf, dtype, c.n_layers, &mut rng),
                    };
                    let gate = matrix(&n("ffn_gate_inp_shexp.weight"), 1, c.dim, GgmlType::F32, c.n_layers, &mut rng);
                    SharedExpert { expert, gate }
                });
                Some(MoeWeights { router, experts, n_used: m.n_used, norm_topk_prob: m.norm_topk_prob, shared })
            }
            _ => None,
        };
        let (w_gate, w_up, w_down) = match moe {
            Some(_) => LayerWeights::empty_dense_ffn(i, c),
            None => (
                matrix(&n("ffn_gate.weight"), c.ffn_dim, c.dim, dtype, c.n_layers, &mut rng),
                matrix(&n("ffn_up.weight"), c.ffn_dim, c.dim, dtype, c.n_layers, &mut rng),
                matrix(&n("ffn_down.weight"), c.dim, c.ffn_dim, dtype, c.n_layers, &mut rng),
            ),
        };
        layers.push(LayerWeights {
            attn_norm: ones(c.dim),
            wq,
            wk,
            wv,
            wo,
            bq,
            bk,
            bv,
            q_norm: qk.then(|| ones(c.head_dim)),
            k_norm: qk.then(|| ones(c.head_dim)),
            ffn_norm: ones(c.dim),
            w_gate,
            w_up,
            w_down,
            moe,
            hybrid: None,
        });
    }
    let token_embd = matrix("token_embd.weight", c.vocab_size, c.dim, dtype, c.n_layers, &mut rng);
    let output = if c.tied_embeddings {
        token_embd.clone()
    } else {
        matrix("output.weight", c.vocab_size, c.dim, dtype, c.n_layers, &mut rng)
    };
    ModelWeights { token_embd, layers, output_norm: ones(c.dim), output, rope_freq_factors: None }
}
