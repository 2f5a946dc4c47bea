//! Every kernel compiles for compute_70 (V100) with NVRTC 12.x, the PTX declares ISA 7.0 (every
//! driver from CUDA 11.0 up loads it) and uses no feature beyond it, and holds no sm_75+
//! instruction. No GPU needed. NVRTC 12 comes from the PyPI wheel (see ../shared/GPU.md):
//! `LD_LIBRARY_PATH=$HOME/.cache/nvrtc12/nvidia/cuda_nvrtc/lib cargo test --release --test kernels_compute70`.
//! Outside CI a missing NVRTC 12 skips with a notice; with `CI` set it fails.

use std::path::PathBuf;

use dustoff::backend::cuda::compile::kernels::{file_of, KERNEL_FILES};
use dustoff::backend::cuda::compile::model_entries::ModelEntries;
use dustoff::backend::cuda::compile::nvrtc::KernelFile;
use dustoff::backend::cuda::compile::{nvrtc, prune, ptx_isa};
use dustoff::backend::cuda::CudaError;
use dustoff::model::quant::GgmlType;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Whether an NVRTC 12 is loaded; skips (outside CI) or fails (in CI) otherwise.
fn nvrtc12() -> bool {
    let why = match nvrtc::nvrtc_version("compute_70") {
        Ok((12, _)) => return true,
        Ok((major, minor)) => format!("NVRTC {major}.{minor} is chosen for compute_70; this test wants NVRTC 12.x"),
        Err(e) => e.to_string(),
    };
    let hint = "install it: see ../shared/GPU.md, 'NVRTC 12 for compute_70', and set LD_LIBRARY_PATH";
    assert!(!in_ci(), "CI is set and {why}; {hint}");
    eprintln!("SKIPPED (no NVRTC 12): {why}; {hint}");
    false
}

fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dustoff-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn every_kernel_compiles_for_compute70_without_sm75_instructions() {
    if !nvrtc12() {
        return;
    }
    let mut failures = Vec::new();
    for f in KERNEL_FILES {
        match nvrtc::compile(f.name, &nvrtc::full_source(f), "compute_70") {
            Err(e) => failures.push(e.to_string()),
            Ok(ptx) => {
                if let Err(e) = nvrtc::check_sm70_ptx(&ptx) {
                    failures.push(format!("{}.cu: {e}", f.name));
                }
                // Every driver from CUDA 11.0 loads it: ISA 7.0 declared, no feature beyond it.
                if ptx_isa::declared(&ptx) != Ok(ptx_isa::V100_ISA) {
                    failures.push(format!("{}.cu: declares {:?}, not ISA 7.0", f.name, ptx_isa::declared(&ptx)));
                }
                if let Err(e) = ptx_isa::check(&ptx, ptx_isa::V100_ISA) {
                    failures.push(format!("{}.cu: {e}", f.name));
                }
                if !nvrtc::ptx_defines_all(&ptx, f) {
                    failures.push(format!("{}.cu: PTX lacks one of {:?}", f.name, f.entries));
                }
                if let Err(e) = quantized_entries_and_loads(f.name, &ptx) {
                    failures.push(e);
                }
                if let Err(e) = moe_entries_and_loads(f.name, &ptx) {
                    failures.push(e);
                }
                if let Err(e) = cut_to_a_models_formats(f, &ptx) {
                    failures.push(e);
                }
                // The hot kernels must keep their arrays in registers (local memory = spills);
                // argmax.cu holds the greedy choice of every decode step, masked or not.
                let hot = [
                    "gemv_f16",
                    "gemv_quant",
                    "gemv_q8",
                    "gemm_quant",
                    "dequant",
                    "attention_decode",
                    "attention_merge",
                    "argmax",
                    "moe",
                    "deltanet",
                    "hybrid_attn",
                    "fused_norm",
                ];
                if hot.contains(&f.name) && ptx.contains(".local") {
                    failures.push(format!("{}.cu: uses local memory", f.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The quantized GEMV and dequantization read the packed blocks with 16-byte loads, and every
/// block format has its GEMV (1 and 8 tokens, plain and SwiGLU), dequantization and embedding
/// entry (checked on the PTX the test above compiled).
fn quantized_entries_and_loads(file: &str, ptx: &str) -> Result<(), String> {
    if !["gemv_quant", "gemv_q8", "gemm_quant", "dequant"].contains(&file) {
        return Ok(());
    }
    if !ptx.contains("ld.global.nc.v4.u32") {
        return Err(format!("{file}.cu: no 128-bit read-only loads"));
    }
    for fmt in dustoff::backend::cuda::qformat::QFormat::all() {
        let name = fmt.dtype.name().to_ascii_lowercase();
        let want = if file == "gemv_quant" {
            vec![
                format!("gemv_{name}_n1"),
                format!("gemv_{name}_n8"),
                format!("gemv_swiglu_{name}_n1"),
                format!("gemv_swiglu_{name}_n8"),
            ]
        } else if file == "gemm_quant" {
            vec![
                "splitk_reduce_q".to_string(),
                format!("gemmq_{name}_t16"),
                format!("gemmq_{name}_t64"),
                format!("gemmq_{name}_w128"),
            ]
        } else if file == "gemv_q8" {
            vec![
                "quantize_x_q8".to_string(),
                format!("gemvq8_{name}_n1"),
                format!("gemvq8_{name}_n8"),
                format!("gemvq8_swiglu_{name}_n1"),
                format!("gemvq8_swiglu_{name}_n8"),
            ]
        } else {
            vec![format!("dequant_{name}_f16"), format!("embedding_{name}")]
        };
        if let Some(e) = want.iter().find(|e| !ptx.contains(&format!(".entry {e}("))) {
            return Err(format!("{file}.cu: no entry {e}"));
        }
    }
    Ok(())
}

/// The mixture-of-experts kernels: every packed format (and F16) has its gate/up and down
/// entries in both walks, beside the router, grouping and weighted sum; weights are read with
/// 16-byte loads.
fn moe_entries_and_loads(file: &str, ptx: &str) -> Result<(), String> {
    if file != "moe" {
        return Ok(());
    }
    if !ptx.contains("ld.global.nc.v4.u32") {
        return Err("moe.cu: no 128-bit read-only loads".into());
    }
    let mut names: Vec<String> = dustoff::backend::cuda::qformat::QFormat::all()
        .iter()
        .map(|f| f.dtype.name().to_ascii_lowercase())
        .chain(["f16".to_string()])
        .flat_map(|n| ["gate_up", "down"].map(|k| ["p", "g"].map(|w| format!("moe_{k}_{n}_{w}"))).concat())
        .collect();
    names.extend(
        ["moe_router_logits_f32", "moe_router_logits_tile_f32", "moe_route_f32", "moe_group", "moe_combine_f32"]
            .map(String::from),
    );
    match names.iter().find(|e| !ptx.contains(&format!(".entry {e}("))) {
        Some(e) => Err(format!("moe.cu: no entry {e}")),
        None => Ok(()),
    }
}

/// Cut to a Q4_K_M model's formats and a head size of 128 (Q4_K, Q6_K: what its backend loads),
/// the PTX defines the entries it keeps and no other, each byte for byte as in the whole file,
/// and keeps the header and every module-scope declaration.
fn cut_to_a_models_formats(f: &KernelFile, ptx: &str) -> Result<(), String> {
    let held = ModelEntries::new([GgmlType::Q4K, GgmlType::Q6K], 128);
    let cut = prune::keep_entries(ptx, &|e| held.keeps(e));
    // An entry's text: from its `.entry` line to the `}` that closes its body.
    let block = |text: &str, e: &str| {
        let at = text.find(&format!(".entry {e}("))?;
        let len = text[at..].find("\n}\n")?;
        Some(text[at..at + len].to_string())
    };
    for e in f.entries {
        let kept = block(&cut, e);
        if kept.is_some() != held.keeps(e) {
            return Err(format!("{}.cu cut to Q4_K + Q6_K, hd128: {e} kept {}", f.name, kept.is_some()));
        }
        if kept.is_some() && kept != block(ptx, e) {
            return Err(format!("{}.cu cut to Q4_K + Q6_K, hd128: {e} differs from the whole file's", f.name));
        }
    }
    let declarations = |text: &str| {
        let scope = [".version", ".target", ".address_size", ".extern", ".shared", ".global", ".const"];
        text.lines().filter(|l| scope.iter().any(|p| l.starts_with(p))).map(String::from).collect::<Vec<_>>()
    };
    if declarations(&cut) != declarations(ptx) {
        return Err(format!(
            "{}.cu cut to Q4_K + Q6_K, hd128: the header or a module-scope declaration changed",
            f.name
        ));
    }
    Ok(())
}

#[test]
fn gemv_uses_16_byte_weight_loads() {
    if !nvrtc12() {
        return;
    }
    let f = file_of("gemv_f16_n1").unwrap();
    let ptx = nvrtc::compile(f.name, &nvrtc::full_source(f), "compute_70").unwrap();
    assert!(ptx.contains("ld.global.nc.v4.u32"), "no 128-bit read-only loads in the GEMV PTX");
}

#[test]
fn disk_cache_stores_reuses_and_repairs() {
    if !nvrtc12() {
        return;
    }
    let dir = scratch_dir("ptx-cache");
    let f = file_of("rmsnorm_f32").unwrap();
    let first = nvrtc::compile_cached(f, "compute_70", Some(&dir)).unwrap();
    let key = nvrtc::cache_key(&nvrtc::full_source(f), "compute_70", nvrtc::nvrtc_version("compute_70").unwrap());
    let path = nvrtc::cache_path(&dir, &key);
    assert!(std::fs::read_to_string(&path).unwrap() == first, "the cache file holds the compiled PTX");

    // A hit returns the file's content (marked here so that a recompilation would show).
    let marked = format!("// from cache\n{first}");
    std::fs::write(&path, &marked).unwrap();
    assert!(nvrtc::compile_cached(f, "compute_70", Some(&dir)).unwrap() == marked, "a hit returns the cached file");

    // A truncated file is a miss: recompiled and rewritten.
    std::fs::write(&path, &first[..first.len() / 3]).unwrap();
    assert!(nvrtc::compile_cached(f, "compute_70", Some(&dir)).unwrap() == first, "a truncated file is recompiled");
    assert!(std::fs::read_to_string(&path).unwrap() == first, "and rewritten");

    // Another architecture is another key.
    let other = nvrtc::cache_key(&nvrtc::full_source(f), "compute_80", nvrtc::nvrtc_version("compute_70").unwrap());
    assert_ne!(key, other);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_kernel_that_does_not_compile_names_the_file_and_keeps_the_log() {
    if !nvrtc12() {
        return;
    }
    let src = "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_helper(); }";
    match nvrtc::compile("broken", src, "compute_70") {
        Err(CudaError::Compile { file, arch, log }) => {
            assert_eq!((file.as_str(), arch.as_str()), ("broken", "compute_70"));
            assert!(log.contains("undefined_helper"), "log: {log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}
