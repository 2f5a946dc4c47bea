//! `dustoff kernels --arch ARCH --out DIR`: compiles every kernel file for ARCH with the NVRTC
//! found at run time and writes `<DIR>/<file>.ptx` (for CI, and to take compute_70 PTX to a GPU
//! machine that has no NVRTC 12). PTX for compute_70 declares the V100 ISA (7.0: every driver
//! from CUDA 11.0 up loads it; `ptx_isa` checks every feature against it) and is checked for
//! sm_75+ instructions.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::backend::cuda::compile::kernels::KERNEL_FILES;
use crate::backend::cuda::compile::nvrtc;

/// Compiles every kernel file for `arch` (e.g. `compute_70`) into `out_dir`; returns the files
/// written, in `KERNEL_FILES` order.
pub fn compile_all(arch: &str, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let usage = |m: String| anyhow::Error::new(crate::job::exit::UsageError::new(m));
    if !arch.strip_prefix("compute_").is_some_and(|n| n.len() >= 2 && n.bytes().all(|b| b.is_ascii_digit())) {
        return Err(usage(format!("architecture '{arch}': expected compute_XY (e.g. compute_70)")));
    }
    // The loader's own message offers --ptx-dir, which is what this command makes.
    let (major, minor) = nvrtc::nvrtc_version(arch).map_err(|e| match e {
        crate::backend::cuda::CudaError::NvrtcMissing => anyhow::anyhow!(
            "kernels compiles with NVRTC, and no NVRTC library could be loaded: put libnvrtc on LD_LIBRARY_PATH or name it in DUSTOFF_NVRTC (NVRTC 11.x or 12.x for compute_70; scripts/nvrtc12.sh fetches one)"
        ),
        e => e.into(),
    })?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    // One thread per file: NVRTC is thread-safe, and the largest files dominate the time.
    let compiled: Vec<Result<String>> = std::thread::scope(|s| {
        let jobs: Vec<_> = KERNEL_FILES
            .iter()
            .map(|f| s.spawn(move || Ok(nvrtc::compile(f.name, &nvrtc::full_source(f), arch)?)))
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a compile thread panicked"))))
            .collect()
    });
    let mut written = Vec::new();
    for (f, ptx) in KERNEL_FILES.iter().zip(compiled) {
        // An architecture this NVRTC does not know (compute_99, or compute_70 on NVRTC 13) is
        // the command's to change (exit 2), not a failure of the machine.
        let ptx = ptx.map_err(|e| match format!("{e:#}") {
            m if m.contains("--gpu-architecture") => {
                usage(format!("architecture '{arch}' is not one NVRTC {major}.{minor} compiles for: {m}"))
            }
            _ => e,
        })?;
        if !nvrtc::ptx_defines_all(&ptx, f) {
            bail!("{}.cu compiled for {arch} lacks some of its entry points ({})", f.name, f.entries.join(", "));
        }
        if arch == "compute_70" {
            nvrtc::check_sm70_ptx(&ptx).map_err(|e| anyhow::anyhow!("{}.cu: {e}", f.name))?;
        }
        let path = out_dir.join(format!("{}.ptx", f.name));
        std::fs::write(&path, &ptx).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    let isa = nvrtc::lowered_isa(arch).map(|i| format!(", PTX ISA {i}")).unwrap_or_default();
    eprintln!(
        "kernels: {} files compiled for {arch} with NVRTC {major}.{minor}{isa} into {}",
        written.len(),
        out_dir.display()
    );
    Ok(written)
}
