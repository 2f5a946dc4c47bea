//! What the rows of a finished output say about their quality: how each generation ended
//! (`finish_reason`) and the row flags (`input_truncated`, `empty_output`), counted over the
//! whole output (rows of earlier runs and reused rows included) in the same pass that collects
//! its error rows for `<output>.errors.jsonl`. The end summary prints them ("23 of 24 rows
//! stopped at max_tokens") and the report keeps them (`rows`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::writer::{RowLines, WriteError};

/// Counts over the rows of one output.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowStats {
    pub rows: u64,
    pub error_rows: u64,
    /// `finish_reason` of the ok rows: `stop` (an end-of-generation token), `length`
    /// (`max_tokens` reached).
    pub finish_reasons: BTreeMap<String, u64>,
    /// Ok rows whose prompt was cut to `limits.max_input_tokens`.
    pub input_truncated: u64,
    /// Ok rows whose answer is empty or only whitespace.
    pub empty_output: u64,
}

impl RowStats {
    /// Counts one row line (a pipeline row or an OpenAI batch output line).
    pub fn add(&mut self, row: &str) {
        self.rows += 1;
        let Ok(v) = serde_json::from_str::<Value>(row) else { return };
        if v.get("error").is_some_and(Value::is_object) {
            self.error_rows += 1;
            return;
        }
        // OpenAI batch lines keep the reason and the text in the response's first choice.
        let choice = v.pointer("/response/body/choices/0");
        let reason = match choice {
            Some(c) => c.get("finish_reason"),
            None => v.get("finish_reason"),
        };
        if let Some(r) = reason.and_then(Value::as_str) {
            *self.finish_reasons.entry(r.to_string()).or_insert(0) += 1;
        }
        self.input_truncated += u64::from(v.get("input_truncated").and_then(Value::as_bool).unwrap_or(false));
        let empty = match choice {
            Some(c) => c
                .pointer("/message/content")
                .or_else(|| c.get("text"))
                .and_then(Value::as_str)
                .is_some_and(|t| t.trim().is_empty()),
            None => v.get("empty_output").and_then(Value::as_bool).unwrap_or(false),
        };
        self.empty_output += u64::from(empty);
    }

    /// The lines of the end summary: finish reasons and flags.
    pub fn summary(&self) -> String {
        let ok = self.rows - self.error_rows;
        let mut s = String::new();
        if ok > 0 {
            let mut parts = Vec::new();
            let mut reasons: Vec<(&String, &u64)> = self.finish_reasons.iter().collect();
            // The most common first: "23 of 24 rows stopped at max_tokens".
            reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            for (i, (r, n)) in reasons.into_iter().enumerate() {
                let what = match r.as_str() {
                    "length" => "at max_tokens (\"length\")".to_string(),
                    "stop" => "at an end-of-text token (\"stop\")".to_string(),
                    other => format!("with \"{other}\""),
                };
                parts.push(if i == 0 { format!("{n} of {ok} rows stopped {what}") } else { format!("{n} {what}") });
            }
            if !parts.is_empty() {
                s += &format!("finish: {}\n", parts.join(", "));
            }
            s += &format!(
                "flags: {} rows with input_truncated (prompt cut to limits.max_input_tokens), {} with empty_output\n",
                self.input_truncated, self.empty_output
            );
        }
        s
    }
}

/// One pass over a finished output: its error entries (for `<output>.errors.jsonl`) and its
/// row counts.
pub fn scan_output(output: &Path) -> Result<(Vec<String>, RowStats), WriteError> {
    let mut errors = Vec::new();
    let mut stats = RowStats::default();
    for row in RowLines::open(output)? {
        let row = row?;
        stats.add(&row);
        if let Some(e) = super::errors_file::entry(&row) {
            errors.push(e);
        }
    }
    Ok((errors, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::record::{ErrorKind, OpenAiEndpoint, RecordError};
    use crate::job::writer::{error_row, ok_row, openai_ok_row, RowOutput};

    #[test]
    fn rows_of_both_formats_are_counted_and_summarized() {
        let mut s = RowStats::default();
        let text = |t: &str| RowOutput::Text(t.into());
        for i in 0..23 {
            s.add(&ok_row(&format!("r{i}"), &text("a summary"), "length", 40, 8, i < 2));
        }
        s.add(&ok_row("e", &text("  "), "stop", 40, 1, false));
        s.add(&error_row(Some("x"), 3, &RecordError::new(ErrorKind::MissingField, "no text")));
        s.add(&openai_ok_row("o1", OpenAiEndpoint::Chat, "m", "", "stop", 5, 1));
        s.add(&openai_ok_row("o2", OpenAiEndpoint::Completion, "m", "ok", "length", 5, 4));
        assert_eq!(s.rows, 27);
        assert_eq!(s.error_rows, 1);
        assert_eq!(s.finish_reasons.get("length"), Some(&24));
        assert_eq!(s.finish_reasons.get("stop"), Some(&2));
        assert_eq!((s.input_truncated, s.empty_output), (2, 2));
        let text = s.summary();
        assert!(
            text.starts_with("finish: 24 of 26 rows stopped at max_tokens (\"length\"), 2 at an end-of-text token"),
            "{text}"
        );
        assert!(text.contains("2 rows with input_truncated"), "{text}");
        assert!(text.contains("2 with empty_output"), "{text}");
        assert_eq!(RowStats::default().summary(), "", "no ok rows: nothing to say");
    }
}
