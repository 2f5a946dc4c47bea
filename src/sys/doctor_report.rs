//! What `dustoff doctor` reports (the JSON and text forms) and its options: the types
//! `doctor` (the machine) and `doctor_model` (a model's memory plan) both fill.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::cpu::CpuFeatures;
use super::gpu::GpuInfo;
use super::gpu_links::GpuLink;
use super::nvrtc_scan::NvrtcFile;
use super::threads::{NumaMode, Placement};
use super::topology::Node;
use crate::job::exit::ExitCode;

/// How to get NVRTC 12 (the last NVRTC that targets compute_70), as scripts/nvrtc12.sh does.
pub const NVRTC12_HINT: &str = "NVRTC 13 cannot target compute_70 (V100); NVRTC 11.x or 12.x can (its PTX is \
lowered to ISA 7.0, which every driver from CUDA 11.0 loads). NVRTC 12 comes in the PyPI wheel: \
d=~/.cache/nvrtc12; python3 -m pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
nvidia-cuda-nvrtc-cu12==12.9.86 -d $d && unzip -q -o $d/nvidia_cuda_nvrtc_cu12-*.whl -d $d (scripts/nvrtc12.sh; \
dustoff finds it there, in pip's site-packages, CUDA toolkits and LD_LIBRARY_PATH, or name the file in DUSTOFF_NVRTC); \
or compile the kernels elsewhere (dustoff kernels --arch compute_70 --out DIR) and pass --ptx-dir DIR";

/// Share of the copy-bandwidth bound dustoff's one-stream decode reached on an H200
/// (183 tok/s = 66% of 4,210 GB/s, docs/BENCHMARKS.md 2026-11-29): the GPU projection.
pub const GPU_DECODE_SHARE: f64 = 0.66;

#[derive(Clone, Debug)]
pub struct DoctorOptions {
    pub sys_root: PathBuf,
    /// Model for the memory plan and the decode projection.
    pub model: Option<PathBuf>,
    /// Context per sequence and sequences for the plan.
    pub ctx: usize,
    pub slots: usize,
    pub ptx_dir: Option<PathBuf>,
    pub numa: NumaMode,
    pub threads: Option<usize>,
    /// Time copies (host and device) and, with a model, one decode GEMV pass on the CPU.
    pub measure: bool,
    pub require_gpu: bool,
}

#[derive(Debug, Serialize)]
pub struct CpuReport {
    pub model_name: String,
    pub sockets: usize,
    pub cores: usize,
    pub logical_cpus: usize,
    pub numa_nodes: Vec<Node>,
    pub features: CpuFeatures,
    /// The dot-product path the CPU backend uses (`DUSTOFF_CPU_PATH` may lower it).
    pub kernel_path: String,
    /// The best path this CPU runs.
    pub kernel_path_best: String,
    pub memory_total_bytes: Option<u64>,
    pub memory_available_bytes: Option<u64>,
    /// Parallel host memcpy, bytes read + written per second / 1e9.
    pub copy_bandwidth_gb_s: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct GpuReport {
    #[serde(flatten)]
    pub info: GpuInfo,
    pub arch: String,
    /// From `/sys/bus/pci/devices/<bus id>/numa_node`.
    pub numa_node: Option<usize>,
    /// Whether the loaded NVRTC compiled a probe kernel for `arch`.
    pub nvrtc_compiles_arch: Option<bool>,
    pub usable: bool,
    pub copy_bandwidth_gb_s: Option<f64>,
    pub bandwidth_hint: Option<String>,
    pub free_memory_bytes: Option<u64>,
    pub error: Option<String>,
}

/// The NVRTC dustoff would compile one architecture's kernels with, and why.
#[derive(Debug, Serialize)]
pub struct NvrtcChoice {
    pub arch: String,
    /// Path and version of the chosen library; `Err`: why none fits.
    pub library: Result<(String, String), String>,
    /// The PTX ISA its kernels declare (after the compute_70 lowering).
    pub ptx_isa: Option<String>,
    pub reason: String,
    /// Whether it compiled a probe kernel for `arch`.
    pub compiles: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct NvrtcReport {
    /// One choice per GPU architecture here, and compute_70 (the V100 PTX of `dustoff kernels`).
    pub choices: Vec<NvrtcChoice>,
    /// libnvrtc.so.* files on the library path, the wheels' and toolkits' folders.
    pub files: Vec<NvrtcFile>,
}

#[derive(Debug, Serialize)]
pub struct CudaReport {
    pub driver_loaded: bool,
    /// The drivers dustoff supports (`device::SUPPORTED_DRIVERS`).
    pub supported_drivers: &'static str,
    pub driver_cuda_version: Option<String>,
    /// Newest PTX ISA the driver JIT-compiles.
    pub driver_ptx_isa: Option<String>,
    pub cuda_visible_devices: Option<String>,
    pub gpus: Vec<GpuReport>,
    /// Every pair of GPUs: NVLink or PCIe and how far (NVML, else sysfs).
    pub links: Vec<GpuLink>,
    /// Active NVLinks of each GPU `(ordinal, links)` (NVML only).
    pub nvlinks_active: Vec<(usize, u32)>,
    pub nvrtc: NvrtcReport,
    pub cublas_loadable: bool,
    /// Where kernels come from: `PTX from DIR` (`--ptx-dir`, `DUSTOFF_PTX_DIR` or `ptx/` beside
    /// the binary) or `NVRTC`.
    pub kernels: String,
    /// NCCL's version when libnccl loads (tensor parallel over several GPUs needs it), else why not.
    pub nccl: Result<String, String>,
}

#[derive(Debug, Serialize)]
pub struct DevicePlan {
    pub device: String,
    pub weights_bytes: u64,
    pub kv_bytes: u64,
    /// Hybrid models: the recurrent state of all slots (counted in `total_bytes`), and of one.
    pub state_bytes: u64,
    pub state_bytes_per_sequence: u64,
    pub workspace_bytes: u64,
    pub total_bytes: u64,
    pub available_bytes: Option<u64>,
    pub fits: bool,
    pub note: String,
    /// Bytes read per decoded token (weights less the embedding table).
    pub decode_bytes_per_token: u64,
    pub projected_decode_tok_s: Option<f64>,
    pub projection: String,
}

#[derive(Debug, Serialize)]
pub struct ModelReport {
    pub path: String,
    /// Why the model could not be read (then nothing else is filled in and doctor exits 1).
    pub error: Option<String>,
    pub arch: String,
    pub layers: usize,
    pub context: usize,
    pub slots: usize,
    pub plans: Vec<DevicePlan>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub version: &'static str,
    pub cpu: CpuReport,
    /// The thread placement a run on the default device gets with these --numa / --threads.
    pub threads: Placement,
    pub cuda: CudaReport,
    pub model: Option<ModelReport>,
    pub usable_devices: Vec<String>,
    /// What `--device auto` picks.
    pub default_device: String,
    pub problems: Vec<String>,
    pub hints: Vec<String>,
    /// The code of [`Report::exit`], for the JSON form.
    pub exit_code: u8,
    /// `Ok`: the default device (and with --require-gpu a GPU) is usable; `Failure` otherwise.
    #[serde(skip)]
    pub exit: ExitCode,
}

/// Path for messages.
pub(crate) fn shown(p: &Path) -> String {
    p.display().to_string()
}
