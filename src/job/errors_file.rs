//! `<output>.errors.jsonl`: the error rows of a job, one line each `{"id", "line"?, "kind",
//! "message"}` in input order, rewritten at the end of every run (completed, aborted past
//! `--max-errors`, or interrupted) from what is committed, so the failed records and their
//! reasons can be read without digging in the checkpoint. Empty when there are none.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::writer::{sync_parent, RowLines};

pub fn errors_path(output: &Path) -> PathBuf {
    let mut p = output.as_os_str().to_owned();
    p.push(".errors.jsonl");
    PathBuf::from(p)
}

/// The errors-file line of a row, when it is an error row: a pipeline row's `error: {kind,
/// message}` or an OpenAI batch line's `error: {code, message}`.
pub fn entry(row: &str) -> Option<String> {
    // Cheap test first: every error row has `"error":{` outside any string.
    if !row.contains("\"error\":{") {
        return None;
    }
    let v: Value = serde_json::from_str(row).ok()?;
    let e = v.get("error")?.as_object()?;
    let kind = e.get("kind").or_else(|| e.get("code")).cloned().unwrap_or(Value::Null);
    let id = v.get("custom_id").filter(|_| v.get("response").is_some()).or_else(|| v.get("id")).cloned();
    let mut o = json!({"id": id.unwrap_or(Value::Null)});
    if let Some(line) = v.get("line") {
        o["line"] = line.clone();
    }
    o["kind"] = kind;
    o["message"] = e.get("message").cloned().unwrap_or(Value::Null);
    Some(o.to_string())
}

/// Writes the errors file of `output` (atomically: a temporary renamed over it).
pub fn write(output: &Path, lines: impl IntoIterator<Item = String>) -> std::io::Result<u64> {
    let path = errors_path(output);
    let mut tmp = path.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    let mut n = 0;
    for l in lines {
        w.write_all(l.as_bytes())?;
        w.write_all(b"\n")?;
        n += 1;
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    sync_parent(&path)?;
    Ok(n)
}

/// The error entries of a finished output, in its order.
pub fn from_output(output: &Path) -> Result<Vec<String>, super::writer::WriteError> {
    let mut v = Vec::new();
    for row in RowLines::open(output)? {
        if let Some(e) = entry(&row?) {
            v.push(e);
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::record::{ErrorKind, RecordError};

    #[test]
    fn error_rows_of_both_formats_become_entries_and_ok_rows_none() {
        let err = RecordError::new(ErrorKind::MissingField, "field 'text' is missing");
        let r = crate::job::writer::error_row(Some("a-1"), 3, &err);
        assert_eq!(entry(&r).unwrap(), r#"{"id":"a-1","kind":"missing_field","message":"field 'text' is missing"}"#);
        let r = crate::job::writer::error_row(None, 7, &err);
        assert_eq!(
            entry(&r).unwrap(),
            r#"{"id":null,"line":7,"kind":"missing_field","message":"field 'text' is missing"}"#
        );
        let r = crate::job::writer::openai_error_row(Some("req-9"), 2, &err);
        assert_eq!(entry(&r).unwrap(), r#"{"id":"req-9","kind":"missing_field","message":"field 'text' is missing"}"#);
        // An ok row whose output mentions an error is not one.
        let ok = r#"{"id":"x","output":"the \"error\":{ text","finish_reason":"stop","prompt_tokens":1,"generated_tokens":1}"#;
        assert_eq!(entry(ok), None);
        let ok = r#"{"id":"x","output":{"error":{"a":1}},"finish_reason":"stop"}"#;
        assert_eq!(entry(ok), None, "a JSON output's own error key is not the row's");
    }
}
