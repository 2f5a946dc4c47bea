//! `dustoff doctor`: see `sys::doctor` (what it checks and what "usable" means).

use std::path::PathBuf;

use crate::sys::doctor::{gather, DoctorOptions, Report};
use crate::sys::threads::NumaMode;

pub struct DoctorArgs {
    pub model: Option<PathBuf>,
    pub ctx: usize,
    pub slots: usize,
    pub ptx_dir: Option<PathBuf>,
    pub numa: String,
    pub threads: Option<usize>,
    pub measure: bool,
    pub require_gpu: bool,
}

/// Gathers the report; the caller prints it (text or JSON) and exits with `exit_code`.
pub fn run(a: &DoctorArgs) -> anyhow::Result<Report> {
    let opts = DoctorOptions {
        sys_root: PathBuf::from(crate::sys::topology::SYS_ROOT),
        model: a.model.clone(),
        ctx: a.ctx.max(1),
        slots: a.slots.max(1),
        ptx_dir: crate::backend::cuda::compile::kernels::ptx_dir_for(a.ptx_dir.clone()),
        numa: NumaMode::parse(&a.numa)?,
        threads: a.threads,
        measure: a.measure,
        require_gpu: a.require_gpu,
    };
    Ok(gather(&opts))
}
