//! JSONL files of the small commands (`tokenize`, `generate --input`): read line by line with
//! each line's error kept; written to `<output>.partial`, fsynced and renamed over the output
//! at the end, so a failure never leaves an existing output emptied or half written.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

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
pub struct JsonlWriter {
    out: BufWriter<File>,
    partial: PathBuf,
    path: PathBuf,
    done: bool,
}

impl JsonlWriter {
    pub fn create(path: &Path) -> Result<Self> {
        let mut p = path.as_os_str().to_owned();
        p.push(".partial");
        let partial = PathBuf::from(p);
        let f = File::create(&partial).with_context(|| format!("creating output {}", partial.display()))?;
        Ok(JsonlWriter { out: BufWriter::new(f), partial, path: path.to_path_buf(), done: false })
    }
    pub fn write(&mut self, v: &serde_json::Value) -> Result<()> {
        serde_json::to_writer(&mut self.out, v)?;
        self.out.write_all(b"\n").with_context(|| format!("writing {}", self.partial.display()))?;
        Ok(())
    }
    /// Flushes, fsyncs and renames the rows over the output.
    pub fn finish(mut self) -> Result<()> {
        let ctx = || format!("writing {}", self.partial.display());
        self.out.flush().with_context(ctx)?;
        self.out.get_ref().sync_all().with_context(ctx)?;
        std::fs::rename(&self.partial, &self.path)
            .with_context(|| format!("renaming {} to {}", self.partial.display(), self.path.display()))?;
        self.done = true;
        crate::job::writer::sync_parent(&self.path).with_context(|| format!("syncing {}", self.path.display()))?;
        Ok(())
    }
}

impl Drop for JsonlWriter {
    /// A writer dropped before `finish` (an error) removes its partial rows.
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}
