//! JSONL files of the small commands (`tokenize`, `generate --input`): read line by line with
//! each line's error kept, written with a final fsync.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};

/// Reads a JSONL file line by line: `(1-based line number, parsed value or error message)`.
/// Blank lines are skipped.
pub fn read_jsonl(path: &Path) -> Result<Vec<(usize, std::result::Result<serde_json::Value, String>)>> {
    let f = File::open(path).with_context(|| format!("opening input {}", path.display()))?;
    let mut out = Vec::new();
    let mut r = BufReader::new(f);
    let mut buf = Vec::new();
    let mut line_no = 0;
    loop {
        buf.clear();
        let n = r.read_until(b'\n', &mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let text = match std::str::from_utf8(&buf) {
            Ok(t) => t.trim(),
            Err(e) => {
                out.push((line_no, Err(format!("line is not valid UTF-8: {e}"))));
                continue;
            }
        };
        if text.is_empty() {
            continue;
        }
        out.push((line_no, serde_json::from_str(text).map_err(|e| format!("malformed JSON: {e}"))));
    }
    Ok(out)
}

/// A JSONL writer that flushes on drop.
pub struct JsonlWriter(BufWriter<File>);

impl JsonlWriter {
    pub fn create(path: &Path) -> Result<Self> {
        let f = File::create(path).with_context(|| format!("creating output {}", path.display()))?;
        Ok(JsonlWriter(BufWriter::new(f)))
    }
    pub fn write(&mut self, v: &serde_json::Value) -> Result<()> {
        serde_json::to_writer(&mut self.0, v)?;
        self.0.write_all(b"\n")?;
        Ok(())
    }
    pub fn finish(mut self) -> Result<()> {
        self.0.flush()?;
        self.0.get_ref().sync_all()?;
        Ok(())
    }
}
