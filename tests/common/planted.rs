//! A small Qwen3 model with a planted large activation: layer 0's FFN writes values far past
//! F16's range (|x| > 65,504) into the residual stream, as Qwen3's FFN-down does in real
//! checkpoints (llama.cpp issue 26044: NaN on a V100 where F16 cuBLAS accumulated). Built from
//! `model::synth::random_weights`; the planted matrices are written in the model's weight type.

use dustoff::model::config::ModelConfig;
use dustoff::model::quant::{quantize_row, GgmlType};
use dustoff::model::weights::{ModelWeights, Tensor};

/// Largest finite F16.
pub const F16_MAX: f64 = 65504.0;

/// Down-projection rows that sum the activation with weight `DOWN_SCALE` each.
pub const PLANTED_ROWS: usize = 8;
const DOWN_SCALE: f32 = 4.0;
/// Gate and up rows are the same vector times this: `act = silu(g) * g`, about g^2 where g > 0.
const GATE_SCALE: f32 = 10.0;

/// Qwen3 (QK norms, head size 128), 2 layers, width 512, FFN 1536, vocab 2048: every GEMM path
/// of both backends takes it (the widths are multiples of 128).
pub fn config() -> ModelConfig {
    let mut c = dustoff::model::shapes::shape("qwen3-0.6b").expect("the qwen3-0.6b shape");
    c.n_layers = 2;
    c.dim = 512;
    c.ffn_dim = 1536;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 128;
    c.vocab_size = 2048;
    c
}

fn rewrite(t: &Tensor, dtype: GgmlType, f: impl Fn(usize, &mut [f32])) -> Tensor {
    let v = t.to_f32_vec();
    let mut bytes = Vec::new();
    for (r, row) in v.chunks(t.cols).enumerate() {
        let mut row = row.to_vec();
        f(r, &mut row);
        bytes.extend(quantize_row(dtype, &row));
    }
    Tensor::from_bytes(t.name.clone(), dtype, t.rows, t.cols, bytes)
}

/// Random weights of [`config`] in `dtype` with layer 0 planted: gate = up (rows x
/// `GATE_SCALE`), so the SwiGLU activation is non-negative up to -0.28 and about g^2 (hundreds,
/// below F16's range) where g > 0; the first [`PLANTED_ROWS`] down rows are all `DOWN_SCALE`, so
/// those outputs sum ~750 such terms (~10^5 to 10^6, past F16's range) for every token.
pub fn weights(dtype: GgmlType, seed: u64) -> (ModelConfig, ModelWeights) {
    let c = config();
    let mut w = dustoff::model::synth::random_weights(&c, dtype, seed);
    let l = &mut w.layers[0];
    l.w_gate = rewrite(&l.w_gate, dtype, |_, row| row.iter_mut().for_each(|v| *v *= GATE_SCALE));
    l.w_up = l.w_gate.clone();
    l.w_up.name = l.w_up.name.replace("ffn_gate", "ffn_up");
    l.w_down = rewrite(&l.w_down, dtype, |r, row| {
        if r < PLANTED_ROWS {
            row.fill(DOWN_SCALE);
        }
    });
    (c, w)
}
