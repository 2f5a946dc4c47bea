//! The lazy per-device kernel registry: a kernel file is compiled (or its PTX loaded) the first
//! time one of its entry points is asked for, then every entry is looked up by name.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::nvrtc::{self, KernelFile};
use super::CudaError;

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

impl PtxSource {
    /// An explicit `--ptx-dir` wins, then `DUSTOFF_PTX_DIR`, then NVRTC with the default cache.
    pub fn resolve(ptx_dir: Option<PathBuf>) -> Self {
        let env = crate::sys::env::get_os(PTX_DIR_ENV).filter(|v| !v.is_empty()).map(PathBuf::from);
        match ptx_dir.or(env) {
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
}

impl Kernels {
    pub fn new(ctx: Arc<CudaContext>, arch: String, source: PtxSource) -> Self {
        Kernels { ctx, arch, source, modules: HashMap::new(), funcs: HashMap::new() }
    }

    pub fn source(&self) -> &PtxSource {
        &self.source
    }

    /// The function `entry` (e.g. `rmsnorm_f32`), loading its file on first use.
    pub fn get(&mut self, entry: &'static str) -> Result<&CudaFunction, CudaError> {
        if !self.funcs.contains_key(entry) {
            let file = nvrtc::file_of(entry).ok_or_else(|| CudaError::UnknownKernel(entry.to_string()))?;
            let module = self.module(file)?;
            let f = module.load_function(entry).map_err(CudaError::driver(format!("loading kernel {entry}")))?;
            self.funcs.insert(entry, f);
        }
        Ok(&self.funcs[entry])
    }

    /// Loads every kernel file now (so that compilation stays out of timings). Files that NVRTC
    /// must compile are compiled in parallel threads first (NVRTC is thread-safe and the cache
    /// writes are atomic): one file at a time took over a minute on a 16-core GPU host, most of
    /// it in the few largest files.
    pub fn load_all(&mut self) -> Result<(), CudaError> {
        if let PtxSource::Nvrtc { cache_dir } = &self.source {
            let todo: Vec<&'static KernelFile> =
                nvrtc::KERNEL_FILES.iter().filter(|f| !self.modules.contains_key(f.name)).collect();
            let (arch, dir) = (self.arch.as_str(), cache_dir.as_deref());
            let ptx: Vec<Result<String, CudaError>> = std::thread::scope(|s| {
                let jobs: Vec<_> = todo.iter().map(|f| s.spawn(move || nvrtc::compile_cached(f, arch, dir))).collect();
                jobs.into_iter()
                    .map(|j| j.join().unwrap_or_else(|_| Err(CudaError::Nvrtc("a compile thread panicked".into()))))
                    .collect()
            });
            for (file, ptx) in todo.into_iter().zip(ptx) {
                self.load_ptx(file, ptx?)?;
            }
        }
        for f in nvrtc::KERNEL_FILES {
            for e in f.entries {
                self.get(e)?;
            }
        }
        Ok(())
    }

    fn module(&mut self, file: &'static KernelFile) -> Result<Arc<CudaModule>, CudaError> {
        if let Some(m) = self.modules.get(file.name) {
            return Ok(m.clone());
        }
        let ptx = match &self.source {
            PtxSource::Nvrtc { cache_dir } => nvrtc::compile_cached(file, &self.arch, cache_dir.as_deref())?,
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
                text
            }
        };
        self.load_ptx(file, ptx)
    }

    fn load_ptx(&mut self, file: &'static KernelFile, ptx: String) -> Result<Arc<CudaModule>, CudaError> {
        let m = self.ctx.load_module(Ptx::from_src(ptx)).map_err(CudaError::driver(format!(
            "loading module {}.ptx ({})",
            file.name,
            self.source.describe()
        )))?;
        self.modules.insert(file.name, m.clone());
        Ok(m)
    }
}
