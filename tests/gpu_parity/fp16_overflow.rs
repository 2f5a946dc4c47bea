//! FP16 overflow in batched GEMMs (issue 34): the planted model of tests/common/planted.rs
//! (layer 0's FFN-down output ~10^5..10^6, past F16's 65,504; its input within F16) on the GPU
//! against the CPU backend (which tests/fp16_overflow.rs holds to an f64 forward). Prefills of
//! 12 tokens (tensor-core / packed GEMM tiles) and 80 tokens (cuBLAS for F16; >= 64 as in
//! llama.cpp issue 26044), then one-token decode steps (GEMV, graphs), F16 and Q8_0 weights. Both
//! backends are fed the same tokens, so every step compares the same computation.

use dustoff::backend::cpu::CpuBackend;
use dustoff::backend::cuda::CudaBackend;
use dustoff::model::quant::GgmlType;

use super::common::planted;
use super::{compare, gpu, opts, run_steps};

#[test]
fn ffn_down_output_past_the_f16_range_matches_the_cpu() {
    let Some(g) = gpu("fp16 overflow") else { return };
    drop(g);
    let next: Vec<u32> = vec![11, 1500, 7, 640, 2047, 3];
    for (dtype, op) in [(GgmlType::F16, "cuda_vs_cpu_logits"), (GgmlType::Q8_0, "cuda_vs_cpu_q8_logits")] {
        let (c, w) = planted::weights(dtype, 17);
        let mut gb = CudaBackend::new(c.clone(), &w, &opts(8)).expect("CUDA backend");
        let mut cb = CpuBackend::new(c, w, 8, 16);
        for n in [12u32, 80] {
            let prompt: Vec<u32> = (0..n).map(|i| (37 + i * 101) % 2048).collect();
            let got = run_steps(&mut gb, &prompt, next.len(), |i, _| next[i]);
            let want = run_steps(&mut cb, &prompt, next.len(), |i, _| next[i]);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                eprintln!("{dtype} prompt {n}, step {i}:");
                compare(op, (n as u64) << 8 | i as u64, a, b);
            }
        }
    }
}
