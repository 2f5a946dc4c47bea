//! Kernel sources, NVRTC compilation and the on-disk PTX cache.
//!
//! Every kernel file is compiled as one NVRTC program with `kernels/common.cuh` inlined where it
//! says `#include "common.cuh"` (NVRTC 12.9 has no toolkit headers, and we pass none). Compiled
//! PTX is cached under `$XDG_CACHE_HOME/dustoff` (else `~/.cache/dustoff`), keyed by
//! blake3(source, arch, NVRTC version, options, ISA lowering): a changed kernel, compiler or
//! lowering never reuses a stale file. compute_70 PTX is lowered to the V100 ISA
//! (`ptx_isa`), so that it loads on every driver from CUDA 11.0 up.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::nvrtc_lib::CompileFailure;
use super::ptx_isa;
use crate::backend::cuda::CudaError;

/// One kernel source file of `kernels/` and the entry points it defines.
#[derive(Clone, Copy, Debug)]
pub struct KernelFile {
    /// File stem: `kernels/<name>.cu`, PTX file `<name>.ptx`.
    pub name: &'static str,
    pub source: &'static str,
    pub entries: &'static [&'static str],
    /// Environment variables of which one must be set and not `0` for
    /// [`KernelFile::switched_on`] (a kernel family that is off by default is then compiled only
    /// when something launches it, so that it adds nothing to every start); empty: always on.
    pub switch: &'static [&'static str],
}

impl KernelFile {
    /// Whether this file's family is switched on (see `switch`).
    pub fn switched_on(&self) -> bool {
        self.switch.is_empty()
            || self.switch.iter().any(|v| crate::sys::env::get(v).is_some_and(|x| !x.is_empty() && x != "0"))
    }
}

pub const COMMON: &str = include_str!("../../../../kernels/common.cuh");
/// The GGML block-format decoders (`kernels/quant.cuh`), inlined like `common.cuh`.
pub const QUANT: &str = include_str!("../../../../kernels/quant.cuh");

/// What the decode attention kernel files share (`kernels/attention.cuh`), inlined the same way.
pub const ATTENTION: &str = include_str!("../../../../kernels/attention.cuh");

/// What the grouped MoE GEMM files share (`kernels/moe_gemm.cuh`), inlined the same way.
pub const MOE_GEMM: &str = include_str!("../../../../kernels/moe_gemm.cuh");

/// The program text NVRTC compiles: the file with its headers (`common.cuh`, `quant.cuh`,
/// `attention.cuh`, `moe_gemm.cuh`) inlined.
pub fn full_source(file: &KernelFile) -> String {
    file.source
        .replace("#include \"common.cuh\"", COMMON)
        .replace("#include \"quant.cuh\"", QUANT)
        .replace("#include \"attention.cuh\"", ATTENTION)
        .replace("#include \"moe_gemm.cuh\"", MOE_GEMM)
}

/// NVRTC options besides the architecture. Part of the cache key.
const OPTIONS: &[&str] = &["--std=c++17", "--fmad=true"];

/// Whether an NVRTC library can be loaded (any of those `nvrtc_lib` finds).
pub fn nvrtc_available() -> bool {
    super::nvrtc_lib::any_loads()
}

/// The (major, minor) version of the NVRTC that compiles for `arch` on this machine.
pub fn nvrtc_version(arch: &str) -> Result<(i32, i32), CudaError> {
    Ok(nvrtc_for(arch)?.version)
}

/// The NVRTC chosen for `arch` (see `nvrtc_lib::choose`).
pub fn nvrtc_for(arch: &str) -> Result<&'static super::nvrtc_lib::Nvrtc, CudaError> {
    if !nvrtc_available() {
        return Err(super::nvrtc_lib::env_failure().map_or(CudaError::NvrtcMissing, CudaError::Nvrtc));
    }
    super::nvrtc_lib::for_arch(arch).map(|(n, _)| n).map_err(CudaError::Nvrtc)
}

pub use crate::backend::cuda::device::arch_for;

pub use super::ptx_isa::lowered_isa;

/// Applies [`lowered_isa`] to PTX of `arch` (unchanged for other architectures).
pub fn lower_for(name: &str, arch: &str, ptx: String) -> Result<String, CudaError> {
    match lowered_isa(arch) {
        Some(to) => ptx_isa::lower(&ptx, to).map_err(|e| CudaError::Isa {
            file: name.to_string(),
            arch: arch.to_string(),
            source: e,
        }),
        None => Ok(ptx),
    }
}

/// Compiles one program to PTX for `arch` (e.g. `compute_70`) with the NVRTC chosen for it,
/// lowered to [`lowered_isa`] where that applies.
pub fn compile(name: &str, source: &str, arch: &str) -> Result<String, CudaError> {
    let lib = nvrtc_for(arch)?;
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(OPTIONS.iter().map(|s| s.to_string()));
    let ptx = lib.compile(&format!("{name}.cu"), source, &options).map_err(|e| match e {
        CompileFailure::Log(log) => CudaError::Compile { file: name.to_string(), arch: arch.to_string(), log },
        CompileFailure::Call(what) => CudaError::Nvrtc(format!("{} ({}): {what}", lib.path.display(), name)),
    })?;
    lower_for(name, arch, ptx)
}

/// Hex blake3 of everything that decides the PTX: program text, architecture, NVRTC version,
/// options and the ISA lowering (its target and rules). Fields are length-prefixed so that no
/// two different tuples hash alike.
pub fn cache_key(source: &str, arch: &str, version: (i32, i32)) -> String {
    let lowering = match lowered_isa(arch) {
        Some(isa) => format!("lowered to {isa} by {}", ptx_isa::LOWERING_ID),
        None => "not lowered".to_string(),
    };
    let mut h = blake3::Hasher::new();
    for part in [source, arch, &format!("nvrtc {}.{}", version.0, version.1), &OPTIONS.join(" "), &lowering] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().to_hex().to_string()
}

/// The cache folder for given `XDG_CACHE_HOME` and `HOME` values: `$XDG_CACHE_HOME/dustoff`
/// when that is an absolute path (the XDG spec ignores relative ones), else `$HOME/.cache/dustoff`.
pub fn cache_dir_from(xdg_cache_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    if let Some(x) = xdg_cache_home.map(PathBuf::from).filter(|p| p.is_absolute()) {
        return Some(x.join("dustoff"));
    }
    home.map(PathBuf::from).filter(|p| !p.as_os_str().is_empty()).map(|h| h.join(".cache").join("dustoff"))
}

/// The cache folder from the environment.
pub fn default_cache_dir() -> Option<PathBuf> {
    cache_dir_from(crate::sys::env::get_os("XDG_CACHE_HOME"), crate::sys::env::get_os("HOME"))
}

/// The cache file of a key.
pub fn cache_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.ptx"))
}

/// PTX of `file` for `arch`, from the cache when present, else compiled and stored. A cache that
/// cannot be written is not an error (the PTX is still returned); one that cannot be read is
/// treated as a miss.
pub fn compile_cached(file: &KernelFile, arch: &str, cache_dir: Option<&Path>) -> Result<String, CudaError> {
    let source = full_source(file);
    let Some(dir) = cache_dir else {
        return compile(file.name, &source, arch);
    };
    let key = cache_key(&source, arch, nvrtc_version(arch)?);
    let path = cache_path(dir, &key);
    if let Ok(ptx) = std::fs::read_to_string(&path) {
        if ptx_defines_all(&ptx, file) {
            return Ok(ptx);
        }
    }
    let ptx = compile(file.name, &source, arch)?;
    if let Err(e) = store(dir, &path, &ptx) {
        eprintln!("warning: {e} (kernels will be compiled again next time)");
    }
    Ok(ptx)
}

/// Writes through a temporary file and a rename, so that a reader never sees half a file. The
/// temporary name is unique to the process and the call: engines in several threads of one
/// process (`run --devices 0,0`) may store the same kernel at once, and each must rename its own
/// whole file (the last rename wins; both hold the same PTX).
fn store(dir: &Path, path: &Path, ptx: &str) -> Result<(), CudaError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let io = |source| CudaError::CacheIo { path: path.to_path_buf(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&tmp, ptx).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Whether a PTX text is whole (ends with the closing brace of its last function) and defines
/// every entry point of `file`: guards against truncated files and PTX folders made from
/// another version of the kernels.
pub fn ptx_defines_all(ptx: &str, file: &KernelFile) -> bool {
    ptx.trim_end().ends_with('}') && file.entries.iter().all(|e| ptx.contains(&format!(".entry {e}(")))
}

/// Instructions and targets that must not appear in PTX meant for `compute_70` (V100): they
/// need sm_75 (`ldmatrix`, m16n8 mma), sm_80 (`cp.async`, bf16) or sm_90 (wgmma, TMA).
pub const FORBIDDEN_ON_SM70: &[&str] = &[
    "ldmatrix",
    "cp.async",
    "bf16",
    "mma.sync.aligned.m16n8",
    "wgmma",
    "cp.async.bulk",
    ".target sm_8",
    ".target sm_9",
];

/// The forbidden patterns found in `ptx`, and whether its header targets `sm_70`.
pub fn check_sm70_ptx(ptx: &str) -> Result<(), String> {
    let header_ok = ptx.lines().any(|l| l.trim() == ".target sm_70");
    let found: Vec<&str> = FORBIDDEN_ON_SM70.iter().copied().filter(|p| ptx.contains(p)).collect();
    match (header_ok, found.is_empty()) {
        (true, true) => Ok(()),
        (false, _) => Err("the PTX header does not say `.target sm_70`".to_string()),
        (true, false) => Err(format!("sm_75+ instructions in compute_70 PTX: {}", found.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_storing_the_same_kernel_each_rename_a_whole_file() {
        // Regression: the temporary name was the process id alone, so two engines of one
        // process storing one kernel wrote the same temporary file and one rename failed.
        let dir = std::env::temp_dir().join(format!("dustoff-ptx-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = cache_path(&dir, "k");
        let ptx: String = (0..20_000).map(|i| format!("// line {i}\n")).collect::<String>() + "}";
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8).map(|_| s.spawn(|| store(&dir, &path, &ptx).map_err(|e| e.to_string()))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), ptx);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 1, "no temporary files left: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let base = cache_key("src", "compute_70", (12, 9));
        assert_eq!(base, cache_key("src", "compute_70", (12, 9)));
        assert_eq!(base.len(), 64);
        assert_ne!(base, cache_key("src ", "compute_70", (12, 9)));
        assert_ne!(base, cache_key("src", "compute_90", (12, 9)));
        assert_ne!(base, cache_key("src", "compute_70", (13, 0)));
        assert_ne!(base, cache_key("src", "compute_70", (12, 8)));
        // Length prefixes: moving a character between fields changes the key.
        assert_ne!(cache_key("srcc", "ompute_70", (12, 9)), base);
    }

    #[test]
    fn cache_dir_follows_xdg_then_home() {
        let d = cache_dir_from(Some("/x/cache".into()), Some("/home/u".into()));
        assert_eq!(d, Some(PathBuf::from("/x/cache/dustoff")));
        let d = cache_dir_from(Some("relative".into()), Some("/home/u".into()));
        assert_eq!(d, Some(PathBuf::from("/home/u/.cache/dustoff")));
        assert_eq!(cache_dir_from(None, Some("/home/u".into())), Some(PathBuf::from("/home/u/.cache/dustoff")));
        assert_eq!(cache_dir_from(None, None), None);
        assert_eq!(cache_dir_from(Some("".into()), Some("".into())), None);
    }

    #[test]
    fn sm70_check_flags_newer_instructions() {
        let ok = ".version 8.8\n.target sm_70\n.address_size 64\n";
        assert!(check_sm70_ptx(ok).is_ok());
        assert!(check_sm70_ptx(".target sm_80\n").is_err());
        assert!(check_sm70_ptx(&format!("{ok}ldmatrix.sync.aligned.m8n8.x4.shared.b16")).is_err());
        assert!(check_sm70_ptx(&format!("{ok}cp.async.ca.shared.global")).is_err());
        assert!(check_sm70_ptx(&format!("{ok}cvt.rn.bf16.f32")).is_err());
    }
}
