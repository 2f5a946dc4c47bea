//! `dustoff tokenize`: `{"id", "text", "add_bos", "parse_special"}` lines -> `{"id", "ids"}`.

use std::path::Path;

use anyhow::Result;
use serde_json::{json, Value};

use super::jsonl::{read_jsonl, JsonlWriter};
use crate::tokenizer::Tokenizer;

pub fn run(tok: &Tokenizer, input: &Path, output: &Path) -> Result<usize> {
    // The input is read before the output is touched: a wrong --input leaves an existing output as it was.
    let records = read_jsonl(input)?;
    let mut w = JsonlWriter::create(output)?;
    let mut errors = 0;
    for (line, rec) in records {
        let row = match rec {
            Err(msg) => Err((Value::Null, msg)),
            Ok(v) => tokenize_record(tok, &v).map_err(|e| (v.get("id").cloned().unwrap_or(Value::Null), e)),
        };
        let row = row.unwrap_or_else(|(id, msg)| {
            errors += 1;
            eprintln!("{}:{line}: {msg}", input.display());
            json!({"id": id, "line": line, "error": msg})
        });
        w.write(&row)?;
    }
    w.finish()?;
    Ok(errors)
}

fn tokenize_record(tok: &Tokenizer, v: &serde_json::Value) -> Result<serde_json::Value, String> {
    let id = v.get("id").cloned().unwrap_or(serde_json::Value::Null);
    let text = v.get("text").and_then(|t| t.as_str()).ok_or("field 'text' is missing or not a string")?;
    let add_bos = match v.get("add_bos") {
        None => tok.add_bos_default(),
        Some(b) => b.as_bool().ok_or("field 'add_bos' is not a bool")?,
    };
    let parse_special = match v.get("parse_special") {
        None => false,
        Some(b) => b.as_bool().ok_or("field 'parse_special' is not a bool")?,
    };
    let ids = tok.encode(text, add_bos, parse_special).map_err(|e| e.to_string())?;
    Ok(json!({"id": id, "ids": ids}))
}
