//! The NVRTC library dustoff compiles kernels with: found in its usual places, loaded by path,
//! and chosen per architecture so that its PTX loads on this machine's driver.
//!
//! cudarc's own loader takes the first `libnvrtc.so[.12|.11]` the dynamic linker finds; it can
//! neither load NVRTC 11 (whose file is `libnvrtc.so.11.2`) nor choose between several. Here
//! every `libnvrtc.so.*` of the search folders (`nvrtc_scan`) is a candidate, `DUSTOFF_NVRTC`
//! (a file) overrides them all, and [`choose`] picks by a stated rule. The eight NVRTC functions
//! used exist with these signatures since CUDA 8.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::ptx_isa::{isa_of_cuda, Isa};
use crate::backend::cuda::device;
use crate::sys::nvrtc_scan::can_target;

type Program = *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type TextFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type ErrorFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// One loaded NVRTC library.
pub struct Nvrtc {
    pub path: PathBuf,
    /// (major, minor) from `nvrtcVersion`.
    pub version: (i32, i32),
    create: CreateFn,
    compile: CompileFn,
    log_size: SizeFn,
    log: TextFn,
    ptx_size: SizeFn,
    ptx: TextFn,
    destroy: DestroyFn,
    error: ErrorFn,
    /// Keeps the function pointers above valid.
    _lib: libloading::Library,
}

/// Why a compilation failed: NVRTC's log, or an NVRTC call's error.
#[derive(Debug)]
pub enum CompileFailure {
    Log(String),
    Call(String),
}

impl Nvrtc {
    /// Loads the library at `path` and reads its version.
    pub fn open(path: &Path) -> Result<Nvrtc, String> {
        // SAFETY: loading NVRTC runs no code of ours; its initializers only set up the library.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("cannot load: {e}"))?;
        // SAFETY: each symbol is read with the signature of NVRTC's C API (nvrtc.h, unchanged since
        // CUDA 8); the pointers stay valid while `_lib` lives, which the struct guarantees.
        unsafe {
            fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
                // SAFETY: see the caller: `T` is the C signature of `name`.
                unsafe { lib.get::<T>(name.as_bytes()).map(|s| *s).map_err(|e| format!("no {name}: {e}")) }
            }
            let version: VersionFn = sym(&lib, "nvrtcVersion")?;
            let (mut major, mut minor) = (0, 0);
            let rc = version(&mut major, &mut minor);
            if rc != 0 {
                return Err(format!("nvrtcVersion failed ({rc})"));
            }
            Ok(Nvrtc {
                path: path.to_path_buf(),
                version: (major, minor),
                create: sym(&lib, "nvrtcCreateProgram")?,
                compile: sym(&lib, "nvrtcCompileProgram")?,
                log_size: sym(&lib, "nvrtcGetProgramLogSize")?,
                log: sym(&lib, "nvrtcGetProgramLog")?,
                ptx_size: sym(&lib, "nvrtcGetPTXSize")?,
                ptx: sym(&lib, "nvrtcGetPTX")?,
                destroy: sym(&lib, "nvrtcDestroyProgram")?,
                error: sym(&lib, "nvrtcGetErrorString")?,
                _lib: lib,
            })
        }
    }

    /// The PTX ISA this NVRTC writes.
    pub fn isa(&self) -> Isa {
        isa_of_cuda(self.version)
    }

    fn err(&self, what: &str, rc: c_int) -> CompileFailure {
        // SAFETY: nvrtcGetErrorString returns a static C string for any code.
        let text = unsafe { CStr::from_ptr((self.error)(rc)) }.to_string_lossy().into_owned();
        CompileFailure::Call(format!("{what}: {text}"))
    }

    /// Compiles `source` (program name `name`) with `options` to PTX text.
    pub fn compile(&self, name: &str, source: &str, options: &[String]) -> Result<String, CompileFailure> {
        let bad = |e: std::ffi::NulError| CompileFailure::Call(format!("a NUL byte in the program text: {e}"));
        let src = CString::new(source).map_err(bad)?;
        let cname = CString::new(name).map_err(bad)?;
        let opts: Vec<CString> =
            options.iter().map(|o| CString::new(o.as_str())).collect::<Result<_, _>>().map_err(bad)?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every pointer is a live NUL-terminated string (or null with count 0 for the
        // headers); `prog` receives the new program, destroyed below on every path.
        let rc =
            unsafe { (self.create)(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
        if rc != 0 {
            return Err(self.err("nvrtcCreateProgram", rc));
        }
        let result = self.compile_program(prog, &opt_ptrs);
        // SAFETY: `prog` was created above and is destroyed once.
        unsafe { (self.destroy)(&mut prog) };
        result
    }

    fn compile_program(&self, prog: Program, opts: &[*const c_char]) -> Result<String, CompileFailure> {
        let text = |size: SizeFn, get: TextFn, what: &str| -> Result<String, CompileFailure> {
            let mut n = 0usize;
            // SAFETY: `prog` is live; `n` receives the size, then a buffer of that size the text.
            let rc = unsafe { size(prog, &mut n) };
            if rc != 0 {
                return Err(self.err(what, rc));
            }
            let mut buf = vec![0u8; n.max(1)];
            // SAFETY: `buf` holds `n` bytes, as NVRTC asked.
            let rc = unsafe { get(prog, buf.as_mut_ptr().cast()) };
            if rc != 0 {
                return Err(self.err(what, rc));
            }
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
        };
        let n = c_int::try_from(opts.len()).unwrap_or(c_int::MAX);
        // SAFETY: `opts` holds `n` live C strings for the call's duration.
        let rc = unsafe { (self.compile)(prog, n, opts.as_ptr()) };
        if rc != 0 {
            let log = text(self.log_size, self.log, "nvrtcGetProgramLog")?;
            return Err(CompileFailure::Log(log));
        }
        text(self.ptx_size, self.ptx, "nvrtcGetPTX")
    }
}

/// An NVRTC file found on this machine and what loading it said.
#[derive(Clone, Debug)]
pub struct Found {
    pub path: PathBuf,
    pub version: Result<(i32, i32), String>,
}

/// The environment variable naming the NVRTC library to use (a file), overriding the search.
pub const NVRTC_ENV: &str = "DUSTOFF_NVRTC";

/// Every candidate library, loaded once (in search order: `DUSTOFF_NVRTC` alone when set, else
/// `LD_LIBRARY_PATH`, the wheels, the toolkits, the system folders).
fn loaded() -> &'static [(PathBuf, Result<&'static Nvrtc, String>)] {
    static ALL: OnceLock<Vec<(PathBuf, Result<&'static Nvrtc, String>)>> = OnceLock::new();
    ALL.get_or_init(|| {
        let paths: Vec<PathBuf> = match crate::sys::env::get_os(NVRTC_ENV).filter(|v| !v.is_empty()) {
            Some(p) => vec![PathBuf::from(p)],
            None => crate::sys::nvrtc_scan::scan_nvrtc().into_iter().map(|f| PathBuf::from(f.path)).collect(),
        };
        // Nothing in the known folders: the names the dynamic linker resolves (its cache covers
        // folders no scan knows), as cudarc would load them.
        let paths = if paths.is_empty() {
            ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"].map(PathBuf::from).to_vec()
        } else {
            paths
        };
        // Libraries are loaded for the life of the process (leaked once: a handful at most).
        paths.into_iter().map(|p| (p.clone(), Nvrtc::open(&p).map(|n| &*Box::leak(Box::new(n))))).collect()
    })
}

/// When `DUSTOFF_NVRTC` is set and its file does not load: why, said so (the search is off
/// while it is set, so every other library is ignored).
pub fn env_failure() -> Option<String> {
    crate::sys::env::get_os(NVRTC_ENV).filter(|v| !v.is_empty())?;
    let (p, r) = loaded().first()?;
    let e = r.as_ref().err()?;
    Some(format!(
        "{NVRTC_ENV}={} does not load ({e}); while it is set no other NVRTC is looked for: fix or unset it",
        p.display()
    ))
}

/// What was found, for `doctor`.
pub fn found() -> Vec<Found> {
    loaded()
        .iter()
        .map(|(p, r)| Found { path: p.clone(), version: r.as_ref().map(|n| n.version).map_err(Clone::clone) })
        .collect()
}

/// The ISA the PTX for `arch` declares when NVRTC of ISA `written` compiled it: compute_70 is
/// lowered to the V100 ISA (see `ptx_isa`), other architectures keep NVRTC's.
pub fn output_isa(arch: &str, written: Isa) -> Isa {
    match super::ptx_isa::lowered_isa(arch) {
        Some(to) => written.min(to),
        None => written,
    }
}

/// The compute capability of `compute_XY`.
fn cc_of(arch: &str) -> Option<(i32, i32)> {
    let d = arch.strip_prefix("compute_")?;
    let (a, b) = d.split_at(d.len().checked_sub(1)?);
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Picks among `versions` (candidate index, version) the NVRTC for `arch` on a driver that
/// loads PTX up to `driver_isa` (`None`: no driver here, e.g. a build box):
/// 1. it must target `arch` (NVRTC 13 dropped compute_70),
/// 2. its PTX (after the compute_70 lowering) must not be newer than the driver loads,
/// 3. the newest such version wins (the first found among equals).
///
/// Returns the index and the reason, or why none fits.
pub fn choose(
    versions: &[(usize, (i32, i32))],
    arch: &str,
    driver_isa: Option<Isa>,
) -> Result<(usize, String), String> {
    let cc = cc_of(arch).ok_or_else(|| format!("'{arch}' is not compute_XY"))?;
    let mut best: Option<(usize, (i32, i32))> = None;
    let mut why_not = Vec::new();
    for &(i, v) in versions {
        let isa = output_isa(arch, isa_of_cuda(v));
        if can_target(v.0.max(0) as u32, cc) != Some(true) {
            why_not.push(format!("NVRTC {}.{} cannot target {arch}", v.0, v.1));
        } else if let Some(d) = driver_isa.filter(|d| isa > *d) {
            why_not.push(format!(
                "NVRTC {}.{} writes PTX ISA {isa} for {arch}, newer than the driver loads ({d})",
                v.0, v.1
            ));
        } else if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    let Some((i, v)) = best else {
        return Err(if why_not.is_empty() { "no NVRTC library found".into() } else { why_not.join("; ") });
    };
    let isa = output_isa(arch, isa_of_cuda(v));
    let driver = driver_isa.map_or("no driver here".to_string(), |d| format!("the driver loads up to {d}"));
    let mut reason = format!("the newest NVRTC that targets {arch} with PTX this driver loads (ISA {isa}; {driver})");
    if !why_not.is_empty() {
        reason.push_str(&format!("; passed over: {}", why_not.join("; ")));
    }
    Ok((i, reason))
}

/// The driver's PTX ISA (`None` without a driver).
pub fn driver_isa() -> Option<Isa> {
    device::driver_version().map(isa_of_cuda)
}

/// A chosen NVRTC and why, or why none fits.
type Choice = Result<(&'static Nvrtc, String), String>;

/// The NVRTC for `arch` on this machine and why it was chosen (decided once per architecture).
pub fn for_arch(arch: &str) -> Choice {
    static CHOSEN: OnceLock<Mutex<HashMap<String, Choice>>> = OnceLock::new();
    let mut map = CHOSEN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    map.entry(arch.to_string())
        .or_insert_with(|| {
            let all = loaded();
            let ok: Vec<(usize, (i32, i32))> =
                all.iter().enumerate().filter_map(|(i, (_, r))| r.as_ref().ok().map(|n| (i, n.version))).collect();
            let (i, why) = choose(&ok, arch, driver_isa())?;
            let lib = all[i].1.as_ref().map_err(Clone::clone)?;
            Ok((*lib, why))
        })
        .clone()
}

/// Whether any NVRTC library loads.
pub fn any_loads() -> bool {
    loaded().iter().any(|(_, r)| r.is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_nvrtc_whose_ptx_the_driver_loads_wins() {
        let v = [(0, (13, 0)), (1, (12, 9)), (2, (11, 8))];
        // A V100 (compute_70): NVRTC 13 cannot target it; 12.9's PTX is lowered to 7.0, which
        // every driver from CUDA 11.0 loads.
        assert_eq!(choose(&v, "compute_70", Some(Isa(7, 4))).unwrap().0, 1);
        assert_eq!(choose(&v, "compute_70", None).unwrap().0, 1);
        // An H200 on a CUDA 13 driver: NVRTC 13.
        assert_eq!(choose(&v, "compute_90", Some(Isa(9, 0))).unwrap().0, 0);
        // An A100 on a CUDA 12.4 driver: 13's and 12.9's PTX are too new, 11.8's loads.
        let (i, why) = choose(&v, "compute_80", Some(Isa(8, 4))).unwrap();
        assert_eq!(i, 2, "{why}");
        assert!(
            why.contains("NVRTC 12.9 writes PTX ISA 8.8 for compute_80, newer than the driver loads (8.4)"),
            "{why}"
        );
        // Nothing fits: every reason is given.
        let e = choose(&[(0, (13, 0))], "compute_70", Some(Isa(9, 0))).unwrap_err();
        assert!(e.contains("NVRTC 13.0 cannot target compute_70"), "{e}");
        assert_eq!(choose(&[], "compute_70", None).unwrap_err(), "no NVRTC library found");
        assert!(choose(&v, "sm_70", None).is_err());
    }

    #[test]
    fn architectures_parse() {
        assert_eq!(cc_of("compute_70"), Some((7, 0)));
        assert_eq!(cc_of("compute_120"), Some((12, 0)));
        assert_eq!(cc_of("compute_"), None);
    }
}
