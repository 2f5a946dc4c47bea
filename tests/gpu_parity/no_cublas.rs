//! A server with only the NVIDIA driver has no libcublas: prefill-sized products then run on
//! dustoff's tensor-core GEMM in slices of 64 tokens (`CudaOptions::cublas = false`, what
//! `DUSTOFF_CUBLAS=0` or a missing library gives). The whole backend that way against the CPU
//! backend and against itself with cuBLAS.

use super::*;

/// Random SmolLM2-shaped weights, F16 and Q8_0 (Q8_0 is widened to F16 for steps past 64
/// tokens, the same product): a 150-token prompt (slices of 64, 64 and 22 tokens) and 8 greedy
/// decode steps give the CPU's logits within the GPU tolerance, and cuBLAS's.
#[test]
fn prefill_without_cublas_matches_cpu_and_cublas() {
    let Some(g) = gpu("no cublas") else { return };
    drop(g);
    let cfg = dustoff::model::shapes::shape("smollm2-135m").unwrap();
    let prompt: Vec<u32> = (0..150).map(|i| 300 + i * 211 % 40_000).collect();
    for (dtype, seed, op) in [(GgmlType::F16, 11, "cuda_vs_cpu_logits"), (GgmlType::Q8_0, 12, "cuda_vs_cpu_q8_logits")]
    {
        let w = dustoff::model::synth::random_weights(&cfg, dtype, seed);
        let without = CudaOptions { cublas: false, ..opts(16) };
        let mut own = CudaBackend::new(cfg.clone(), &w, &without).expect("CUDA backend without cuBLAS");
        let mut blas = CudaBackend::new(cfg.clone(), &w, &opts(16)).expect("CUDA backend with cuBLAS");
        let mut cpu = dustoff::backend::cpu::CpuBackend::new(cfg.clone(), w, 16, 16);
        let got = run_greedy(&mut own, &prompt, 8);
        let with_blas = run_greedy(&mut blas, &prompt, 8);
        let want = run_greedy(&mut cpu, &prompt, 8);
        assert_eq!(got.len(), want.len());
        for (i, ((a, b), c)) in got.iter().zip(&with_blas).zip(&want).enumerate() {
            compare(op, seed * 100 + i as u64, a, c);
            compare("no_cublas_vs_cublas", seed * 100 + i as u64, a, b);
        }
    }
}
