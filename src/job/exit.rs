//! The process exit codes of every command, and how an error is printed: one place, used by
//! `main` for all subcommands. [`ExitCode::ALL`] with [`ExitCode::meaning`] is the one list:
//! `--help` prints it ([`help`]) and a test checks README's "Exit codes" table against it.

use std::fmt::Write as _;

/// The process exit code of a command; [`ExitCode::meaning`] says when each is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitCode {
    Ok = 0,
    Failure = 1,
    Usage = 2,
    RecordErrors = 3,
    Interrupted = 4,
    Busy = 5,
}

impl ExitCode {
    /// Every code, in numeric order.
    pub const ALL: [ExitCode; 6] = [
        ExitCode::Ok,
        ExitCode::Failure,
        ExitCode::Usage,
        ExitCode::RecordErrors,
        ExitCode::Interrupted,
        ExitCode::Busy,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    /// When a command exits with this code.
    pub fn meaning(self) -> &'static str {
        match self {
            ExitCode::Ok => {
                "done (a job: every record succeeded, or the error rows are within --allow-errors / \
                 --max-error-rate; or it was already finished)"
            }
            ExitCode::Failure => {
                "an error: unreadable input, model or device failure, disk full...; a job's checkpoint stays \
                 consistent, so the same command resumes"
            }
            ExitCode::Usage => {
                "usage error: bad flags, an unknown or invalid pipeline, a missing input, model or shard \
                 output, shard outputs that do not belong together, an unsupported model or compressed format, an output that would overwrite an input \
                 (or that exists, for convert, quantize and synth), a checkpoint or finished output of a \
                 different job; the same command fails the same way"
            }
            ExitCode::RecordErrors => {
                "some records failed: the job finished with error rows (output and report written), or it \
                 stopped past --max-errors (checkpoint kept)"
            }
            ExitCode::Interrupted => {
                "interrupted by SIGINT/SIGTERM; a job's checkpoint is kept: the same command resumes (convert, \
                 quantize and synth remove what they had written: the same command starts over)"
            }
            ExitCode::Busy => {
                "busy: another run of this job holds its lock (<output>.dustoff.lock); nothing was done: the same \
                 command succeeds once that run ends (a cron wrapper can skip the night or retry later)"
            }
        }
    }
}

/// The funnel's last step: `main` returns this to the OS.
impl From<ExitCode> for std::process::ExitCode {
    fn from(c: ExitCode) -> Self {
        std::process::ExitCode::from(c.code())
    }
}

/// The "Exit codes" section of `--help`.
pub fn help() -> String {
    let mut s = String::from("Exit codes:\n");
    for c in ExitCode::ALL {
        let _ = writeln!(s, "  {}  {}", c.code(), c.meaning());
    }
    s
}

pub use super::usage::UsageError;

/// The exit code of a completed job with `errors` error rows among `rows`: 0 where `tolerance`
/// (`--allow-errors`, `--max-error-rate`) allows them, else [`ExitCode::RecordErrors`].
pub fn of_completed(tolerance: &super::tolerance::ErrorTolerance, errors: u64, rows: u64) -> ExitCode {
    if tolerance.tolerates(errors, rows) {
        ExitCode::Ok
    } else {
        ExitCode::RecordErrors
    }
}

/// A rerun of a finished job whose identity and output are unchanged (`run`, `generate
/// --input`): says so (`same`: what matched, in the job's words) and exits as the finished job
/// would under this run's tolerance: 0, or 3 when its error rows are over it.
pub fn nothing_to_do(
    output: &std::path::Path,
    f: &super::identity::FinishedIdentity,
    tolerance: &super::tolerance::ErrorTolerance,
    same: &str,
) -> ExitCode {
    eprintln!(
        "nothing to do: {} is the finished output of this same job ({same} unchanged; {} rows, {} error \
         rows). Add --restart to compute it again",
        output.display(),
        f.rows,
        f.error_rows
    );
    let code = of_completed(tolerance, f.error_rows, f.rows);
    if code != ExitCode::Ok {
        eprintln!(
            "its {} error rows are over the tolerance ({}): exit {}, as when it finished",
            f.error_rows,
            tolerance.describe(),
            code.code()
        );
    }
    code
}

/// Whether an error is the user's to fix in the command line (exit code 2): a [`UsageError`],
/// an unknown or invalid pipeline, a bad `--shard`, a checkpoint of a different job. (A job
/// held by another run is [`ExitCode::Busy`], see [`code_of`].)
pub fn is_usage_error(e: &anyhow::Error) -> bool {
    use super::checkpoint::CheckpointError;
    use super::pipeline::PipelineError;
    use super::shard::ShardError;
    e.chain().any(|c| {
        c.is::<UsageError>()
            || matches!(c.downcast_ref::<super::outputs::OutputError>(), Some(super::outputs::OutputError::Usage(_)))
            || matches!(
                c.downcast_ref::<CheckpointError>(),
                Some(
                    CheckpointError::Mismatch { .. }
                        | CheckpointError::NotAFolder { .. }
                        | CheckpointError::Corrupt { .. }
                        | CheckpointError::Version { .. }
                )
            )
            || matches!(
                c.downcast_ref::<super::identity::IdentityError>(),
                Some(super::identity::IdentityError::Changed { .. } | super::identity::IdentityError::Foreign { .. })
            )
            || matches!(c.downcast_ref::<PipelineError>(), Some(p) if !matches!(p, PipelineError::Io { .. }))
            || c.downcast_ref::<crate::quantize::QuantizeError>().is_some_and(|q| q.is_usage())
            || matches!(
                c.downcast_ref::<super::reader::ReadError>(),
                Some(
                    super::reader::ReadError::Decompress(super::decompress::DecompressError::Unsupported { .. })
                        | super::reader::ReadError::NoMatch(_)
                        | super::reader::ReadError::NotAFile(_)
                        | super::reader::ReadError::Folder(_)
                        | super::reader::ReadError::Pattern { .. }
                )
            )
            || model_usage(c)
            || matches!(
                c.downcast_ref::<ShardError>(),
                Some(
                    ShardError::Spec(_)
                        | ShardError::Env { .. }
                        | ShardError::NoCount { .. }
                        | ShardError::NoIndex
                        | ShardError::CountDisagrees { .. }
                        | ShardError::Missing(_)
                        | ShardError::Merge(_)
                        | ShardError::Order { .. }
                )
            )
    })
}

/// A model the command names that is not there, or whose architecture dustoff does not run
/// (exit 2 for every command: the command has to change). Several of these errors wrap the
/// loader's transparently, so the wrapper is looked into.
fn model_usage(c: &(dyn std::error::Error + 'static)) -> bool {
    use crate::model::config::ConfigError;
    use crate::model::convert::ConvertError;
    use crate::model::hf::HfError;
    use crate::model::loader::LoadError;
    // A Hugging Face config.json naming what dustoff does not run (an architecture, or a key
    // such as `hidden_act: gelu`, `mlp_bias`, a sliding window): docs/QUANTIZE.md's exit 2.
    let hf = |h: &HfError| matches!(h, HfError::UnsupportedArch { .. } | HfError::Config { .. });
    let load = |l: &LoadError| match l {
        LoadError::NotFound(_) | LoadError::Config(ConfigError::UnsupportedArch { .. }) => true,
        LoadError::Hf(h) => hf(h),
        _ => false,
    };
    c.downcast_ref::<LoadError>().is_some_and(load)
        || matches!(c.downcast_ref::<ConfigError>(), Some(ConfigError::UnsupportedArch { .. }))
        || c.downcast_ref::<HfError>().is_some_and(hf)
        || matches!(c.downcast_ref::<crate::quantize::QuantizeError>(), Some(crate::quantize::QuantizeError::Load(l)) if load(l))
        || matches!(c.downcast_ref::<ConvertError>(), Some(ConvertError::Usage(_)))
        || matches!(c.downcast_ref::<ConvertError>(), Some(ConvertError::Hf(h)) if hf(h))
        || matches!(c.downcast_ref::<ConvertError>(), Some(ConvertError::Load(l)) if load(l))
}

/// Whether another run holds the job's lock (exit code 5: waiting would help).
pub fn is_busy(e: &anyhow::Error) -> bool {
    use super::lock::LockError;
    e.chain().any(|c| matches!(c.downcast_ref::<LockError>(), Some(LockError::Held { .. })))
}

/// The exit code of a failed command.
pub fn code_of(e: &anyhow::Error) -> ExitCode {
    if e.chain().any(|c| c.is::<crate::sys::interrupt::Interrupted>()) {
        ExitCode::Interrupted
    } else if is_busy(e) {
        ExitCode::Busy
    } else if is_usage_error(e) {
        ExitCode::Usage
    } else {
        ExitCode::Failure
    }
}

/// The error and its causes on one line, each cause once. Many error types here put their
/// cause's text in their own message (`"cannot write {path}: {source}"`) and also return it as
/// `source()`; printing the whole chain would then say it twice. A cause whose text the line
/// already holds is left out.
pub fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for c in e.chain() {
        let text = c.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        let _ = write!(out, "{text}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot write {path}: {source}")]
    struct Wrapping {
        path: String,
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(2);
        let e = anyhow::Error::new(Wrapping { path: "/tmp/out.jsonl".into(), source: io }).context("writing rows");
        let s = describe(&e);
        assert_eq!(s.matches("No such file or directory").count(), 1, "{s}");
        assert!(s.starts_with("writing rows: cannot write /tmp/out.jsonl: "), "{s}");
        // A cause that is not in the message is kept.
        let e = anyhow::Error::new(std::io::Error::from_raw_os_error(28)).context("committing rows");
        assert_eq!(describe(&e), format!("committing rows: {}", std::io::Error::from_raw_os_error(28)));
    }

    #[test]
    fn codes_are_listed_once_in_order_and_readme_agrees() {
        for (i, c) in ExitCode::ALL.iter().enumerate() {
            assert_eq!(usize::from(c.code()), i, "{c:?}");
        }
        let h = help();
        assert_eq!(h.lines().count(), 1 + ExitCode::ALL.len(), "{h}");
        // README's table has one row per code, in order (its wording may say more).
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        let section = readme.split("## Exit codes").nth(1).expect("README has an \"Exit codes\" section");
        let rows: Vec<u8> = section
            .lines()
            .take_while(|l| !l.starts_with("## "))
            .filter_map(|l| l.strip_prefix("| ")?.split(' ').next()?.parse().ok())
            .collect();
        assert_eq!(rows, ExitCode::ALL.map(ExitCode::code), "README's exit-code rows");
    }

    #[test]
    fn usage_errors_are_found_anywhere_in_the_chain() {
        let e = anyhow::Error::new(UsageError::new("--slots must be at least 1")).context("parsing flags");
        assert_eq!(code_of(&e), ExitCode::Usage);
        let e = anyhow::anyhow!("disk on fire");
        assert_eq!(code_of(&e), ExitCode::Failure);
        let held = super::super::lock::LockError::Held {
            output: "out.jsonl".into(),
            lock: "out.jsonl.dustoff.lock".into(),
            pid: Some(7),
        };
        let e = anyhow::Error::new(held).context("starting the job");
        assert_eq!(code_of(&e), ExitCode::Busy, "a held lock is its own code, not a usage error");
    }
}
