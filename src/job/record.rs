//! The unit of work: one input record (`{index, line, id, fields}`) and the per-record errors that
//! turn a bad record into one error row instead of stopping the job.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Why a record produced an error row. The `snake_case` name is what the row's `error.kind` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The line is not a JSON object.
    MalformedJson,
    /// A field the pipeline needs (or the id) is absent or null.
    MissingField,
    /// A field has the wrong JSON/Arrow type (e.g. a number where text is needed).
    WrongType,
    /// The bytes of the line or value are not UTF-8.
    InvalidUtf8,
    /// The document field is empty or only whitespace.
    EmptyDocument,
    /// An earlier record of this input set has the same id.
    DuplicateId,
    /// The line is over the reader's byte limit, or the prompt is over `max_input_tokens` with
    /// `overflow = "error"`.
    InputTooLong,
    /// The prompt template failed to render for this record.
    Template,
    /// A JSON pipeline's model output did not parse as the expected JSON.
    OutputNotJson,
    /// The output parsed but breaks the pipeline's schema, choices or pattern.
    OutputMismatch,
    /// Generation reached `max_tokens` before a shaped output (JSON, choice, regex) was complete.
    Truncated,
    /// The engine failed on this record (not on the whole job).
    Generation,
    /// The record asks for something dustoff does not do (an OpenAI Batch request's `n` > 1,
    /// `stop`, penalties, tools...): run without it, its row would not be what was asked for.
    Unsupported,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 13] = [
        ErrorKind::MalformedJson,
        ErrorKind::MissingField,
        ErrorKind::WrongType,
        ErrorKind::InvalidUtf8,
        ErrorKind::EmptyDocument,
        ErrorKind::DuplicateId,
        ErrorKind::InputTooLong,
        ErrorKind::Template,
        ErrorKind::OutputNotJson,
        ErrorKind::OutputMismatch,
        ErrorKind::Truncated,
        ErrorKind::Generation,
        ErrorKind::Unsupported,
    ];

    /// The name written in rows and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::MalformedJson => "malformed_json",
            ErrorKind::MissingField => "missing_field",
            ErrorKind::WrongType => "wrong_type",
            ErrorKind::InvalidUtf8 => "invalid_utf8",
            ErrorKind::EmptyDocument => "empty_document",
            ErrorKind::DuplicateId => "duplicate_id",
            ErrorKind::InputTooLong => "input_too_long",
            ErrorKind::Template => "template",
            ErrorKind::OutputNotJson => "output_not_json",
            ErrorKind::OutputMismatch => "output_mismatch",
            ErrorKind::Truncated => "truncated",
            ErrorKind::Generation => "generation",
            ErrorKind::Unsupported => "unsupported",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A per-record failure: becomes one error row, the job goes on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct RecordError {
    pub kind: ErrorKind,
    pub message: String,
}

impl RecordError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        RecordError { kind, message: message.into() }
    }
}

/// One chat message of an OpenAI batch request (the tokenizer's chat turn type).
pub use crate::tokenizer::ChatMessage;

/// Which OpenAI endpoint a batch line addressed; decides the shape of its output line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpenAiEndpoint {
    /// `/v1/chat/completions` with `body.messages`.
    Chat,
    /// `/v1/completions` with `body.prompt`.
    Completion,
}

/// The request of one OpenAI Batch API input line (`custom_id` is the record id).
#[derive(Clone, Debug, PartialEq)]
pub struct OpenAiRequest {
    pub endpoint: OpenAiEndpoint,
    /// `body.model` as given (echoed in the output; the model actually run is `--model`).
    pub model: Option<String>,
    /// Chat messages (Chat endpoint).
    pub messages: Vec<ChatMessage>,
    /// Prompt text (Completion endpoint).
    pub prompt: String,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
}

/// What a good record carries.
#[derive(Clone, Debug, PartialEq)]
pub enum RecordBody {
    /// The fields the pipeline reads (only those: others are dropped at read time).
    Fields(Map<String, Value>),
    /// An OpenAI batch request.
    OpenAi(OpenAiRequest),
}

/// One item of the input stream: a record, or the error row that stands in for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// 0-based position in the whole input set (all files, in the order given), counting every
    /// record including those of other shards. Identifies the record across resumes and merges.
    pub index: u64,
    /// Which input file (position in the reader's file list).
    pub file: usize,
    /// 1-based line (JSONL) or row (Parquet) number within that file.
    pub line: u64,
    /// The record id; `None` when the line could not be parsed far enough to find it.
    pub id: Option<String>,
    pub body: Result<RecordBody, RecordError>,
}

impl Item {
    /// The string the shard hash and the per-record seed use: the id, or the position for
    /// records without one (stable across runs of the same input set).
    pub fn key(&self) -> String {
        match &self.id {
            Some(id) => id.clone(),
            None => format!("\u{0}index:{}", self.index),
        }
    }
}

/// Reads an id value: strings as is, integers in decimal (common in exported tables).
pub fn id_from_json(field: &str, v: Option<&Value>) -> Result<String, RecordError> {
    match v {
        None | Some(Value::Null) => {
            Err(RecordError::new(ErrorKind::MissingField, format!("id field '{field}' is missing")))
        }
        Some(Value::String(s)) if s.is_empty() => {
            Err(RecordError::new(ErrorKind::MissingField, format!("id field '{field}' is empty")))
        }
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        Some(other) => Err(RecordError::new(
            ErrorKind::WrongType,
            format!("id field '{field}' must be a string or an integer, got {}", json_type(other)),
        )),
    }
}

/// The JSON type name used in wrong-type messages.
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn error_kind_names_match_serde() {
        for k in ErrorKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), json!(k.as_str()));
        }
    }

    #[test]
    fn ids_from_strings_and_integers_only() {
        assert_eq!(id_from_json("id", Some(&json!("a-1"))).unwrap(), "a-1");
        assert_eq!(id_from_json("id", Some(&json!(42))).unwrap(), "42");
        assert_eq!(id_from_json("id", None).unwrap_err().kind, ErrorKind::MissingField);
        assert_eq!(id_from_json("id", Some(&json!(null))).unwrap_err().kind, ErrorKind::MissingField);
        assert_eq!(id_from_json("id", Some(&json!(1.5))).unwrap_err().kind, ErrorKind::WrongType);
        assert_eq!(id_from_json("id", Some(&json!([1]))).unwrap_err().kind, ErrorKind::WrongType);
    }
}
