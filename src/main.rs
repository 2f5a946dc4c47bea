//! dustoff binary: parses the command line (`dustoff::cli`), starts the job log, places threads,
//! and ends every command in one exit funnel, `main`, with the codes of `dustoff::job::exit`.

use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches};

use dustoff::cli::{Cli, Cmd};

use dustoff::commands::device_choice::{self, Device};
use dustoff::job::exit::{self, ExitCode as Code, UsageError};

/// The tokenizer allocates many small strings per record; mimalloc halves the time glibc's
/// allocator took in a dry run over 100k records (malloc/free were ~45% of the profile).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The one exit funnel: every command's result becomes one exit code of `dustoff::job::exit`
/// (listed at the end of `--help`), and an error is printed once, each cause once.
fn main() -> ExitCode {
    // A closed pipe (`dustoff run ... --dry-run | head -1`) ends the process quietly, as it
    // does other Unix tools, instead of a panic in `println!` (exit 101). A job killed this way
    // resumes from its checkpoint like after any other kill.
    #[cfg(unix)]
    // SAFETY: sets the default disposition of one signal before any thread exists; no Rust
    // state is touched.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Before any thread exists (it changes the process environment).
    dustoff::backend::cuda::plan::memory::default_cublas_workspace();
    let matches = Cli::command().after_help(exit::help()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Unattended jobs (run, generate --input): timestamps on stderr's lines when it is not a
    // terminal, and run's --log-file. Held to the end of main, so the error line below goes
    // through it too.
    let log_file = match &cli.cmd {
        Cmd::Run(a) => Some(a.log_file.as_deref()),
        Cmd::Generate(a) if a.input.is_some() => Some(None),
        _ => None,
    };
    let _log = match log_file {
        Some(file) => {
            use std::io::IsTerminal;
            match dustoff::job::log::LogTee::start(!std::io::stderr().is_terminal(), file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Code::Usage.into();
                }
            }
        }
        None => None,
    };
    match place_threads(&cli).and_then(|()| dustoff::cli::run(cli)) {
        Ok(code) => code.into(),
        Err(e) => {
            eprintln!("error: {}", exit::describe(&e));
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull)
            }) {
                eprintln!(
                    "the disk is full: free some space, then run the same command; a job resumes from its checkpoint"
                );
            }
            exit::code_of(&e).into()
        }
    }
}

/// `DUSTOFF_CPU_PATH`, `--numa` and `--threads`: checked, applied (pinning, the rayon pool)
/// before any work, and logged for the commands that compute. Bad values are usage errors.
fn place_threads(cli: &Cli) -> Result<()> {
    dustoff::sys::cpu::check_path_env().map_err(|e| UsageError::new(e.to_string()))?;
    let device = match &cli.cmd {
        Cmd::Generate(a) => Some(a.model.device.as_str()),
        Cmd::Run(a) if !a.dry_run => Some(a.model.device.as_str()),
        Cmd::Bench(a) => Some(a.device.as_str()),
        _ => None,
    };
    let ordinal = match device.map(device_choice::parse_device) {
        Some(Ok(Device::Cuda(n))) => Some(n),
        _ => None,
    };
    match dustoff::sys::threads::setup_cli(&cli.numa, cli.threads, ordinal) {
        Ok(p) => {
            if device.is_some() {
                eprintln!("{}", p.describe());
            }
            Ok(())
        }
        // The message alone, as it was printed before the funnel took these errors.
        Err(e) if e.is_usage() => Err(UsageError::new(e.to_string()).into()),
        Err(e) => Err(anyhow::anyhow!("{e}")),
    }
}
