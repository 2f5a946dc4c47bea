//! A pipeline's output shape (`[output]`): the grammar the decoder follows, and the check each
//! finished text passes before it becomes a result row.
//!
//! ```toml
//! [output]
//! kind = "json"                     # text | json | choice | regex
//! schema_file = "entities.schema.json"   # or: schema = { type = "object", ... } (inline)
//! # kind = "choice": choices = ["politics", "business"]; kind = "regex": pattern = "[0-9]{4}"
//! ```
//!
//! The grammar makes every row parse; the check is what a row is judged by. A JSON row is
//! parsed and validated against the schema with the `jsonschema` crate (independently of the
//! grammar that produced it) and written as an object. A generation cut off at `max_tokens`
//! before the grammar completed becomes a `truncated` error row.

use std::path::Path;

use serde_json::Value;

use super::output_spec::{parse_json_output, OutputKind, OutputSpec};
use super::record::{ErrorKind, RecordError};
use super::writer::RowOutput;
use crate::engine::constraint::OutputConstraint;
use crate::engine::finish::FinishReason;

/// The compiled `[output]` section.
pub struct OutputShape {
    kind: OutputKind,
    constraint: Option<OutputConstraint>,
    required_keys: Vec<String>,
    validator: Option<jsonschema::Validator>,
    /// The regex, anchored at both ends.
    pattern: Option<regex::Regex>,
    /// The bytes of `schema_file` (they change the job like the pipeline's own bytes do).
    pub schema_file_bytes: Vec<u8>,
}

impl OutputShape {
    /// Reads and checks the section (`pipeline` locates `schema_file`); the grammar is compiled
    /// once against a byte vocabulary so that a schema llguidance cannot take is refused now,
    /// before the model loads. Errors are the message of a `PipelineError::Invalid`.
    pub fn from_spec(o: &OutputSpec, pipeline: &Path) -> Result<Self, String> {
        let only = |field: &str, set: bool, kind: &str| {
            if set {
                Err(format!("output.{field} needs output.kind = \"{kind}\""))
            } else {
                Ok(())
            }
        };
        if o.kind != OutputKind::Json {
            only("required_keys", !o.required_keys.is_empty(), "json")?;
            only("schema", o.schema.is_some(), "json")?;
            only("schema_file", o.schema_file.is_some(), "json")?;
        }
        if o.kind != OutputKind::Choice {
            only("choices", !o.choices.is_empty(), "choice")?;
        }
        if o.kind != OutputKind::Regex {
            only("pattern", o.pattern.is_some(), "regex")?;
        }
        let mut shape = OutputShape {
            kind: o.kind,
            constraint: None,
            required_keys: o.required_keys.clone(),
            validator: None,
            pattern: None,
            schema_file_bytes: Vec::new(),
        };
        let constraint = match o.kind {
            OutputKind::Text => return Ok(shape),
            OutputKind::Json => {
                let schema = shape.schema(o, pipeline)?;
                let v = jsonschema::validator_for(&schema).map_err(|e| format!("output schema is not valid: {e}"))?;
                shape.validator = Some(v);
                OutputConstraint::Json(schema)
            }
            OutputKind::Choice => OutputConstraint::Choice(o.choices.clone()),
            OutputKind::Regex => {
                let p = o.pattern.clone().ok_or("output.kind = \"regex\" needs output.pattern")?;
                let anchored = regex::Regex::new(&format!("^(?:{p})$"))
                    .map_err(|e| format!("output.pattern is not a valid regex: {e}"))?;
                shape.pattern = Some(anchored);
                OutputConstraint::Regex(p)
            }
        };
        constraint.check().map_err(|e| format!("output: {e}"))?;
        shape.constraint = Some(constraint);
        Ok(shape)
    }

    /// The JSON schema: inline, from `schema_file`, or (neither) any object with the
    /// `required_keys`.
    fn schema(&mut self, o: &OutputSpec, pipeline: &Path) -> Result<Value, String> {
        let schema = match (&o.schema, &o.schema_file) {
            (Some(_), Some(_)) => return Err("give output.schema or output.schema_file, not both".into()),
            (Some(s), None) => s.clone(),
            (None, Some(f)) => {
                let path = pipeline.parent().unwrap_or(Path::new(".")).join(f);
                let bytes = std::fs::read(&path)
                    .map_err(|e| format!("output.schema_file: cannot read {}: {e}", path.display()))?;
                let v = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("output.schema_file {} is not JSON: {e}", path.display()))?;
                self.schema_file_bytes = bytes;
                v
            }
            (None, None) => serde_json::json!({"type": "object", "required": o.required_keys}),
        };
        if !schema.is_object() {
            return Err("the output schema must be a JSON object".into());
        }
        Ok(schema)
    }

    /// The grammar generation follows (`None`: free text).
    pub fn constraint(&self) -> Option<&OutputConstraint> {
        self.constraint.as_ref()
    }

    /// Turns the model's text into the row's `output`, or the error row's reason.
    pub fn parse(&self, text: &str, finish: FinishReason) -> Result<RowOutput, RecordError> {
        let shown: String = text.chars().take(120).collect();
        let truncated = || {
            RecordError::new(
                ErrorKind::Truncated,
                format!(
                    "generation reached generation.max_tokens (finish_reason \"length\") before the output was complete: {shown:?}"
                ),
            )
        };
        let mismatch = |what: String| RecordError::new(ErrorKind::OutputMismatch, format!("{what}: {shown:?}"));
        match self.kind {
            OutputKind::Text => Ok(RowOutput::Text(text.trim().to_string())),
            OutputKind::Json => {
                let v = match parse_json_output(text, &self.required_keys) {
                    Ok(v) => v,
                    Err(_) if finish == FinishReason::Length => return Err(truncated()),
                    Err(e) => return Err(e),
                };
                if let Some(val) = &self.validator {
                    if let Some(e) = val.iter_errors(&v).next() {
                        let at = e.instance_path().to_string();
                        let at = if at.is_empty() { "the top level".to_string() } else { at };
                        return Err(mismatch(format!("model output breaks the output schema at {at}: {e}")));
                    }
                }
                Ok(RowOutput::Json(v))
            }
            OutputKind::Choice => {
                let choices = match &self.constraint {
                    Some(OutputConstraint::Choice(c)) => c.as_slice(),
                    _ => &[],
                };
                match choices.iter().find(|c| c.as_str() == text) {
                    Some(c) => Ok(RowOutput::Text(c.clone())),
                    None if finish == FinishReason::Length => Err(truncated()),
                    None => Err(mismatch("model output is not one of output.choices".into())),
                }
            }
            OutputKind::Regex => match &self.pattern {
                Some(p) if p.is_match(text) => Ok(RowOutput::Text(text.to_string())),
                _ if finish == FinishReason::Length => Err(truncated()),
                _ => Err(mismatch("model output does not match output.pattern".into())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(toml_text: &str) -> OutputSpec {
        toml::from_str(toml_text).unwrap()
    }

    fn shape(toml_text: &str) -> Result<OutputShape, String> {
        OutputShape::from_spec(&spec(toml_text), Path::new("pipelines/x.toml"))
    }

    #[test]
    fn json_rows_are_validated_against_the_schema_and_truncation_is_named() {
        let s = shape(
            r#"kind = "json"
            schema = { type = "object", properties = { tags = { type = "array", items = { type = "string" }, maxItems = 2 } }, required = ["tags"] }"#,
        )
        .unwrap();
        assert!(matches!(s.constraint(), Some(OutputConstraint::Json(_))));
        let ok = s.parse(r#"{"tags": ["a", "b"]}"#, FinishReason::Stop).unwrap();
        assert_eq!(ok, RowOutput::Json(serde_json::json!({"tags": ["a", "b"]})));
        let e = s.parse(r#"{"tags": ["a", "b", "c"]}"#, FinishReason::Stop).unwrap_err();
        assert_eq!(e.kind, ErrorKind::OutputMismatch);
        assert!(e.message.contains("/tags"), "{}", e.message);
        assert_eq!(s.parse(r#"{"tags": [1]}"#, FinishReason::Stop).unwrap_err().kind, ErrorKind::OutputMismatch);
        let cut = s.parse(r#"{"tags": ["a", "#, FinishReason::Length).unwrap_err();
        assert_eq!(cut.kind, ErrorKind::Truncated);
        assert!(cut.message.contains("length"), "{}", cut.message);
        assert_eq!(s.parse(r#"{"tags": ["a", "#, FinishReason::Stop).unwrap_err().kind, ErrorKind::OutputNotJson);
    }

    #[test]
    fn json_without_a_schema_is_any_object_with_the_required_keys() {
        let s = shape("kind = \"json\"\nrequired_keys = [\"a\"]").unwrap();
        let Some(OutputConstraint::Json(schema)) = s.constraint() else { panic!("no grammar") };
        assert_eq!(schema, &serde_json::json!({"type": "object", "required": ["a"]}));
        assert!(s.parse(r#"{"a": 1, "b": [true]}"#, FinishReason::Stop).is_ok());
        assert_eq!(s.parse(r#"{"b": 1}"#, FinishReason::Stop).unwrap_err().kind, ErrorKind::OutputNotJson);
    }

    #[test]
    fn choices_and_patterns_check_the_whole_text() {
        let c = shape(
            r#"kind = "choice"
            choices = ["sports", "science"]"#,
        )
        .unwrap();
        assert_eq!(c.parse("science", FinishReason::Stop).unwrap(), RowOutput::Text("science".into()));
        assert_eq!(c.parse("scien", FinishReason::Length).unwrap_err().kind, ErrorKind::Truncated);
        assert_eq!(c.parse("art", FinishReason::Stop).unwrap_err().kind, ErrorKind::OutputMismatch);
        let r = shape(
            r#"kind = "regex"
            pattern = "[0-9]{4}-[0-9]{2}""#,
        )
        .unwrap();
        assert!(r.parse("2026-12", FinishReason::Stop).is_ok());
        assert_eq!(r.parse("x2026-12", FinishReason::Stop).unwrap_err().kind, ErrorKind::OutputMismatch);
    }

    #[test]
    fn misplaced_or_broken_output_settings_are_refused() {
        let err = |t: &str| shape(t).err().unwrap_or_else(|| panic!("accepted: {t}"));
        assert!(err("kind = \"text\"\nchoices = [\"a\"]").contains("output.choices needs"));
        assert!(err("kind = \"choice\"\npattern = \"a\"").contains("output.pattern needs"));
        assert!(err("kind = \"regex\"").contains("needs output.pattern"));
        assert!(err("kind = \"regex\"\npattern = \"(a\"").contains("not a valid regex"));
        assert!(err("kind = \"json\"\nschema = { type = \"strnig\" }").contains("schema"));
        assert!(err("kind = \"json\"\nschema_file = \"missing.schema.json\"").contains("cannot read"));
        assert!(err("kind = \"json\"\nschema = { type = \"object\" }\nschema_file = \"a.json\"").contains("not both"));
        assert!(err("kind = \"choice\"\nchoices = []").contains("choices"));
    }
}
