//! The kernel files and their entry points, in one table (`KERNEL_FILES`: `nvrtc` compiles
//! from it, `dustoff kernels` writes a PTX file per row, the registry finds an entry's file in
//! it), and the lazy per-device registry: a kernel file is compiled (or its PTX loaded) the
//! first time one of its entry points is asked for, then every entry is looked up by name.
//!
//! A new kernel: its `.cu` in `kernels/`, its entry names in the table below (per-format tables
//! and their typed handles in `entries.rs`), its launcher in
//! the Rust module of the same name (`cuda/ops/<file>.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::entries::{
    DEQUANT_ENTRIES, GEMM_QUANT_ENTRIES, GEMV_Q8_ENTRIES, GEMV_QUANT_ENTRIES, MOE_ENTRIES, MOE_GEMM_ENTRIES,
    MOE_GEMM_MMA_ENTRIES, MOE_GEMM_N8_ENTRIES, MOE_GEMM_T128_ENTRIES, MOE_Q8_ENTRIES,
};
use super::model_entries::ModelEntries;
use super::nvrtc::{self, KernelFile};
use crate::backend::cuda::device;
use crate::backend::cuda::CudaError;

macro_rules! kernel_file {
    ($name:literal, [$($e:literal),* $(,)?]) => {
        KernelFile {
            name: $name,
            source: include_str!(concat!("../../../../kernels/", $name, ".cu")),
            entries: &[$($e),*],
            switch: &[],
        }
    };
}

/// Every kernel file, with its entry points (`<op>_<dtype>`).
pub const KERNEL_FILES: &[KernelFile] = &[
    kernel_file!("add", ["bias_add_f32", "cast_f32_f16"]),
    kernel_file!("argmax", ["argmax_rows_f32", "argmax_masked_rows_f32"]),
    kernel_file!(
        "attention_decode",
        [
            "attn_split_f16",
            "attn_split_f16_hd64",
            "attn_split_f16_hd128",
            "attn_onepass_f16_hd64",
            "attn_onepass_f16_hd128",
            "attn_onepass_f16_hd256"
        ]
    ),
    kernel_file!(
        "attention_decode_tc",
        ["attn_decode_tc_hd64", "attn_decode_tc_hd128", "attn_decode_tc_q8_hd64", "attn_decode_tc_q8_hd128"]
    ),
    kernel_file!("attention_merge", ["attn_merge_f32"]),
    kernel_file!(
        "attention_prefill",
        [
            "attn_prefill_hd64",
            "attn_prefill_hd128",
            "attn_prefill_hd256",
            "attn_prefill_hd64_qs",
            "attn_prefill_hd128_qs",
            "attn_prefill_hd64_acc",
            "attn_prefill_hd128_acc",
            "attn_prefill_hd256_acc",
            "attn_prefill_hd64_q8",
            "attn_prefill_hd128_q8",
            "attn_prefill_hd256_q8",
            "attn_prefill_hd64_qs_q8",
            "attn_prefill_hd128_qs_q8",
            "attn_prefill_hd64_acc_q8",
            "attn_prefill_hd128_acc_q8",
            "attn_prefill_hd256_acc_q8"
        ]
    ),
    kernel_file!(
        "deltanet",
        [
            "dn_conv_silu_f32",
            "dn_prep_f32",
            "dn_recur_f32",
            "dn_recur_norm_f32",
            "dn_gated_norm_f32",
            "dn_chunk_prep_f32",
            "dn_chunk_scan_f32",
            "dn_conv_prep_f32"
        ]
    ),
    KernelFile {
        name: "dequant",
        source: include_str!("../../../../kernels/dequant.cu"),
        entries: &DEQUANT_ENTRIES,
        switch: &[],
    },
    kernel_file!("embedding", ["embedding_f16", "fill_uniform_f16"]),
    kernel_file!(
        "gemm_tc",
        [
            "gemm_tc_f16_t16",
            "gemm_tc_f16_t32",
            "gemm_tc_f16_t48",
            "gemm_tc_f16_t64",
            "gemm_tc64_f16_t16",
            "gemm_tc64_f16_t32",
            "gemm_tc64_f16_t48",
            "gemm_tc64_f16_t64",
            "gemm_tc128_f16_t16",
            "gemm_tc128_f16_t32",
            "gemm_tc128_f16_t48",
            "gemm_tc128_f16_t64",
            "splitk_reduce_f32"
        ]
    ),
    kernel_file!(
        "gemv_f16",
        [
            "gemv_f16_n1",
            "gemv_f16_n2",
            "gemv_f16_n4",
            "gemv_f16_n8",
            "gemv_f16_n1_r4",
            "gemv_f16_n1_r8",
            "gemv_swiglu_f16_n1",
            "gemv_swiglu_f16_n2",
            "gemv_swiglu_f16_n4",
            "gemv_swiglu_f16_n8"
        ]
    ),
    kernel_file!(
        "fused_norm",
        [
            "rmsnorm_q8_f32",
            "rmsnorm_f16_f32",
            "gemv_norm_f16_n1",
            "gemv_norm_f16_n2",
            "gemv_norm_f16_n4",
            "gemv_norm_f16_n8",
            "gemv_norm_swiglu_f16_n1",
            "gemv_norm_swiglu_f16_n2",
            "gemv_norm_swiglu_f16_n4",
            "gemv_norm_swiglu_f16_n8",
            "gemv_norm_f16_n1_r4",
            "gemv_norm_f16_n1_r8",
            "gemv_norm_swiglu_f16_n1_r4",
            "gemv_norm_swiglu_f16_n1_r8"
        ]
    ),
    KernelFile {
        name: "gemv_quant",
        source: include_str!("../../../../kernels/gemv_quant.cu"),
        entries: &GEMV_QUANT_ENTRIES,
        switch: &[],
    },
    KernelFile {
        name: "gemm_quant",
        source: include_str!("../../../../kernels/gemm_quant.cu"),
        entries: &GEMM_QUANT_ENTRIES,
        switch: &[],
    },
    KernelFile {
        name: "gemv_q8",
        source: include_str!("../../../../kernels/gemv_q8.cu"),
        entries: &GEMV_Q8_ENTRIES,
        switch: &[],
    },
    kernel_file!("hybrid_attn", ["hyb_qkv_post_f32", "hyb_gate_mul_f32"]),
    kernel_file!("kv_cache", ["kv_store_f16", "qkv_post_f32"]),
    KernelFile { name: "moe", source: include_str!("../../../../kernels/moe.cu"), entries: &MOE_ENTRIES, switch: &[] },
    KernelFile {
        name: "moe_q8",
        source: include_str!("../../../../kernels/moe_q8.cu"),
        entries: &MOE_Q8_ENTRIES,
        // Off by default: ~3.5 MB of PTX that the driver would compile at each first start on a
        // V100 (`load_all` skips a file whose switch is off).
        switch: &["DUSTOFF_MOE_Q8"],
    },
    KernelFile {
        name: "moe_gemm",
        source: include_str!("../../../../kernels/moe_gemm.cu"),
        entries: &MOE_GEMM_ENTRIES,
        switch: &[],
    },
    KernelFile {
        name: "moe_gemm_n8",
        source: include_str!("../../../../kernels/moe_gemm_n8.cu"),
        entries: &MOE_GEMM_N8_ENTRIES,
        switch: &[],
    },
    KernelFile {
        name: "moe_gemm_mma",
        source: include_str!("../../../../kernels/moe_gemm_mma.cu"),
        entries: &MOE_GEMM_MMA_ENTRIES,
        // Opt-in until measured faster (loaded on first use otherwise: the parity tests).
        switch: &["DUSTOFF_MOE_MMA"],
    },
    KernelFile {
        name: "moe_gemm_t128",
        source: include_str!("../../../../kernels/moe_gemm_t128.cu"),
        entries: &MOE_GEMM_T128_ENTRIES,
        switch: &[],
    },
    kernel_file!("rmsnorm", ["rmsnorm_f32"]),
    kernel_file!("rope", ["rope_f32"]),
    kernel_file!("shared_expert", ["shexp_gate_add_f32", "shexp_gate_q8_f32"]),
    kernel_file!("silu_mul", ["silu_mul_f32"]),
];

/// The file that defines entry point `entry`.
pub fn file_of(entry: &str) -> Option<&'static KernelFile> {
    KERNEL_FILES.iter().find(|f| f.entries.contains(&entry))
}

/// The environment variable naming a folder of precompiled PTX files (`<file>.ptx`).
pub const PTX_DIR_ENV: &str = "DUSTOFF_PTX_DIR";

/// Where kernels come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PtxSource {
    /// Compiled by NVRTC for the device, cached in `cache_dir` (none: no disk cache).
    Nvrtc { cache_dir: Option<PathBuf> },
    /// Precompiled PTX files `<dir>/<file>.ptx` (e.g. compute_70 PTX from `dustoff kernels`).
    Dir(PathBuf),
}

/// The folder of precompiled PTX beside a binary: `ptx/` in the binary's own folder, as an
/// unpacked offline bundle (`scripts/bundle.sh`) lays it out.
pub const PTX_BESIDE_BINARY: &str = "ptx";

/// `<folder of exe>/ptx` when that folder exists.
pub fn ptx_dir_beside(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?.join(PTX_BESIDE_BINARY);
    dir.is_dir().then_some(dir)
}

/// The PTX folder kernels are read from: an explicit `--ptx-dir`, then `DUSTOFF_PTX_DIR`, then
/// `ptx/` beside the running binary (symlinks to it resolved); `None`: NVRTC compiles them.
pub fn ptx_dir_for(explicit: Option<PathBuf>) -> Option<PathBuf> {
    explicit
        .or_else(|| crate::sys::env::get_os(PTX_DIR_ENV).filter(|v| !v.is_empty()).map(PathBuf::from))
        .or_else(|| std::env::current_exe().ok().and_then(|exe| ptx_dir_beside(&exe)))
}

impl PtxSource {
    /// [`ptx_dir_for`], else NVRTC with the default cache.
    pub fn resolve(ptx_dir: Option<PathBuf>) -> Self {
        match ptx_dir_for(ptx_dir) {
            Some(d) => PtxSource::Dir(d),
            None => PtxSource::Nvrtc { cache_dir: nvrtc::default_cache_dir() },
        }
    }

    pub fn describe(&self) -> String {
        match self {
            PtxSource::Nvrtc { .. } => "NVRTC".to_string(),
            PtxSource::Dir(d) => format!("PTX from {}", d.display()),
        }
    }
}

pub struct Kernels {
    ctx: Arc<CudaContext>,
    arch: String,
    source: PtxSource,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    funcs: HashMap<&'static str, CudaFunction>,
    /// Blocks of (entry, threads, dynamic shared bytes) the whole GPU holds at once.
    resident: HashMap<(&'static str, u32, u32), usize>,
    /// The per-thread stack limit [`Kernels::fit_stack`] set (`None`: the driver's default).
    stack: Option<usize>,
    /// The packed formats of the backend's weights and its head size: modules loaded from then
    /// on hold only the entries of those (and of none) (`None`: every entry).
    held: Option<ModelEntries>,
    /// Modules of one entry each, for an entry `held` left out.
    single: HashMap<&'static str, Arc<CudaModule>>,
}

/// Stack bytes a thread gets beyond the largest kernel frame: frames of functions the compiler
/// keeps out of line (math slow paths) are not in a kernel's own figure.
const STACK_MARGIN: usize = 256;

/// Local memory (stack frame and spills) a thread of `f` needs, bytes.
fn local_bytes(f: &CudaFunction) -> Result<usize, CudaError> {
    use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES;
    let b = f
        .get_attribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
        .map_err(CudaError::driver("reading a kernel's local size"))?;
    Ok(usize::try_from(b).unwrap_or(0))
}

impl Kernels {
    pub fn new(ctx: Arc<CudaContext>, arch: String, source: PtxSource) -> Self {
        Kernels {
            ctx,
            arch,
            source,
            modules: HashMap::new(),
            funcs: HashMap::new(),
            resident: HashMap::new(),
            stack: None,
            held: None,
            single: HashMap::new(),
        }
    }

    /// Loads from now on only the entries of `held`'s formats and head size and of none (the
    /// files of every per-format family hold entries for all 8 block formats, the attention
    /// files for three head sizes; the driver compiles each entry of a module it loads). An
    /// entry left out still loads when asked for, in a module of its own.
    pub fn hold_only(&mut self, held: ModelEntries) {
        self.held = Some(held);
    }

    fn keeps(&self, entry: &str) -> bool {
        self.held.as_ref().is_none_or(|h| h.keeps(entry))
    }

    pub fn source(&self) -> &PtxSource {
        &self.source
    }

    /// The NVRTC architecture the kernels run on (`compute_90` on an H200, whatever PTX they
    /// come from).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Blocks of `entry` with `threads` threads and `smem` bytes of dynamic shared memory that
    /// are resident on the whole GPU at once (blocks an SM by the driver's occupancy figure, its
    /// registers and shared memory, times the SMs): one wave of a launch. Launchers size their
    /// grids to whole waves with it (a V100's 80 SMs, an H100's 132 hold different counts).
    pub fn resident_blocks(&mut self, entry: &'static str, threads: u32, smem: u32) -> Result<usize, CudaError> {
        if let Some(&n) = self.resident.get(&(entry, threads, smem)) {
            return Ok(n);
        }
        use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
        let sms = self
            .ctx
            .attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(CudaError::driver("reading the SM count"))?;
        let per_sm = self
            .get(entry)?
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)
            .map_err(CudaError::driver(format!("reading the occupancy of {entry}")))?;
        let n = (per_sm as usize * usize::try_from(sms).unwrap_or(1)).max(1);
        self.resident.insert((entry, threads, smem), n);
        Ok(n)
    }

    /// The function `entry` (e.g. `rmsnorm_f32`), loading its file on first use.
    pub fn get(&mut self, entry: &'static str) -> Result<&CudaFunction, CudaError> {
        if !self.funcs.contains_key(entry) {
            let file = file_of(entry).ok_or_else(|| CudaError::UnknownKernel(entry.to_string()))?;
            let module = if self.keeps(entry) { self.module(file)? } else { self.single_entry(file, entry)? };
            let f = module.load_function(entry).map_err(CudaError::driver(format!("loading kernel {entry}")))?;
            // A kernel loaded after the stack limit was lowered may need more than the others.
            if let Some(limit) = self.stack {
                let need = local_bytes(&f)? + STACK_MARGIN;
                if need > limit {
                    self.set_stack(need)?;
                }
            }
            self.funcs.insert(entry, f);
        }
        Ok(&self.funcs[entry])
    }

    /// Loads every kernel file now (so that compilation stays out of timings; of each file the
    /// entries `hold_only` keeps, once it was called), the files spread
    /// over [`load_threads`] threads for their PTX, largest first: each thread takes the next
    /// file and gets its PTX (NVRTC, thread-safe, with the atomic cache writes of
    /// `nvrtc::store`; or the PTX folder); then this thread loads the modules into the context
    /// one at a time (the driver's JIT to machine code happens there).
    pub fn load_all(&mut self) -> Result<(), CudaError> {
        // A file none of whose entries the backend keeps (an F16 model's per-format files) is
        // neither compiled nor loaded.
        let mut todo: Vec<&'static KernelFile> = KERNEL_FILES
            .iter()
            .filter(|f| {
                f.switched_on() && !self.modules.contains_key(f.name) && f.entries.iter().any(|e| self.keeps(e))
            })
            .collect();
        todo.sort_by_key(|f| std::cmp::Reverse(f.source.len()));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let threads = load_threads().min(todo.len()).max(1);
        let (arch, source, todo_ref) = (self.arch.as_str(), &self.source, &todo);
        let mut done: Vec<(usize, Result<String, CudaError>)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut out = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(&file) = todo_ref.get(i) else { break };
                            let m = ptx_of(source, arch, file);
                            out.push((i, m));
                        }
                        out
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| {
                    w.join().unwrap_or_else(|_| {
                        vec![(usize::MAX, Err(CudaError::Nvrtc("a kernel load thread panicked".into())))]
                    })
                })
                .collect()
        });
        // The first failure in table order, as one file at a time would have reported it. The
        // driver loads (JITs) the modules here, one at a time on this thread: loads from several
        // threads measured slower on the H200 (a fresh-cache first start from compute_70 PTX:
        // 61.5 s against 52.4 s) and a cold-cache native parity run crashed inside libcuda once.
        done.sort_by_key(|(i, _)| todo.get(*i).map_or(usize::MAX, |f| table_index(f)));
        for (i, ptx) in done {
            let ptx = ptx?;
            if let Some(&f) = todo.get(i) {
                let m = load_module(&self.ctx, &self.source, f, self.pruned(ptx))?;
                self.modules.insert(f.name, m);
            }
        }
        for f in KERNEL_FILES.iter().filter(|f| f.switched_on()) {
            for e in f.entries {
                if self.keeps(e) {
                    self.get(e)?;
                }
            }
        }
        self.fit_stack()
    }

    /// Lowers the context's per-thread stack limit to the largest local frame of the loaded
    /// kernels plus [`STACK_MARGIN`] (once, after `load_all`): the default limit reserves local
    /// memory for every resident thread of every SM (1 KB a thread: 276 MB on an H200,
    /// measured), most of which no kernel uses. A limit below a kernel's needs makes its
    /// launches fail (limit 0 did: round 1b of session 8), so the limit covers the largest frame,
    /// and `get` raises it for a kernel loaded later.
    fn fit_stack(&mut self) -> Result<(), CudaError> {
        use cudarc::driver::sys::CUlimit::CU_LIMIT_STACK_SIZE;
        if self.stack.is_some() {
            return Ok(());
        }
        let mut need = 0;
        for f in self.funcs.values() {
            need = need.max(local_bytes(f)?);
        }
        let need = need + STACK_MARGIN;
        let now = self.ctx.get_limit(CU_LIMIT_STACK_SIZE).map_err(CudaError::driver("reading the stack limit"))?;
        if need < now {
            self.set_stack(need)?;
            device::log_memory(&self.ctx.default_stream(), &format!("stack limit {now} -> {need} B"), 0);
        }
        Ok(())
    }

    fn set_stack(&mut self, bytes: usize) -> Result<(), CudaError> {
        use cudarc::driver::sys::CUlimit::CU_LIMIT_STACK_SIZE;
        self.ctx.set_limit(CU_LIMIT_STACK_SIZE, bytes).map_err(CudaError::driver("setting the stack limit"))?;
        self.stack = Some(bytes);
        Ok(())
    }

    fn module(&mut self, file: &'static KernelFile) -> Result<Arc<CudaModule>, CudaError> {
        if let Some(m) = self.modules.get(file.name) {
            return Ok(m.clone());
        }
        let ptx = self.pruned(ptx_of(&self.source, &self.arch, file)?);
        let m = load_module(&self.ctx, &self.source, file, ptx)?;
        self.modules.insert(file.name, m.clone());
        Ok(m)
    }

    /// A module of `file` holding `entry` alone.
    fn single_entry(&mut self, file: &'static KernelFile, entry: &'static str) -> Result<Arc<CudaModule>, CudaError> {
        if let Some(m) = self.single.get(entry) {
            return Ok(m.clone());
        }
        let ptx = super::prune::keep_entries(&ptx_of(&self.source, &self.arch, file)?, &|e| e == entry);
        let m = load_module(&self.ctx, &self.source, file, ptx)?;
        self.single.insert(entry, m.clone());
        Ok(m)
    }

    /// `ptx` without the entries the backend does not launch.
    fn pruned(&self, ptx: String) -> String {
        match &self.held {
            Some(h) => super::prune::keep_entries(&ptx, &|e| h.keeps(e)),
            None => ptx,
        }
    }
}

/// Threads that compile (NVRTC) the kernel files at start: `DUSTOFF_LOAD_THREADS`, else the
/// cores this process may use (1: one file at a time); the modules load one at a time.
pub fn load_threads() -> usize {
    crate::sys::env::get("DUSTOFF_LOAD_THREADS")
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Position of `file` in [`KERNEL_FILES`].
fn table_index(file: &KernelFile) -> usize {
    KERNEL_FILES.iter().position(|f| f.name == file.name).unwrap_or(usize::MAX)
}

/// The PTX of `file`: compiled by NVRTC for `arch` (through the disk cache), or read from the
/// PTX folder and checked to define every entry of the file.
fn ptx_of(source: &PtxSource, arch: &str, file: &KernelFile) -> Result<String, CudaError> {
    match source {
        PtxSource::Nvrtc { cache_dir } => nvrtc::compile_cached(file, arch, cache_dir.as_deref()),
        PtxSource::Dir(dir) => {
            let path = dir.join(format!("{}.ptx", file.name));
            let text =
                std::fs::read_to_string(&path).map_err(|source| CudaError::PtxIo { path: path.clone(), source })?;
            if !nvrtc::ptx_defines_all(&text, file) {
                return Err(CudaError::PtxIo {
                    path,
                    source: std::io::Error::other(format!(
                        "does not define every entry of {}.cu ({}): made from other kernel sources? run `dustoff kernels` again",
                        file.name,
                        file.entries.join(", ")
                    )),
                });
            }
            Ok(text)
        }
    }
}

/// Loads PTX into `ctx` (the driver compiles it to machine code here; cudarc binds the context
/// to the calling thread first, so any thread may call this).
fn load_module(
    ctx: &Arc<CudaContext>,
    source: &PtxSource,
    file: &KernelFile,
    ptx: String,
) -> Result<Arc<CudaModule>, CudaError> {
    ctx.load_module(Ptx::from_src(ptx)).map_err(CudaError::driver(format!(
        "loading module {}.ptx ({})",
        file.name,
        source.describe()
    )))
}

#[cfg(test)]
mod tests {
    use super::nvrtc::full_source;
    use super::*;

    #[test]
    fn every_entry_maps_to_its_file_and_sources_inline_common() {
        for f in KERNEL_FILES {
            for e in f.entries {
                assert_eq!(file_of(e).map(|x| x.name), Some(f.name));
            }
            let src = full_source(f);
            assert!(!src.contains("#include"), "{}: includes left after inlining", f.name);
            assert!(src.contains("h2f("), "{}: common.cuh not inlined", f.name);
        }
        assert!(file_of("no_such_kernel").is_none());
    }

    #[test]
    fn ptx_folder_beside_the_binary_is_found_only_when_it_exists() {
        let dir = std::env::temp_dir().join(format!("dustoff-ptx-beside-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("dustoff");
        std::fs::write(&exe, b"").unwrap();
        assert_eq!(ptx_dir_beside(&exe), None);
        // A file named `ptx` is not a PTX folder.
        std::fs::write(dir.join("ptx"), b"").unwrap();
        assert_eq!(ptx_dir_beside(&exe), None);
        std::fs::remove_file(dir.join("ptx")).unwrap();
        std::fs::create_dir(dir.join("ptx")).unwrap();
        assert_eq!(ptx_dir_beside(&exe), Some(dir.join("ptx")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod entry_handles {
    //! Every handle against the name spelled out from its parts: a wrong table offset names
    //! another kernel (or another format's) and fails here, without a GPU.
    use super::super::entries::*;
    use super::file_of;
    use crate::backend::cuda::compile::model_entries::entry_spelling;
    use crate::backend::cuda::qformat::QFormat;

    fn known(name: &str) -> &str {
        assert!(file_of(name).is_some(), "{name} is not an entry of any kernel file");
        name
    }

    #[test]
    fn handles_name_the_kernel_they_say() {
        for f in QFormat::all() {
            let n = entry_spelling(f.dtype);
            for (n_tok, width) in [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)] {
                for swiglu in [false, true] {
                    let g = Gemv { n_tok, swiglu };
                    let sw = if swiglu { "swiglu_" } else { "" };
                    assert_eq!(known(gemv_quant(&f, g)), format!("gemv_{sw}{n}_n{width}"));
                    assert_eq!(known(gemv_q8(&f, g, false)), format!("gemvq8_{sw}{n}_n{width}"));
                    let r2 =
                        if n_tok == 1 { format!("gemvq8_{sw}{n}_n1r2") } else { format!("gemvq8_{sw}{n}_n{width}") };
                    assert_eq!(known(gemv_q8(&f, g, true)), r2);
                }
            }
            for tiles in 1..=4 {
                assert_eq!(known(gemm_quant(&f, tiles)), format!("gemmq_{n}_t{}", 16 * tiles));
            }
            assert_eq!(known(gemm_quant_w128(&f)), format!("gemmq_{n}_w128"));
            assert_eq!(known(gemm_quant_r128(&f, 1)), format!("gemmq_{n}_r128_t32"));
            assert_eq!(known(gemm_quant_r128(&f, 2)), format!("gemmq_{n}_r128_t64"));
            assert_eq!(known(dequant(&f)), format!("dequant_{n}_f16"));
            assert_eq!(known(embedding_q(&f)), format!("embedding_{n}"));
            assert_eq!(known(moe_q8(f.index, true)), format!("moe_gate_up_q8_{n}"));
            assert_eq!(known(moe_q8(f.index, false)), format!("moe_down_sum_q8_{n}"));
        }
        let slabs = QFormat::all().map(|f| (f.index, entry_spelling(f.dtype)));
        for (col, n) in slabs.into_iter().chain([(SLAB_F16, "f16".to_string())]) {
            for (gate_up, what) in [(true, "gate_up"), (false, "down")] {
                for (grouped, walk) in [(false, "p"), (true, "g")] {
                    assert_eq!(known(moe_mat(col, MoeProduct { gate_up, grouped })), format!("moe_{what}_{n}_{walk}"));
                }
            }
            assert_eq!(known(moe_down_sum(col)), format!("moe_down_sum_{n}"));
        }
        for (col, d) in MOE_GEMM_FORMATS.iter().enumerate() {
            let n = entry_spelling(*d);
            for (gate_up, what) in [(true, "gate_up"), (false, "down")] {
                for (tile, t) in ["t16", "t64", "w48", "t8", "r8", "r16", "t128"].into_iter().enumerate() {
                    match moe_gemm(col, gate_up, tile) {
                        Some(e) => assert_eq!(known(e), format!("moe_gemm_{what}_{n}_{t}")),
                        None => assert!(!gate_up && t == "t128", "{what} {t}: no entry"),
                    }
                }
            }
        }
        assert_eq!(known(QUANTIZE_X_Q8), "quantize_x_q8");
        assert_eq!(known(SPLITK_REDUCE_Q), "splitk_reduce_q");
    }
}
