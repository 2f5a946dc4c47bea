//! Why a request stopped generating: shared by the engine, the single-sequence loop and the
//! job layer (rows carry it as `finish_reason`).

use serde::Serialize;

/// How a generation ended (written as `"stop"` / `"length"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-generation token was produced (it is not part of the output).
    Stop,
    /// `max_tokens` were generated.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}
