//! The process exit codes of every command, and how an error is printed: one place, used by
//! `main` for all subcommands (README: "Exit codes").
//!
//! - 0: done, and every record succeeded.
//! - 1: any other error (unreadable input, model or device failure, disk full...). The message
//!   says what failed; a job's checkpoint stays consistent, so the same command resumes.
//! - 2: usage error: bad flags (`--slots 0`, `--device gpu`, a bare `generate`), an unknown or
//!   invalid pipeline, a bad shard, an output that would overwrite an input, another run
//!   holding the job's lock, a checkpoint of a different job. Retrying the same command fails
//!   the same way.
//! - 3: some records failed: the job finished with error rows (output and report written; the
//!   summary says how many and of which kinds), or it stopped past `--max-errors` (no output,
//!   checkpoint kept).
//! - 4: interrupted by SIGINT/SIGTERM; the checkpoint is kept: the same command resumes.

use std::fmt::Write as _;

/// The process exit code of a command. See the module docs for the meaning of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum ExitCode {
    Ok = 0,
    Failure = 1,
    Usage = 2,
    /// Error rows in a finished job, or stopped past `--max-errors`.
    RecordErrors = 3,
    Interrupted = 4,
}

impl ExitCode {
    pub fn code(self) -> u8 {
        self as i32 as u8
    }
}

/// A mistake in the command line that the user has to fix (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl UsageError {
    pub fn new(msg: impl Into<String>) -> Self {
        UsageError(msg.into())
    }
}

/// Whether an error is the user's to fix in the command line (exit code 2): a [`UsageError`],
/// an unknown or invalid pipeline, a bad `--shard`, a checkpoint of a different job or one held
/// by another run.
pub fn is_usage_error(e: &anyhow::Error) -> bool {
    use super::checkpoint::CheckpointError;
    use super::lock::LockError;
    use super::pipeline::PipelineError;
    use super::shard::ShardError;
    e.chain().any(|c| {
        c.is::<UsageError>()
            || matches!(c.downcast_ref::<super::outputs::OutputError>(), Some(super::outputs::OutputError::Usage(_)))
            || matches!(c.downcast_ref::<LockError>(), Some(LockError::Held { .. }))
            || matches!(c.downcast_ref::<CheckpointError>(), Some(CheckpointError::Mismatch { .. }))
            || matches!(c.downcast_ref::<PipelineError>(), Some(p) if !matches!(p, PipelineError::Io { .. }))
            || c.downcast_ref::<crate::quantize::QuantizeError>().is_some_and(|q| q.is_usage())
            || matches!(
                c.downcast_ref::<ShardError>(),
                Some(ShardError::Spec(_) | ShardError::Env { .. } | ShardError::NoCount { .. })
            )
    })
}

/// The exit code of a failed command.
pub fn code_of(e: &anyhow::Error) -> ExitCode {
    if is_usage_error(e) {
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
    fn usage_errors_are_found_anywhere_in_the_chain() {
        let e = anyhow::Error::new(UsageError::new("--slots must be at least 1")).context("parsing flags");
        assert_eq!(code_of(&e), ExitCode::Usage);
        let e = anyhow::anyhow!("disk on fire");
        assert_eq!(code_of(&e), ExitCode::Failure);
    }
}
