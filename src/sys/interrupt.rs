//! SIGINT / SIGTERM as a request to stop: the first signal sets a flag that long work reads at
//! its next safe point (a job between steps, `quantize` / `convert` / `synth` between tensors and
//! calibration windows), so nothing half-written is left; a second signal exits at once with
//! code 4 (what a job committed is crash-safe; a command writing a file may then leave its
//! `.partial`, which the next run replaces).

use std::sync::atomic::{AtomicBool, Ordering};

/// Written only by the signal handler (a handler cannot capture state).
static SIGNALLED: AtomicBool = AtomicBool::new(false);

/// Work stopped by SIGINT/SIGTERM before it was complete (exit code 4).
#[derive(Debug, thiserror::Error)]
#[error("interrupted by SIGINT/SIGTERM {0}")]
pub struct Interrupted(pub String);

#[cfg(unix)]
mod sig {
    use super::{Ordering, SIGNALLED};
    pub const SIGINT: i32 = 2;
    pub const SIGTERM: i32 = 15;
    extern "C" {
        // libc `signal(2)`; glibc gives BSD semantics (handler stays installed, SA_RESTART).
        fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
        fn _exit(code: i32) -> !;
    }
    extern "C" fn on_signal(_sig: i32) {
        // Only async-signal-safe work here: an atomic swap, and `_exit` on a second signal.
        if SIGNALLED.swap(true, Ordering::SeqCst) {
            // SAFETY: `_exit` is async-signal-safe and never returns.
            unsafe { _exit(4) }
        }
    }
    pub fn uninstall() {
        // SAFETY: SIG_DFL is a valid disposition for both signals; no Rust state is touched.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
        }
    }
    pub fn install() -> bool {
        const SIG_ERR: usize = usize::MAX;
        // SAFETY: `on_signal` has the C ABI `void (*)(int)` that `signal` expects and only
        // touches an atomic; installing it has no other effect on Rust state.
        unsafe { signal(SIGINT, on_signal) != SIG_ERR && signal(SIGTERM, on_signal) != SIG_ERR }
    }
}

/// Gives SIGINT/SIGTERM back their default action (the process ends), for work past the last
/// safe point (a verification after the file is written), which would otherwise not stop at all.
pub fn uninstall() {
    #[cfg(unix)]
    sig::uninstall();
}

/// Installs the handlers (again is harmless); `false` where they cannot be installed (then a
/// signal ends the process as usual).
pub fn install() -> bool {
    #[cfg(unix)]
    {
        sig::install()
    }
    #[cfg(not(unix))]
    {
        false
    }
}

/// Whether a signal asked to stop (only ever true after [`install`]).
pub fn requested() -> bool {
    SIGNALLED.load(Ordering::Relaxed)
}

/// Ends the handled part: a signal that came after the last check is reported (`Err`, naming
/// `what` was done), and later ones end the process at once ([`uninstall`]).
pub fn finish(what: impl FnOnce() -> String) -> Result<(), Interrupted> {
    uninstall();
    check(what)
}

/// `Err(Interrupted)` naming `what` was cut short, once a signal asked to stop.
pub fn check(what: impl FnOnce() -> String) -> Result<(), Interrupted> {
    if requested() {
        Err(Interrupted(what()))
    } else {
        Ok(())
    }
}
