//! The CUDA activation tap (`backend::cuda::tap`, `quantize --device cuda`) against the CPU
//! backend's: the importance matrix of the sample model from the same windows, on both. Windows
//! of 1, 12 and 200 tokens take the three matmul paths of a step (GEMV, tensor-core GEMM,
//! cuBLAS), so every path's input is tapped. Then the tiny reference models with expert and
//! linear-attention layers (qwen3_moe, qwen3_5, qwen3_5_moe, qwen3_next): every block kind's
//! taps (attention, gated attention, Gated DeltaNet, dense FFN, each routed expert, the shared
//! expert) against the CPU's.

use dustoff::backend::cpu::tap::ActivationTap;
use dustoff::commands::eval::BUILTIN_TEXT;
use dustoff::quantize::calibrate::{calibrate, CalibrationDevice};
use dustoff::quantize::imatrix::{expert_of, Imatrix};

use super::{common, compare, gpu};

#[test]
fn cuda_tap_importance_matrix_matches_the_cpu_backend() {
    let Some(g) = gpu("calibration tap") else { return };
    drop(g);
    let m = common::sample_model();
    let ids = m.tokenizer.encode(BUILTIN_TEXT, false, false).unwrap();
    assert!(ids.len() >= 213, "the built-in text has {} tokens", ids.len());
    let windows = vec![ids[..1].to_vec(), ids[1..13].to_vec(), ids[13..213].to_vec()];
    let cpu = calibrate(&m, &windows, "builtin", &CalibrationDevice::Cpu).unwrap();
    let cuda = calibrate(&m, &windows, "builtin", &CalibrationDevice::Cuda { ordinal: 0, ptx_dir: None }).unwrap();
    let names = |im: &Imatrix| im.entries.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&cuda), names(&cpu), "the same matrices are tapped");
    // 7 matrices a layer and the head.
    assert_eq!(cpu.entries.len(), 7 * m.config.n_layers + 1);
    assert_eq!((cuda.tokens, cuda.chunks), (213, 3));
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for (name, e) in &cpu.entries {
        let c = &cuda.entries[name];
        assert_eq!(c.count, e.count, "{name}: rows summed");
        assert_eq!(c.count, 213, "{name}: every token of every window");
        got.extend(c.sum_sq.iter().map(|&v| v as f32));
        want.extend(e.sum_sq.iter().map(|&v| v as f32));
    }
    compare("calibration_imatrix", 0, &got, &want);
}

/// The tiny reference models of every family with expert or linear-attention layers.
const FAMILIES: &[&str] = &["qwen3_moe", "qwen3_5", "qwen3_5_moe", "qwen3_next"];

fn arch_model(arch: &str) -> dustoff::model::loader::LoadedModel {
    let p = common::arch_dir(arch).join(format!("{arch}-f16.gguf"));
    dustoff::model::loader::load_model(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn imatrix_of(t: Box<dyn ActivationTap>) -> Imatrix {
    *t.into_any().downcast::<Imatrix>().expect("an Imatrix tap")
}

/// Every matrix the CPU calibrates on the GPU too, under the same name, from as many rows, and
/// with sums of squares within `calibration_imatrix`: the text fed one token a step on both
/// (the GPU's one-token products read f32 inputs), the CPU caching K/V rounded to F16 as the GPU
/// stores them, so that no router choice flips (route_flips.rs: none does on these models then)
/// and every expert gets the same tokens on both. Each step is a decode step of one sequence:
/// attention, gated attention, the DeltaNet step form, the grouped expert walk at one token, the
/// shared expert.
#[test]
fn cuda_tap_matches_the_cpu_on_moe_and_hybrid_models_token_by_token() {
    use dustoff::backend::cpu::CpuBackend;
    use dustoff::backend::cuda::{CudaBackend, CudaTap};
    use dustoff::engine::single::SingleSeq;
    let Some(g) = gpu("calibration tap, moe and hybrid") else { return };
    drop(g);
    for arch in FAMILIES {
        let m = arch_model(arch);
        let ids = m.tokenizer.encode(BUILTIN_TEXT, false, false).unwrap();
        let ids = &ids[..ids.len().min(48)];
        let blocks = ids.len().div_ceil(16) + 1;
        let mut cpu = CpuBackend::new(m.config.clone(), m.weights.clone(), blocks, 16).with_rounded_f16_cache();
        cpu.set_tap(Box::new(Imatrix::default()));
        let mut gpu_b = CudaBackend::new(m.config.clone(), &m.weights, &super::opts(blocks)).expect("CUDA backend");
        gpu_b.set_tap(CudaTap::new(Box::new(Imatrix::default()), &m.weights));
        let mut seqs =
            (SingleSeq::new(&cpu, 0, ids.len() + 1).unwrap(), SingleSeq::new(&gpu_b, 0, ids.len() + 1).unwrap());
        for &t in ids {
            seqs.0.feed(&mut cpu, &[t]).unwrap();
            seqs.1.feed(&mut gpu_b, &[t]).unwrap();
        }
        let want = imatrix_of(cpu.take_tap().unwrap());
        let got = imatrix_of(gpu_b.take_tap().unwrap().into_inner());
        let names = |im: &Imatrix| im.entries.keys().cloned().collect::<Vec<_>>();
        assert_eq!(names(&got), names(&want), "{arch}: the same matrices are tapped");
        // Every matrix of the model but the embedding: the experts with tokens (a random tiny
        // model routes 48 tokens to most of them).
        assert!(want.entries.keys().any(|n| n.contains("_exps.weight[")) == m.config.moe.is_some(), "{arch}");
        let (mut g_all, mut w_all) = (Vec::new(), Vec::new());
        for (name, e) in &want.entries {
            let c = &got.entries[name];
            assert_eq!(c.count, e.count, "{arch} {name}: rows summed");
            g_all.extend(c.sum_sq.iter().map(|&v| v as f32));
            w_all.extend(e.sum_sq.iter().map(|&v| v as f32));
        }
        eprintln!("{arch}: {} matrices tapped alike", want.entries.len());
        compare("calibration_imatrix", 0, &g_all, &w_all);
    }
}

/// `quantize --device cuda`'s calibration (`calibrate`) of the same models through prompt
/// chunks of 1, 12 and 100 tokens (the tapped grouped expert walk and the chunked DeltaNet
/// form at many tokens): the same matrices outside the experts from the same rows, every
/// routed row of every token reported to some expert of the layer (k per token), and the
/// inputs of layer 0 (before any router, so before any choice can flip) within
/// `calibration_imatrix`. Expert by expert the counts may differ where a near-tied choice flips
/// under the GPU's F16 rounding of chunk inputs (route_flips.rs); the test above pins them.
#[test]
fn cuda_calibration_of_moe_and_hybrid_models_covers_every_matrix() {
    let Some(g) = gpu("calibration, moe and hybrid, prompt chunks") else { return };
    drop(g);
    for arch in FAMILIES {
        let m = arch_model(arch);
        let ids = m.tokenizer.encode(BUILTIN_TEXT, false, false).unwrap();
        assert!(ids.len() >= 113, "{arch}: the built-in text has {} tokens", ids.len());
        let windows = vec![ids[..1].to_vec(), ids[1..13].to_vec(), ids[13..113].to_vec()];
        let cpu = calibrate(&m, &windows, "builtin", &CalibrationDevice::Cpu).unwrap();
        let cuda = calibrate(&m, &windows, "builtin", &CalibrationDevice::Cuda { ordinal: 0, ptx_dir: None }).unwrap();
        assert_eq!((cuda.tokens, cuda.chunks), (113, 3), "{arch}");
        let plain = |im: &Imatrix| -> Vec<(String, u64)> {
            im.entries.iter().filter(|(n, _)| expert_of(n).is_none()).map(|(n, e)| (n.clone(), e.count)).collect()
        };
        assert_eq!(plain(&cuda), plain(&cpu), "{arch}: the same matrices outside the experts, from the same rows");
        let k = m.config.moe.as_ref().map_or(0, |x| x.n_used) as u64;
        let expert_rows = |im: &Imatrix, base: &str| -> u64 {
            im.entries.iter().filter(|(n, _)| expert_of(n).is_some_and(|(b, _)| b == base)).map(|(_, e)| e.count).sum()
        };
        for l in 0..m.config.n_layers {
            if !m.config.moe.as_ref().is_some_and(|x| x.is_sparse(l)) {
                continue;
            }
            for p in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
                let base = format!("blk.{l}.{p}.weight");
                assert_eq!(expert_rows(&cuda, &base), 113 * k, "{arch} {base}: k rows a token");
                assert_eq!(expert_rows(&cpu, &base), 113 * k, "{arch} {base}");
            }
        }
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (name, e) in cpu.entries.iter().filter(|(n, _)| n.starts_with("blk.0.") && expert_of(n).is_none()) {
            if name.contains("_shexp") || name.contains("ffn_down") {
                continue; // after layer 0's router (behind a possible flip only for ffn_down_exps)
            }
            got.extend(cuda.entries[name].sum_sq.iter().map(|&v| v as f32));
            want.extend(e.sum_sq.iter().map(|&v| v as f32));
        }
        assert!(!want.is_empty(), "{arch}: layer 0 tapped");
        compare("calibration_imatrix", 1, &got, &want);
    }
}
