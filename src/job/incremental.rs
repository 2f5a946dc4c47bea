//! `--incremental`: a rerun over a grown (or edited) input set computes only the records whose
//! id is new or whose content changed, and takes every other row from the finished output in
//! place, unchanged (a JSONL row byte for byte).
//!
//! Each finished output has a per-record digests file beside it (`<output>.digests.tsv`), one
//! line per output row in the same order: `<blake3 of the record's content, 32 hex>\t<id as a
//! JSON string, or null>`. A record's content is what the job reads of it: the pipeline's
//! fields (or the OpenAI request), so a change to a field the pipeline ignores does not count.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::record::{Item, OpenAiEndpoint, RecordBody};
use super::writer::{sync_parent, OutputFormat, RowLines};

/// The per-record digests file of an output.
pub fn digests_path(output: &Path) -> PathBuf {
    let mut p = output.as_os_str().to_owned();
    p.push(".digests.tsv");
    PathBuf::from(p)
}

fn partial_path(output: &Path) -> PathBuf {
    let mut p = digests_path(output).into_os_string();
    p.push(".partial");
    PathBuf::from(p)
}

/// The digest of what the job reads of a record; `None` for a record that could not be read
/// (it has no content to compare: an error row, always recomputed, which is cheap).
pub fn record_digest(item: &Item) -> Option<[u8; 16]> {
    let text = match item.body.as_ref().ok()? {
        RecordBody::Fields(f) => serde_json::to_string(f).ok()?,
        RecordBody::OpenAi(r) => serde_json::json!({
            "endpoint": match r.endpoint { OpenAiEndpoint::Chat => "chat", OpenAiEndpoint::Completion => "completion" },
            "model": r.model,
            "messages": r.messages.iter().map(|m| [&m.role, &m.content]).collect::<Vec<_>>(),
            "prompt": r.prompt,
            "max_tokens": r.max_tokens,
            "temperature": r.temperature,
            "top_p": r.top_p,
            "seed": r.seed,
        })
        .to_string(),
    };
    let h = blake3::hash(text.as_bytes());
    Some(h.as_bytes()[..16].try_into().unwrap_or([0; 16]))
}

fn hex(d: &[u8; 16]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 {
        return None;
    }
    let mut d = [0u8; 16];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(d)
}

/// A 128-bit key of an id (the map holds these, not the id strings).
fn id_key(id: &str) -> u128 {
    let h = blake3::hash(id.as_bytes());
    u128::from_le_bytes(h.as_bytes()[..16].try_into().unwrap_or([0; 16]))
}

#[derive(Debug, thiserror::Error)]
pub enum IncrementalError {
    #[error("cannot read or write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} line {line} is damaged: {message}")]
    Damaged { path: PathBuf, line: u64, message: String },
    #[error("cannot read the finished output {path}: {message}")]
    Output { path: PathBuf, message: String },
}

/// Writes the digests file of a run: one line per record this run is responsible for, in input
/// order (every run reads the whole input, resumed or not, so it rewrites the file whole), to
/// `<output>.digests.tsv.partial`, renamed into place by [`DigestsWriter::finish`].
pub struct DigestsWriter {
    partial: PathBuf,
    path: PathBuf,
    w: BufWriter<File>,
}

impl DigestsWriter {
    pub fn create(output: &Path) -> Result<Self, IncrementalError> {
        let partial = partial_path(output);
        let f = File::create(&partial).map_err(|source| IncrementalError::Io { path: partial.clone(), source })?;
        Ok(DigestsWriter { partial, path: digests_path(output), w: BufWriter::new(f) })
    }

    pub fn push(&mut self, item: &Item) -> Result<(), IncrementalError> {
        let d = record_digest(item).map(|d| hex(&d)).unwrap_or_else(|| "-".repeat(32));
        let id = item.id.as_deref().map(|i| serde_json::Value::from(i).to_string()).unwrap_or_else(|| "null".into());
        writeln!(self.w, "{d}\t{id}").map_err(|source| IncrementalError::Io { path: self.partial.clone(), source })
    }

    /// Puts the file in place (after the output itself is).
    pub fn finish(self) -> Result<(), IncrementalError> {
        let io = |source| IncrementalError::Io { path: self.path.clone(), source };
        let f = self.w.into_inner().map_err(|e| io(e.into_error()))?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&self.partial, &self.path).map_err(io)?;
        sync_parent(&self.path).map_err(io)
    }

    /// Drops the partial file (a run that did not complete).
    pub fn abandon(self) {
        let _ = std::fs::remove_file(&self.partial);
    }
}

/// Where an old row is.
enum Loc {
    /// Byte offset and length of a JSONL line (read back when reused, byte for byte).
    Jsonl(u64, u32),
    /// A Parquet output's row, rebuilt as its JSON line.
    Line(String),
}

/// How records of this run compare with the finished output.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IncrementalCounts {
    /// Rows taken from the finished output unchanged.
    pub reused: u64,
    /// Records whose id was not in the finished output.
    pub new: u64,
    /// Records whose id was there with other content: computed again.
    pub changed: u64,
    /// Rows of the finished output whose id is no longer in the input (not in the new output).
    pub removed: u64,
}

/// The finished output's rows by id, with their records' digests.
pub struct ReuseIndex {
    output: PathBuf,
    file: Option<File>,
    rows: HashMap<u128, ([u8; 16], Loc, bool)>,
    pub counts: IncrementalCounts,
}

/// What [`ReuseIndex::lookup`] found for a record.
pub enum Reuse {
    /// The old row (its line) and whether it is an error row.
    Row(String, bool),
    New,
    Changed,
}

impl ReuseIndex {
    /// Reads the digests file and the output beside it (rows zipped with digest lines).
    pub fn open(output: &Path) -> Result<Self, IncrementalError> {
        let dpath = digests_path(output);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| IncrementalError::Io { path, source }
        };
        let digests = BufReader::new(File::open(&dpath).map_err(io(&dpath))?);
        let mut entries = Vec::new();
        for (n, l) in digests.lines().enumerate() {
            let l = l.map_err(io(&dpath))?;
            let damaged =
                |m: &str| IncrementalError::Damaged { path: dpath.clone(), line: n as u64 + 1, message: m.into() };
            let (d, id) = l.split_once('\t').ok_or_else(|| damaged("no tab"))?;
            let id: Option<String> = serde_json::from_str(id).map_err(|_| damaged("the id is not a JSON string"))?;
            entries.push((unhex(d), id));
        }
        let mut rows = HashMap::new();
        let mut push = |k: usize, loc: Loc, line: &str| -> Result<(), IncrementalError> {
            let Some((d, id)) = entries.get(k) else {
                return Err(IncrementalError::Output {
                    path: output.to_path_buf(),
                    message: format!("it has more rows than {} lists", dpath.display()),
                });
            };
            if let (Some(d), Some(id)) = (d, id) {
                let is_error = serde_json::from_str::<serde_json::Value>(line)
                    .map(|v| v.get("error").is_some_and(|e| !e.is_null()))
                    .unwrap_or(true);
                rows.insert(id_key(id), (*d, loc, is_error));
            }
            Ok(())
        };
        let mut n = 0usize;
        let file = if OutputFormat::from_path(output) == OutputFormat::Jsonl {
            let f = File::open(output).map_err(io(output))?;
            let mut r = BufReader::new(f);
            let mut off = 0u64;
            let mut buf = Vec::new();
            loop {
                buf.clear();
                let len = r.read_until(b'\n', &mut buf).map_err(io(output))?;
                if len == 0 {
                    break;
                }
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches('\n');
                push(n, Loc::Jsonl(off, line.len() as u32), line)?;
                off += len as u64;
                n += 1;
            }
            Some(File::open(output).map_err(io(output))?)
        } else {
            let lines = RowLines::open(output)
                .map_err(|e| IncrementalError::Output { path: output.to_path_buf(), message: e.to_string() })?;
            for line in lines {
                let line =
                    line.map_err(|e| IncrementalError::Output { path: output.to_path_buf(), message: e.to_string() })?;
                push(n, Loc::Line(line.clone()), &line)?;
                n += 1;
            }
            None
        };
        if n != entries.len() {
            return Err(IncrementalError::Output {
                path: output.to_path_buf(),
                message: format!("{n} rows, but {} lists {} records", dpath.display(), entries.len()),
            });
        }
        Ok(ReuseIndex { output: output.to_path_buf(), file, rows, counts: IncrementalCounts::default() })
    }

    /// The old row of `item` when its id is there with the same content (each row is handed
    /// out once; the rest count as removed at the end).
    pub fn lookup(&mut self, item: &Item) -> Result<Reuse, IncrementalError> {
        let Some(id) = &item.id else {
            self.counts.new += 1;
            return Ok(Reuse::New);
        };
        let Some((d, loc, is_error)) = self.rows.remove(&id_key(id)) else {
            self.counts.new += 1;
            return Ok(Reuse::New);
        };
        if record_digest(item) != Some(d) {
            self.counts.changed += 1;
            return Ok(Reuse::Changed);
        }
        let line = match loc {
            Loc::Line(l) => l,
            Loc::Jsonl(off, len) => {
                let io = |source| IncrementalError::Io { path: self.output.clone(), source };
                let f = self.file.as_mut().ok_or_else(|| io(std::io::Error::other("output not open")))?;
                f.seek(SeekFrom::Start(off)).map_err(io)?;
                let mut b = vec![0u8; len as usize];
                f.read_exact(&mut b).map_err(io)?;
                String::from_utf8(b).map_err(|_| IncrementalError::Output {
                    path: self.output.clone(),
                    message: format!("the row at byte {off} is not UTF-8"),
                })?
            }
        };
        self.counts.reused += 1;
        Ok(Reuse::Row(line, is_error))
    }

    /// A record already committed by an earlier run of this (incremental) job: its old row, if
    /// any, is accounted for.
    pub fn skip(&mut self, item: &Item) {
        if let Some(id) = &item.id {
            self.rows.remove(&id_key(id));
        }
    }

    /// The counts, with the old rows no record asked for counted as removed.
    pub fn finish_counts(&self) -> IncrementalCounts {
        IncrementalCounts { removed: self.rows.len() as u64, ..self.counts.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let d: [u8; 16] = *b"0123456789abcdef";
        assert_eq!(unhex(&hex(&d)), Some(d));
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex(&"-".repeat(32)), None);
    }
}
