//! The `[output]` section of a pipeline as written (what shape the model's answer must have) and
//! the parsing of a JSON answer: read by the pipeline loader and by the compiled output shape
//! (`output`), so neither of those needs the other's internals.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::record::{ErrorKind, RecordError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    /// Free text (no constraint).
    Text,
    /// A JSON value following `schema` / `schema_file` (default: any object).
    Json,
    /// One of `choices` (labels, for classification).
    Choice,
    /// A full match of `pattern`.
    Regex,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    #[serde(default = "default_kind")]
    pub kind: OutputKind,
    /// JSON without a schema: keys the object must have.
    #[serde(default)]
    pub required_keys: Vec<String>,
    /// JSON: the JSON Schema, inline (a TOML table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// JSON: a JSON Schema file, relative to the pipeline file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_file: Option<String>,
    /// Choice: the labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    /// Regex: the pattern the whole output matches (Rust `regex` syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// With `prompt.thinking`: the row field that keeps the reasoning (null when the model
    /// wrote no think block); without it the reasoning is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_field: Option<String>,
}

fn default_kind() -> OutputKind {
    OutputKind::Text
}

/// Parses a model's JSON answer: code fences are stripped; it must be an object with the keys.
pub fn parse_json_output(text: &str, required: &[String]) -> Result<Value, RecordError> {
    let mut t = text.trim();
    if let Some(rest) = t.strip_prefix("```") {
        let rest = rest.strip_prefix("json").unwrap_or(rest);
        t = rest.trim_end().strip_suffix("```").unwrap_or(rest).trim();
    }
    let shown: String = text.chars().take(120).collect();
    let v: Value = serde_json::from_str(t).map_err(|e| {
        RecordError::new(ErrorKind::OutputNotJson, format!("model output is not JSON ({e}): {shown:?}"))
    })?;
    let Value::Object(obj) = &v else {
        return Err(RecordError::new(
            ErrorKind::OutputNotJson,
            format!("model output is not a JSON object: {shown:?}"),
        ));
    };
    let missing: Vec<&str> = required.iter().filter(|k| !obj.contains_key(*k)).map(String::as_str).collect();
    if !missing.is_empty() {
        return Err(RecordError::new(
            ErrorKind::OutputNotJson,
            format!("model output lacks key(s) {}: {shown:?}", missing.join(", ")),
        ));
    }
    Ok(v)
}
