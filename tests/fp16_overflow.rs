//! FP16 overflow in batched GEMMs (issue 34): Qwen3's FFN-down writes activations past F16's
//! range in real checkpoints (llama.cpp issue 26044: NaN on a V100 at >= 64 batch tokens, where
//! cuBLAS accumulated in F16). dustoff accumulates every product in f32 and adds the FFN-down
//! output to the f32 residual stream without an F16 copy. Here the CPU backend runs a model whose
//! layer 0 writes values of ~10^5..10^6 (tests/common/planted.rs) and must match a plain f64
//! forward (tests/common/naive.rs); tests/gpu_parity/fp16_overflow.rs holds the GPU to the CPU.

mod common;

use common::naive::naive_forward;
use common::planted::{self, F16_MAX};
use dustoff::backend::cpu::CpuBackend;
use dustoff::engine::single::SingleSeq;
use dustoff::model::quant::GgmlType;

/// Largest |difference| between the CPU's and the f64 forward's logits, relative to the
/// largest |logit| (f32 sums of values up to 10^6 in the residual stream).
const TOL: f64 = 1e-4;

fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (37 + i * 101) % 2048).collect()
}

fn rel_diff(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(1f64, |m, v| m.max(v.abs()));
    got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, f64::max) / scale
}

#[test]
fn ffn_down_output_past_the_f16_range_matches_the_f64_forward_on_the_cpu() {
    for dtype in [GgmlType::F16, GgmlType::Q8_0] {
        let (c, w) = planted::weights(dtype, 17);
        let mut b = CpuBackend::new(c.clone(), w.clone(), 8, 16);
        // 12 tokens: the CPU's GEMV path; 80: its tiled prefill (and >= 64, as in the report).
        for n in [12, 80] {
            let t = tokens(n);
            let want = naive_forward(&c, &w, &t);
            // The planted case holds: the activation fits F16, the FFN-down output does not.
            assert!(want.ffn_act_max[0] < F16_MAX, "{dtype} n={n}: activation {} past F16", want.ffn_act_max[0]);
            assert!(
                want.ffn_out_max[0] > 2.0 * F16_MAX,
                "{dtype} n={n}: FFN-down output only reaches {}",
                want.ffn_out_max[0]
            );
            let prefill = SingleSeq::new(&b, 0, n).unwrap().feed(&mut b, &t).unwrap();
            assert!(prefill.iter().all(|v| v.is_finite()), "{dtype} n={n}: non-finite logits");
            let d = rel_diff(&prefill, &want.logits);
            assert!(d < TOL, "{dtype} n={n}: prefill logits differ from the f64 forward by {d:.2e} (relative)");
            // The same sequence decoded: the last 4 tokens one at a time.
            let mut seq = SingleSeq::new(&b, 0, n).unwrap();
            let mut last = seq.feed(&mut b, &t[..n - 4]).unwrap();
            for &tok in &t[n - 4..] {
                last = seq.feed(&mut b, &[tok]).unwrap();
            }
            let d = rel_diff(&last, &want.logits);
            assert!(d < TOL, "{dtype} n={n}: decoded logits differ from the f64 forward by {d:.2e} (relative)");
        }
    }
}
