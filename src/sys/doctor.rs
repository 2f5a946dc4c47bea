//! `dustoff doctor`: what this machine offers dustoff, what is missing and how to fix it.
//!
//! "Usable" (and the exit code): the CPU backend is always usable (every CPU runs at least the
//! scalar kernels); a GPU is usable when its context opens and kernels can be had for it (PTX
//! from `--ptx-dir`, or an NVRTC that targets its architecture and writes PTX the driver
//! accepts). Doctor fails (exit 1) when the device `--device auto` would pick is not usable (a
//! GPU is present but cannot run dustoff), with `--require-gpu` when no GPU is usable, or when
//! the `--model` it is given cannot be read.

use std::time::Instant;

use super::cpu::{CpuFeatures, CpuPath};
use super::doctor_report::shown;
use super::gpu::{ptx_isa_for_driver, GpuInfo};
use super::gpu_links::{tensor_parallel_warning, GpuAt};
use super::nvrtc_scan::{can_target, scan_nvrtc};
use super::threads::{plan, Placement};
use super::topology::{pci_numa_node, Topology};
use crate::backend::cuda::compile::nvrtc;
use crate::backend::cuda::device::CudaDevice;
use crate::job::exit::ExitCode;

pub use super::doctor_report::{
    CpuReport, CudaReport, DevicePlan, DoctorOptions, GpuReport, ModelReport, NvrtcChoice, NvrtcReport, Report,
    GPU_DECODE_SHARE, NVRTC12_HINT,
};

fn meminfo(key: &str) -> Option<u64> {
    super::host_memory::meminfo_field(&std::fs::read_to_string("/proc/meminfo").ok()?, key)
}

fn cpu_model_name() -> String {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Parallel copy of 2 x 128 MiB on the rayon pool: bytes read + written per second / 1e9.
fn host_copy_bandwidth() -> f64 {
    use rayon::prelude::*;
    const N: usize = 128 << 20;
    let src = vec![1u8; N];
    let mut dst = vec![0u8; N];
    let mut times = Vec::new();
    for _ in 0..4 {
        let t = Instant::now();
        dst.par_chunks_mut(1 << 20).zip(src.par_chunks(1 << 20)).for_each(|(d, s)| d.copy_from_slice(s));
        times.push(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    times.remove(0);
    times.sort_by(f64::total_cmp);
    2.0 * N as f64 / times[times.len() / 2] / 1e9
}

fn bandwidth_hint(name: &str, gb_s: f64) -> Option<String> {
    let n = name.to_ascii_uppercase();
    if !n.contains("V100") {
        return None;
    }
    let (kind, lo, hi) = if n.contains("PCIE") { ("PCIe", 700.0, 800.0) } else { ("SXM2", 850.0, 900.0) };
    let verdict = if gb_s < 0.85 * lo {
        "low: check clocks (nvidia-smi -q -d CLOCK), other processes and ECC errors"
    } else {
        "as expected"
    };
    Some(format!("a V100 {kind} copies at ~{lo:.0}-{hi:.0} GB/s; {gb_s:.0} GB/s is {verdict}"))
}

const PROBE: &str = "extern \"C\" __global__ void dustoff_probe(float* x) { x[threadIdx.x] = 1.0f; }\n";

fn probe(arch: &str) -> bool {
    nvrtc::compile("dustoff_probe.cu", PROBE, arch).is_ok()
}

/// The NVRTC for `arch`, its PTX ISA and whether it compiles a probe (for a GPU of this
/// machine's architecture, or compute_70 on any machine).
fn nvrtc_choice(arch: &str, gpus: &[GpuReport]) -> NvrtcChoice {
    use crate::backend::cuda::compile::nvrtc_lib;
    match nvrtc_lib::for_arch(arch) {
        Ok((lib, reason)) => NvrtcChoice {
            arch: arch.to_string(),
            library: Ok((lib.path.display().to_string(), format!("{}.{}", lib.version.0, lib.version.1))),
            ptx_isa: Some(nvrtc_lib::output_isa(arch, lib.isa()).to_string()),
            reason,
            compiles: gpus
                .iter()
                .find(|g| g.arch == arch)
                .and_then(|g| g.nvrtc_compiles_arch)
                .or_else(|| Some(probe(arch))),
        },
        Err(e) => {
            NvrtcChoice { arch: arch.to_string(), library: Err(e.clone()), ptx_isa: None, reason: e, compiles: None }
        }
    }
}

fn gpu_report(info: GpuInfo, o: &DoctorOptions, problems: &mut Vec<String>) -> GpuReport {
    let arch = nvrtc::arch_for(info.compute_capability);
    let numa_node = info.pci_bus_id.as_deref().and_then(|b| pci_numa_node(&o.sys_root, b));
    let chosen = crate::backend::cuda::compile::nvrtc_lib::for_arch(&arch);
    let compiles = nvrtc::nvrtc_available().then(|| chosen.is_ok() && probe(&arch));
    let mut r = GpuReport {
        arch: arch.clone(),
        numa_node,
        nvrtc_compiles_arch: compiles,
        usable: false,
        copy_bandwidth_gb_s: None,
        bandwidth_hint: None,
        free_memory_bytes: None,
        error: None,
        info,
    };
    let name = format!("cuda:{} {}", r.info.ordinal, r.info.name);
    let kernels = o.ptx_dir.is_some() || compiles == Some(true);
    if !kernels {
        problems.push(match (&chosen, compiles) {
            (_, None) => format!("{name}: no NVRTC library found, so no kernels can be compiled"),
            (Err(why), _) => format!("{name}: no NVRTC here suits {arch} on this driver: {why}"),
            (Ok(_), _) => format!("{name}: the chosen NVRTC failed to compile a probe kernel for {arch}"),
        });
    }
    match CudaDevice::new(r.info.ordinal) {
        Ok(dev) => {
            r.free_memory_bytes = dev.mem_info().ok().map(|(free, _)| free as u64);
            if o.measure {
                match dev.copy_bandwidth(256 << 20, 5) {
                    Ok(bw) => {
                        r.copy_bandwidth_gb_s = Some(bw / 1e9);
                        r.bandwidth_hint = bandwidth_hint(&r.info.name, bw / 1e9);
                    }
                    Err(e) => r.error = Some(format!("copy bandwidth: {e}")),
                }
            }
            r.usable = kernels;
        }
        Err(e) => {
            problems.push(format!("{name}: {e}"));
            r.error = Some(e.to_string());
        }
    }
    r
}

/// Gathers the report (touches the GPUs and, with `measure`, times copies).
pub fn gather(o: &DoctorOptions) -> Report {
    let mut problems = Vec::new();
    let mut hints = Vec::new();
    let topo = Topology::read(&o.sys_root).unwrap_or_else(|e| {
        problems.push(format!("CPU topology: {e}"));
        Topology { cpus: Vec::new(), nodes: Vec::new() }
    });
    let path = super::cpu::cpu_path();
    let cpu = CpuReport {
        model_name: cpu_model_name(),
        sockets: topo.sockets(),
        cores: topo.cores(),
        logical_cpus: topo.cpus.len(),
        numa_nodes: topo.nodes.clone(),
        features: CpuFeatures::detect(),
        kernel_path: path.name().into(),
        kernel_path_best: CpuPath::detected().name().into(),
        memory_total_bytes: meminfo("MemTotal:"),
        // As the CPU memory plan of a run counts it (the cgroup limit included).
        memory_available_bytes: super::host_memory::available().map(|a| a.bytes),
        copy_bandwidth_gb_s: o.measure.then(host_copy_bandwidth),
    };
    if CpuPath::detected() == CpuPath::Scalar && cfg!(target_arch = "x86_64") {
        hints.push("this CPU has no AVX2+FMA: the CPU backend runs its portable (slow) kernels".into());
    }

    let driver = super::gpu::driver_version();
    let driver_isa = driver.map(ptx_isa_for_driver);
    if let Some(v) = driver.filter(|v| *v < crate::backend::cuda::device::MIN_DRIVER) {
        problems.push(format!(
            "the driver supports CUDA {}.{}; dustoff needs {} (update the NVIDIA driver)",
            v.0,
            v.1,
            crate::backend::cuda::device::SUPPORTED_DRIVERS
        ));
    }
    let infos = super::gpu::gpus();
    let gpus: Vec<GpuReport> = infos.into_iter().map(|g| gpu_report(g, o, &mut problems)).collect();
    let mut archs: Vec<String> = gpus.iter().map(|g| g.arch.clone()).collect();
    archs.push("compute_70".into());
    archs.dedup();
    archs.sort();
    archs.dedup();
    let choices: Vec<NvrtcChoice> = archs.iter().map(|a| nvrtc_choice(a, &gpus)).collect();
    let compiles_70 = choices.iter().find(|c| c.arch == "compute_70").and_then(|c| c.compiles);
    let versions: std::collections::HashMap<String, String> = crate::backend::cuda::compile::nvrtc_lib::found()
        .into_iter()
        .map(|f| (f.path.display().to_string(), f.version.map(|(a, b)| format!("{a}.{b}")).unwrap_or_else(|e| e)))
        .collect();
    let nvrtc = NvrtcReport {
        choices,
        files: scan_nvrtc()
            .into_iter()
            .map(|mut f| {
                f.loaded_version = versions.get(&f.path).cloned();
                f.targets_gpus = gpus
                    .iter()
                    .filter(|g| f.major.and_then(|m| can_target(m, g.info.compute_capability)) == Some(true))
                    .map(|g| format!("cuda:{}", g.info.ordinal))
                    .collect();
                f
            })
            .collect(),
    };
    if let Some(why) = crate::backend::cuda::compile::nvrtc_lib::env_failure() {
        problems.push(why);
    }
    let v100 = gpus.iter().any(|g| g.info.compute_capability == (7, 0));
    // A V100 without an NVRTC for it, or a GPU-less build box whose NVRTCs cannot make V100 PTX.
    if compiles_70 != Some(true) && (v100 || (gpus.is_empty() && nvrtc::nvrtc_available())) {
        hints.push(NVRTC12_HINT.into());
    }
    let at: Vec<GpuAt> = gpus
        .iter()
        .filter_map(|g| g.info.pci_bus_id.clone().map(|bus_id| GpuAt { ordinal: g.info.ordinal, bus_id }))
        .collect();
    let (links, nvlinks_active) = super::gpu_links::links(&at, &o.sys_root);
    if let Some(w) = tensor_parallel_warning(&links) {
        hints.push(format!("warning: {w}"));
    }
    let cuda = CudaReport {
        links,
        nvlinks_active,
        driver_loaded: crate::backend::cuda::device::driver_available(),
        driver_cuda_version: driver.map(|(a, b)| format!("{a}.{b}")),
        driver_ptx_isa: driver_isa.map(|(a, b)| format!("{a}.{b}")),
        supported_drivers: crate::backend::cuda::device::SUPPORTED_DRIVERS,
        cuda_visible_devices: crate::sys::env::get("CUDA_VISIBLE_DEVICES"),
        // SAFETY: only tries to dlopen the candidate library names; no cuBLAS function is called.
        cublas_loadable: unsafe { cudarc::cublas::sys::is_culib_present() },
        kernels: o.ptx_dir.as_ref().map_or_else(|| "NVRTC".to_string(), |d| format!("PTX from {}", shown(d))),
        nccl: crate::backend::cuda::tp::nccl::nccl_version().map_err(|e| e.to_string()),
        gpus,
        nvrtc,
    };

    let mut usable_devices = vec!["cpu".to_string()];
    usable_devices.extend(cuda.gpus.iter().filter(|g| g.usable).map(|g| format!("cuda:{}", g.info.ordinal)));
    // `--device auto` takes cuda:0 whenever the driver reports a device.
    let default_device = if cuda.gpus.is_empty() { "cpu".to_string() } else { "cuda:0".to_string() };
    let default_usable = usable_devices.contains(&default_device);
    if !default_usable {
        hints.push(format!("--device auto picks {default_device}, which cannot run here; --device cpu works"));
    }
    let any_gpu = usable_devices.len() > 1;
    if o.require_gpu && !any_gpu {
        problems.push("--require-gpu: no usable GPU".into());
    }
    let gpu_node = cuda.gpus.first().filter(|_| default_device != "cpu").and_then(|g| g.numa_node);
    let gpu_name = if default_device == "cpu" { "" } else { "cuda:0" };
    let threads = plan(&topo, o.numa, gpu_node, gpu_name, o.threads, super::threads::current_affinity().as_deref())
        .unwrap_or_else(|e| {
            problems.push(e.to_string());
            Placement { cpus: None, node: None, threads: 0, reason: e.to_string() }
        });
    let model = o.model.as_deref().map(|p| super::doctor_model::model_report(p, o, &cpu, &cuda, &mut problems));
    let model_unreadable = model.as_ref().is_some_and(|m| m.error.is_some());
    let failed = !default_usable || (o.require_gpu && !any_gpu) || model_unreadable;
    let exit = if failed { ExitCode::Failure } else { ExitCode::Ok };
    Report {
        version: env!("CARGO_PKG_VERSION"),
        cpu,
        threads,
        cuda,
        model,
        usable_devices,
        default_device,
        problems,
        hints,
        exit_code: exit.code(),
        exit,
    }
}
