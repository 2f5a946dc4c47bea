//! The error of a command line the user has to fix (exit code 2, see `exit`): its own leaf
//! module, so that the checks which raise it (`outputs`, `tolerance`) need not import the exit
//! policy, which reads their errors back to choose a code.

/// A mistake in the command line that the user has to fix (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl UsageError {
    pub fn new(msg: impl Into<String>) -> Self {
        UsageError(msg.into())
    }
}
