//! The CUDA activation tap (`backend::cuda::tap`, `quantize --device cuda`) against the CPU
//! backend's: the importance matrix of the sample model from the same windows, on both. Windows
//! of 1, 12 and 200 tokens take the three matmul paths of a step (GEMV, tensor-core GEMM,
//! cuBLAS), so every path's input is tapped.

use dustoff::commands::eval::BUILTIN_TEXT;
use dustoff::quantize::calibrate::{calibrate, CalibrationDevice};

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
    let names = |im: &dustoff::quantize::imatrix::Imatrix| im.entries.keys().cloned().collect::<Vec<_>>();
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
