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
    if a.ctx == 0 || a.slots == 0 {
        let flag = if a.ctx == 0 { "--ctx" } else { "--slots" };
        return Err(crate::job::exit::UsageError::new(format!("{flag} 0: the memory plan needs at least 1")).into());
    }
    // Past this no plan fits any machine, and the products below would leave 64 bits.
    const MOST: usize = 1 << 20;
    if a.ctx > MOST || a.slots > MOST {
        let (flag, v) = if a.ctx > MOST { ("--ctx", a.ctx) } else { ("--slots", a.slots) };
        return Err(
            crate::job::exit::UsageError::new(format!("{flag} {v}: the memory plan takes at most {MOST}")).into()
        );
    }
    let opts = DoctorOptions {
        sys_root: PathBuf::from(crate::sys::topology::SYS_ROOT),
        model: a.model.clone(),
        ctx: a.ctx,
        slots: a.slots,
        ptx_dir: crate::backend::cuda::compile::kernels::ptx_dir_for(a.ptx_dir.clone()),
        numa: NumaMode::parse(&a.numa)?,
        threads: a.threads,
        measure: a.measure,
        require_gpu: a.require_gpu,
    };
    Ok(gather(&opts))
}
