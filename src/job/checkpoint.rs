//! Checkpoints: finished rows are committed in batches to part files, and a journal lists the
//! committed parts. `kill -9` at any instant loses at most the uncommitted batch; the same command
//! resumes, skips the committed records, and the final output — assembled from the parts in input
//! order — is byte-identical to an unbroken run's.
//!
//! On disk, beside the output (`<output>.dustoff/`):
//! - `job.json`: `{format_version, fingerprint, digest}`; a resume of a different job is refused.
//! - `part-000001.tsv`...: one row per line, `<input index>\t<row JSON>`, sorted by index.
//! - `journal.jsonl`: one line per committed part `{part, rows, errors, bytes, blake3, first,
//!   last}`, appended and fsync'd after the part itself is fsync'd. A part not in the journal
//!   (crash between the two) is deleted on resume; a torn last journal line is cut off.
//! - `finished.json`: `{format_version, digest, rows, errors}`, written once the final output is
//!   in place and removed last with the checkpoint, so a rerun after a kill during the removal
//!   finds the job complete instead of starting it again.

use std::collections::BinaryHeap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fingerprint::JobFingerprint;
use super::shard::{OrderHeader, OrderWriter, ShardError, ORDER_FORMAT_VERSION};
use super::writer::{sync_parent, RowWriter, WriteError};

pub const CHECKPOINT_FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint I/O on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "the checkpoint in {dir} belongs to a different job: {differs} changed since it was \
         started. It holds {rows} committed rows ({} ok, {errors} error rows) of that job. To \
         finish that job, run it as before; to run this one, add --restart: it discards those \
         {rows} rows and computes every record again",
        rows - errors
    )]
    Mismatch { dir: PathBuf, differs: String, rows: u64, errors: u64 },
    #[error("{path} has format_version {found}; this dustoff reads version {CHECKPOINT_FORMAT_VERSION} (add --restart to discard it)")]
    Version { path: PathBuf, found: u32 },
    #[error("checkpoint {path} is damaged: {message} (add --restart to discard it)")]
    Corrupt { path: PathBuf, message: String },
    #[error("{path} is a file, not a checkpoint folder: it would be moved aside and the run fail; move it away")]
    NotAFolder { path: PathBuf },
    #[error("cannot assemble the output: {committed} rows are committed but {expected} records were read")]
    Incomplete { expected: u64, committed: u64 },
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Shard(#[from] ShardError),
}

#[derive(Serialize, Deserialize)]
struct JobFile {
    format_version: u32,
    digest: String,
    fingerprint: JobFingerprint,
}

/// Written into a checkpoint once the job's output is in place, and deleted last when the
/// checkpoint goes (see [`remove_aside`]): while it is there, in `.dustoff` or `.dustoff.old`,
/// the job is known complete.
const FINISHED_FILE: &str = "finished.json";

/// [`FINISHED_FILE`]: which job completed, with how many rows and error rows.
#[derive(Serialize, Deserialize)]
struct FinishedFile {
    format_version: u32,
    digest: String,
    rows: u64,
    errors: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct JournalEntry {
    part: String,
    rows: u64,
    errors: u64,
    bytes: u64,
    blake3: String,
    first: u64,
    last: u64,
}

/// One finished row waiting to be committed.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingRow {
    /// Global input index of the record.
    pub index: u64,
    /// The row JSON (see `writer`), without newline.
    pub line: String,
    pub is_error: bool,
}

/// An open checkpoint of one job.
pub struct Checkpoint {
    dir: PathBuf,
    fingerprint: JobFingerprint,
    /// `None` for a job found complete (see `completed`).
    journal: Option<File>,
    parts: Vec<JournalEntry>,
    next_part: u64,
    /// Bit i set: input record i has a committed row. `[ceil(n_records / 64)]` words.
    done: Vec<u64>,
    rows: u64,
    errors: u64,
    resumed_rows: u64,
    /// Set when a different job's checkpoint without successful rows was replaced (for the log).
    replaced: Option<String>,
    faults: WriteFaults,
    /// Commits made by this process (the write-fault hook counts them).
    commits: u64,
    /// A job whose output was in place when a kill cut the checkpoint's removal short: the
    /// directory moved aside, still holding [`FINISHED_FILE`]. Every record is done; `finish`
    /// only removes it.
    completed: Option<PathBuf>,
}

/// Test-only hook (`DUSTOFF_INJECT_WRITE_ERROR`, read when a checkpoint opens): `commit:N` makes
/// this process's N-th commit fail like a full disk after writing half of its part file;
/// `output` makes the final output fail the same way after its first row. The tests use it to
/// show that a full disk leaves the checkpoint consistent and the same command resumes.
#[derive(Clone, Copy, Debug, Default)]
struct WriteFaults {
    commit: Option<u64>,
    output: bool,
}

impl WriteFaults {
    fn from_env() -> Self {
        let v = crate::sys::env::get("DUSTOFF_INJECT_WRITE_ERROR").unwrap_or_default();
        WriteFaults {
            commit: v.strip_prefix("commit:").and_then(|n| n.trim().parse().ok()),
            output: v.trim() == "output",
        }
    }
}

/// Test-only hook (`DUSTOFF_INJECT_KILL=POINT`, read at the point itself, once per job): the
/// named instant of [`Checkpoint::finish`] kills this process with SIGKILL, leaving exactly
/// what a `kill -9` landing there leaves, so the tests reach the windows that random kills hit
/// only by chance. Points: `finish-after-output` (output in place, checkpoint whole),
/// `finish-after-discard-rename` (checkpoint moved to `.dustoff.old`, not yet deleted),
/// `finish-during-removal` (all its files deleted but the finished marker).
fn kill_point(point: &str) {
    if crate::sys::env::get("DUSTOFF_INJECT_KILL").is_some_and(|v| v.trim() == point) {
        #[cfg(unix)]
        // SAFETY: kill(2) on this process's own pid with a constant signal; no memory is touched.
        unsafe {
            libc::kill(std::process::id() as libc::pid_t, libc::SIGKILL);
        }
        std::process::abort();
    }
}

/// The error a full disk gives (ENOSPC).
fn disk_full() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::StorageFull,
        "No space left on device (injected by DUSTOFF_INJECT_WRITE_ERROR)",
    )
}

/// Creates an empty checkpoint of `fingerprint` in `dir` (removing whatever is there).
fn create(dir: &Path, fingerprint: &JobFingerprint) -> Result<(), CheckpointError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { path, source }
    };
    discard(dir)?;
    fs::create_dir_all(dir).map_err(io(dir))?;
    File::create(dir.join("journal.jsonl")).and_then(|f| f.sync_all()).map_err(io(dir))?;
    let job = JobFile {
        format_version: CHECKPOINT_FORMAT_VERSION,
        digest: fingerprint.digest(),
        fingerprint: fingerprint.clone(),
    };
    let job_path = dir.join("job.json");
    let tmp = dir.join("job.json.tmp");
    let text = serde_json::to_string_pretty(&job).unwrap_or_default();
    fs::write(&tmp, text).map_err(io(&tmp))?;
    File::open(&tmp).and_then(|f| f.sync_all()).map_err(io(&tmp))?;
    fs::rename(&tmp, &job_path).map_err(io(&job_path))?;
    sync_parent(&job_path).map_err(io(dir))?;
    sync_parent(dir).map_err(io(dir))?;
    Ok(())
}

/// Rows and error rows that a journal lists (complete lines only); `(0, 0)` when unreadable.
fn journal_totals(path: &Path) -> (u64, u64) {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<JournalEntry>(l).ok())
        .fold((0, 0), |(r, e), j| (r + j.rows, e + j.errors))
}

/// Where a checkpoint directory is moved to be deleted (beside it, same file system).
pub fn discard_dir(dir: &Path) -> PathBuf {
    let mut p = dir.as_os_str().to_owned();
    p.push(".old");
    PathBuf::from(p)
}

/// Removes a checkpoint directory as one step for any later reader: it is renamed away first
/// (atomic), then deleted. A kill while the files are being deleted leaves only the renamed
/// directory, which the next call removes; the checkpoint itself is either whole or gone, never
/// a journal whose parts or `job.json` are partly deleted (a finished job's checkpoint half
/// deleted used to look like a new job's and had every row recomputed). A finished job's
/// renamed directory keeps its [`FINISHED_FILE`] to the end, which [`Checkpoint::open`] reads
/// as the job complete.
fn discard(dir: &Path) -> Result<(), CheckpointError> {
    let old = move_aside(dir)?;
    remove_aside(&old, &|| {})
}

/// The first step of [`discard`]: removes the leftover of an earlier discard, then renames
/// `dir` (if there) to [`discard_dir`]. Returns that path.
fn move_aside(dir: &Path) -> Result<PathBuf, CheckpointError> {
    let old = discard_dir(dir);
    remove_aside(&old, &|| {})?;
    if dir.exists() {
        fs::rename(dir, &old).map_err(|source| CheckpointError::Io { path: dir.to_path_buf(), source })?;
        sync_parent(dir).map_err(|source| CheckpointError::Io { path: dir.to_path_buf(), source })?;
    }
    Ok(old)
}

/// The second step of [`discard`]: deletes the renamed directory (if there), its
/// [`FINISHED_FILE`] last, so that a finished job stays known complete until nothing of its
/// checkpoint is left. `before_marker` runs between the two (a test's kill point).
fn remove_aside(old: &Path, before_marker: &dyn Fn()) -> Result<(), CheckpointError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { path, source }
    };
    if !old.exists() {
        return Ok(());
    }
    for e in fs::read_dir(old).map_err(io(old))? {
        let p = e.map_err(io(old))?.path();
        if p.file_name().is_some_and(|n| n == FINISHED_FILE) {
            continue;
        }
        if p.is_dir() {
            fs::remove_dir_all(&p).map_err(io(&p))?;
        } else {
            fs::remove_file(&p).map_err(io(&p))?;
        }
    }
    before_marker();
    let marker = old.join(FINISHED_FILE);
    if marker.exists() {
        fs::remove_file(&marker).map_err(io(&marker))?;
    }
    fs::remove_dir(old).map_err(io(old))
}

/// The job of `fingerprint` as a moved-aside checkpoint with a readable [`FINISHED_FILE`] of
/// that job shows it: complete, its output in place (`(rows, errors)`). Anything else there is
/// the leftover of a discard, to be removed.
fn completed_aside(dir: &Path, output: &Path, fingerprint: &JobFingerprint) -> Option<(PathBuf, u64, u64)> {
    let old = discard_dir(dir);
    let text = fs::read_to_string(old.join(FINISHED_FILE)).ok()?;
    let f: FinishedFile = serde_json::from_str(&text).ok()?;
    let this_job = f.format_version == CHECKPOINT_FORMAT_VERSION && f.digest == fingerprint.digest();
    (this_job && output.is_file()).then_some((old, f.rows, f.errors))
}

/// Whether `output` has the checkpoint of a started job (its `job.json`): a run resumes it.
pub fn has_started_job(output: &Path) -> bool {
    checkpoint_dir(output).join("job.json").exists()
}

/// The checkpoint directory of an output.
pub fn checkpoint_dir(output: &Path) -> PathBuf {
    let mut p = output.as_os_str().to_owned();
    p.push(".dustoff");
    PathBuf::from(p)
}

impl Checkpoint {
    /// Opens the checkpoint of `output`: resumes a matching one, refuses a different job's
    /// (unless `restart`), or starts a new one. A different job's checkpoint that holds no
    /// successful row (a start that failed before its first commit, or error rows only, as after
    /// `--max-errors` on a broken input that was then fixed) is replaced without `--restart`:
    /// nothing is lost; [`Checkpoint::replaced`] says so for the log.
    pub fn open(output: &Path, fingerprint: &JobFingerprint, restart: bool) -> Result<Self, CheckpointError> {
        let dir = checkpoint_dir(output);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Io { path, source }
        };
        let job_path = dir.join("job.json");
        if restart {
            discard(&dir)?;
        } else if !job_path.exists() {
            if let Some((old, rows, errors)) = completed_aside(&dir, output, fingerprint) {
                return Ok(Checkpoint {
                    dir,
                    fingerprint: fingerprint.clone(),
                    journal: None,
                    parts: Vec::new(),
                    next_part: 1,
                    done: Vec::new(),
                    rows,
                    errors,
                    resumed_rows: rows,
                    replaced: None,
                    faults: WriteFaults::from_env(),
                    commits: 0,
                    completed: Some(old),
                });
            }
        }
        if !job_path.exists() {
            // New job (or one that died before its job.json was durable): start clean.
            create(&dir, fingerprint)?;
        }
        let text = fs::read_to_string(&job_path).map_err(io(&job_path))?;
        let version = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("format_version").and_then(|v| v.as_u64()));
        match version {
            Some(v) if v == u64::from(CHECKPOINT_FORMAT_VERSION) => {}
            Some(v) => return Err(CheckpointError::Version { path: job_path, found: v as u32 }),
            None => return Err(CheckpointError::Corrupt { path: job_path, message: "no format_version".into() }),
        }
        let job: JobFile = serde_json::from_str(&text)
            .map_err(|e| CheckpointError::Corrupt { path: job_path.clone(), message: e.to_string() })?;
        let mut replaced = None;
        if job.fingerprint != *fingerprint {
            let differs = job.fingerprint.describe_differences(fingerprint);
            let (rows, errors) = journal_totals(&dir.join("journal.jsonl"));
            if rows > errors {
                return Err(CheckpointError::Mismatch { dir, differs, rows, errors });
            }
            replaced = Some(format!(
                "the checkpoint in {} was of a different job ({differs} changed) and held no successful \
                 row ({rows} error rows): replaced by this job's",
                dir.display()
            ));
            create(&dir, fingerprint)?;
        }
        let mut ck = Checkpoint {
            dir: dir.clone(),
            fingerprint: fingerprint.clone(),
            journal: Some(OpenOptions::new().read(true).append(true).open(dir.join("journal.jsonl")).map_err(
                |source| match source.kind() {
                    // job.json is there, the journal is not: damaged (exit 2), named.
                    std::io::ErrorKind::NotFound => CheckpointError::Corrupt {
                        path: dir.join("journal.jsonl"),
                        message: "missing (the checkpoint's job.json is there)".into(),
                    },
                    _ => CheckpointError::Io { path: dir.join("journal.jsonl"), source },
                },
            )?),
            parts: Vec::new(),
            next_part: 1,
            done: Vec::new(),
            rows: 0,
            errors: 0,
            resumed_rows: 0,
            replaced,
            faults: WriteFaults::from_env(),
            commits: 0,
            completed: None,
        };
        ck.load_journal()?;
        ck.resumed_rows = ck.rows;
        // Leftovers of a crash: parts never journaled, a half-written final output.
        let listed: std::collections::HashSet<String> = ck.parts.iter().map(|p| p.part.clone()).collect();
        for e in fs::read_dir(&dir).map_err(io(&dir))? {
            let e = e.map_err(io(&dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("part-") && !listed.contains(&name) {
                fs::remove_file(e.path()).map_err(io(&e.path()))?;
            }
        }
        Ok(ck)
    }

    /// The check `open` makes against a different job's checkpoint, without changing anything:
    /// run before the model loads, so that a refused rerun is refused at once.
    pub fn verify(output: &Path, fingerprint: &JobFingerprint, restart: bool) -> Result<(), CheckpointError> {
        let dir = checkpoint_dir(output);
        if dir.exists() && !dir.is_dir() {
            return Err(CheckpointError::NotAFolder { path: dir });
        }
        let job_path = dir.join("job.json");
        if restart || !job_path.exists() {
            return Ok(());
        }
        let text =
            fs::read_to_string(&job_path).map_err(|source| CheckpointError::Io { path: job_path.clone(), source })?;
        // An unreadable or other-version job.json is left to `open`, which names it.
        let Ok(job) = serde_json::from_str::<JobFile>(&text) else { return Ok(()) };
        if job.format_version != CHECKPOINT_FORMAT_VERSION || job.fingerprint == *fingerprint {
            return Ok(());
        }
        let (rows, errors) = journal_totals(&dir.join("journal.jsonl"));
        if rows > errors {
            let differs = job.fingerprint.describe_differences(fingerprint);
            return Err(CheckpointError::Mismatch { dir, differs, rows, errors });
        }
        Ok(())
    }

    /// Rows and error rows a checkpoint of `output` holds (complete journal lines), without
    /// opening it: `(0, 0)` when there is none.
    pub fn committed_totals(output: &Path) -> (u64, u64) {
        journal_totals(&checkpoint_dir(output).join("journal.jsonl"))
    }

    fn load_journal(&mut self) -> Result<(), CheckpointError> {
        let path = self.dir.join("journal.jsonl");
        let Some(mut journal) = self.journal.as_ref() else { return Ok(()) };
        let mut text = String::new();
        journal.seek(SeekFrom::Start(0)).map_err(|source| CheckpointError::Io { path: path.clone(), source })?;
        journal.read_to_string(&mut text).map_err(|source| CheckpointError::Io { path: path.clone(), source })?;
        let mut good = 0usize;
        let mut entries = Vec::new();
        for (n, seg) in text.split_inclusive('\n').enumerate() {
            let complete = seg.ends_with('\n');
            match serde_json::from_str::<JournalEntry>(seg.trim_end()) {
                Ok(e) if complete => {
                    entries.push(e);
                    good += seg.len();
                }
                // A torn last line: the crash hit while appending it; its part is not committed.
                _ if good + seg.len() == text.len() => break,
                Ok(_) | Err(_) => {
                    return Err(CheckpointError::Corrupt {
                        path,
                        message: format!("journal line {} is unreadable", n + 1),
                    })
                }
            }
        }
        if good < text.len() {
            journal
                .set_len(good as u64)
                .and_then(|_| journal.sync_all())
                .map_err(|source| CheckpointError::Io { path: path.clone(), source })?;
        }
        for e in entries {
            self.load_part(&e)?;
            self.rows += e.rows;
            self.errors += e.errors;
            let n: u64 = e.part.trim_start_matches("part-").trim_end_matches(".tsv").parse().unwrap_or(0);
            self.next_part = self.next_part.max(n + 1);
            self.parts.push(e);
        }
        Ok(())
    }

    /// Verifies a journaled part (size and hash) and marks its records done.
    fn load_part(&mut self, e: &JournalEntry) -> Result<(), CheckpointError> {
        let path = self.dir.join(&e.part);
        let corrupt = |m: String| CheckpointError::Corrupt { path: path.clone(), message: m };
        // A part the journal lists but the folder lacks: damaged (exit 2), as a changed one is;
        // reading it again would not help.
        let bytes = fs::read(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => corrupt("the journal lists it, but the file is missing".into()),
            _ => CheckpointError::Io { path: path.clone(), source },
        })?;
        if bytes.len() as u64 != e.bytes || blake3::hash(&bytes).to_hex().as_str() != e.blake3 {
            return Err(corrupt("size or hash differs from the journal".into()));
        }
        let mut n = 0;
        for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let idx = parse_index(line).ok_or_else(|| corrupt("a line has no index".into()))?;
            if self.is_done(idx) {
                return Err(corrupt(format!("record {idx} is committed twice")));
            }
            self.mark(idx);
            n += 1;
        }
        if n != e.rows {
            return Err(corrupt(format!("{n} rows, journal says {}", e.rows)));
        }
        Ok(())
    }

    fn mark(&mut self, i: u64) {
        let w = (i / 64) as usize;
        if w >= self.done.len() {
            self.done.resize(w + 1, 0);
        }
        self.done[w] |= 1 << (i % 64);
    }

    /// Whether input record `index` already has a committed row.
    pub fn is_done(&self, index: u64) -> bool {
        self.completed.is_some() || self.done.get((index / 64) as usize).is_some_and(|w| w & (1 << (index % 64)) != 0)
    }

    /// Rows committed so far (this run and earlier ones).
    pub fn committed_rows(&self) -> u64 {
        self.rows
    }

    /// Error rows committed so far (counts toward `--max-errors` across resumes).
    pub fn committed_errors(&self) -> u64 {
        self.errors
    }

    /// Rows that were already committed when this run opened the checkpoint.
    pub fn resumed_rows(&self) -> u64 {
        self.resumed_rows
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Why a different job's checkpoint was replaced when this one opened, if it was.
    pub fn replaced(&self) -> Option<&str> {
        self.replaced.as_deref()
    }

    /// The committed error rows as errors-file entries ([`super::errors_file::entry`]), in
    /// input order: what `<output>.errors.jsonl` lists for a job that has not completed.
    pub fn committed_error_entries(&self) -> Result<Vec<String>, CheckpointError> {
        let mut found = Vec::new();
        for p in self.parts.iter().filter(|p| p.errors > 0) {
            let path = self.dir.join(&p.part);
            let mut c = PartCursor::open(&path)?;
            while let Some(i) = c.advance()? {
                if let Some(e) = super::errors_file::entry(&c.line) {
                    found.push((i, e));
                }
            }
        }
        found.sort_by_key(|(i, _)| *i);
        Ok(found.into_iter().map(|(_, e)| e).collect())
    }

    /// Commits a batch durably: the part file is written and fsync'd, then its journal line.
    pub fn commit(&mut self, mut rows: Vec<PendingRow>) -> Result<(), CheckpointError> {
        if rows.is_empty() {
            return Ok(());
        }
        rows.sort_by_key(|r| r.index);
        let name = format!("part-{:06}.tsv", self.next_part);
        let path = self.dir.join(&name);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Io { path, source }
        };
        let mut data = Vec::with_capacity(rows.iter().map(|r| r.line.len() + 24).sum());
        let mut errors = 0;
        for (k, r) in rows.iter().enumerate() {
            if self.is_done(r.index) || (k > 0 && rows[k - 1].index == r.index) {
                return Err(CheckpointError::Corrupt {
                    path: path.clone(),
                    message: format!("record {} would be committed twice", r.index),
                });
            }
            data.extend_from_slice(r.index.to_string().as_bytes());
            data.push(b'\t');
            data.extend_from_slice(r.line.as_bytes());
            data.push(b'\n');
            errors += u64::from(r.is_error);
        }
        self.commits += 1;
        let fail = self.faults.commit == Some(self.commits);
        let written = File::create(&path).and_then(|mut f| {
            if fail {
                f.write_all(&data[..data.len() / 2])?;
                return Err(disk_full());
            }
            f.write_all(&data).and_then(|_| f.sync_all())
        });
        if let Err(e) = written {
            // Not journaled, so not committed (a resume would delete it); remove it now to give
            // the space back.
            let _ = fs::remove_file(&path);
            return Err(CheckpointError::Io { path, source: e });
        }
        sync_parent(&path).map_err(io(&path))?;
        let entry = JournalEntry {
            part: name,
            rows: rows.len() as u64,
            errors,
            bytes: data.len() as u64,
            blake3: blake3::hash(&data).to_hex().to_string(),
            first: rows[0].index,
            last: rows[rows.len() - 1].index,
        };
        let mut line = serde_json::to_string(&entry).unwrap_or_default();
        line.push('\n');
        let jpath = self.dir.join("journal.jsonl");
        let journal = self.journal.as_mut().ok_or_else(|| CheckpointError::Corrupt {
            path: jpath.clone(),
            message: "the job is complete: it has no journal to commit to".into(),
        })?;
        journal.write_all(line.as_bytes()).and_then(|_| journal.sync_data()).map_err(io(&jpath))?;
        for r in &rows {
            self.mark(r.index);
        }
        self.rows += entry.rows;
        self.errors += errors;
        self.next_part += 1;
        self.parts.push(entry);
        Ok(())
    }

    /// Assembles the final output from the parts in input order (a streaming merge: parts are
    /// opened when the merge reaches their first index) and writes the `.order` sidecar for a
    /// sharded job. `expected`: records this run was responsible for. The checkpoint stays until
    /// [`FinishedCheckpoint::remove`], which the caller runs once the job's other files (digests, errors
    /// file, report) are in place: a failure or kill before then (a full disk writing the
    /// report) leaves a checkpoint the same command finishes from, where it used to leave an
    /// output with no checkpoint and no report, refused as someone else's file.
    pub fn finish(
        self,
        output: &Path,
        expected: u64,
        json_output: bool,
    ) -> Result<(u64, FinishedCheckpoint), CheckpointError> {
        if self.rows != expected {
            return Err(CheckpointError::Incomplete { expected, committed: self.rows });
        }
        if let Some(old) = self.completed {
            // The output was put in place before the kill; what is left is the removal.
            return Ok((self.rows, FinishedCheckpoint::Aside(old)));
        }
        let mut parts = self.parts.clone();
        parts.sort_by_key(|p| p.first);
        let mut order = match self.fingerprint.shard {
            Some(shard) => Some(OrderWriter::create(
                output,
                &OrderHeader {
                    format_version: ORDER_FORMAT_VERSION,
                    shard,
                    job: self.fingerprint.job_digest(),
                    json_output,
                    rows: self.rows,
                },
            )?),
            None => None,
        };
        let mut out = RowWriter::create(output, json_output)?;
        let mut readers: Vec<Option<PartCursor>> = Vec::new();
        let mut heap: BinaryHeap<std::cmp::Reverse<(u64, usize)>> = BinaryHeap::new();
        let mut next = 0;
        loop {
            while next < parts.len() && heap.peek().is_none_or(|r| parts[next].first <= r.0 .0) {
                let mut c = PartCursor::open(&self.dir.join(&parts[next].part))?;
                if let Some(i) = c.advance()? {
                    heap.push(std::cmp::Reverse((i, readers.len())));
                }
                readers.push(Some(c));
                next += 1;
            }
            let Some(std::cmp::Reverse((i, k))) = heap.pop() else { break };
            let Some(c) = readers[k].as_mut() else { continue };
            out.write_row(&c.line)?;
            if self.faults.output {
                return Err(WriteError::Io { path: output.to_path_buf(), source: disk_full() }.into());
            }
            if let Some(o) = order.as_mut() {
                o.push(i)?;
            }
            match c.advance()? {
                Some(n) => heap.push(std::cmp::Reverse((n, k))),
                None => readers[k] = None,
            }
        }
        if let Some(o) = order {
            o.finish()?;
        }
        let n = out.finish()?;
        kill_point("finish-after-output");
        // The output is in place (and durable). The marker says so to a rerun after a kill
        // during the removal below, which would otherwise find no checkpoint and compute every
        // row again; the checkpoint goes in one rename, so it is never half deleted.
        let marker = self.dir.join(FINISHED_FILE);
        let finished = FinishedFile {
            format_version: CHECKPOINT_FORMAT_VERSION,
            digest: self.fingerprint.digest(),
            rows: self.rows,
            errors: self.errors,
        };
        let io = |source| CheckpointError::Io { path: marker.clone(), source };
        let text = serde_json::to_string(&finished).unwrap_or_default();
        fs::write(&marker, text).and_then(|_| File::open(&marker)?.sync_all()).map_err(io)?;
        sync_parent(&marker).map_err(io)?;
        Ok((n, FinishedCheckpoint::Live(self.dir)))
    }
}

/// The checkpoint of a job whose output is in place, to be removed once the job's report is.
#[must_use = "the checkpoint stays until `remove` runs"]
pub enum FinishedCheckpoint {
    /// The checkpoint directory, with its finished marker.
    Live(PathBuf),
    /// Already moved aside by a run killed while removing it.
    Aside(PathBuf),
}

impl FinishedCheckpoint {
    /// Removes the checkpoint: one rename, then the files, the finished marker last.
    pub fn remove(self) -> Result<(), CheckpointError> {
        match self {
            FinishedCheckpoint::Live(dir) => {
                let old = move_aside(&dir)?;
                kill_point("finish-after-discard-rename");
                remove_aside(&old, &|| kill_point("finish-during-removal"))
            }
            FinishedCheckpoint::Aside(old) => remove_aside(&old, &|| {}),
        }
    }
}

/// The fingerprint of `output`'s checkpoint when its job is complete and its output in place
/// (the finished marker written: a run killed or failed between its output and the removal of
/// its checkpoint, its report perhaps not written). The same command finishes it from there
/// with this fingerprint: an `--incremental` run's base names the output it replaced, which a
/// rerun cannot compute again.
pub fn completed_live(output: &Path) -> Option<JobFingerprint> {
    let dir = checkpoint_dir(output);
    let job: JobFile = serde_json::from_str(&fs::read_to_string(dir.join("job.json")).ok()?).ok()?;
    let f: FinishedFile = serde_json::from_str(&fs::read_to_string(dir.join(FINISHED_FILE)).ok()?).ok()?;
    let same = job.format_version == CHECKPOINT_FORMAT_VERSION
        && f.format_version == CHECKPOINT_FORMAT_VERSION
        && f.digest == job.fingerprint.digest();
    (same && output.is_file()).then_some(job.fingerprint)
}

/// Removes what a killed removal of `output`'s finished checkpoint left (its moved-aside
/// directory), for a rerun that finds the job finished and does nothing else.
pub fn remove_leftover(output: &Path) -> Result<(), CheckpointError> {
    remove_aside(&discard_dir(&checkpoint_dir(output)), &|| {})
}

fn parse_index(line: &[u8]) -> Option<u64> {
    let tab = line.iter().position(|&b| b == b'\t')?;
    std::str::from_utf8(&line[..tab]).ok()?.parse().ok()
}

/// Reads one part file line by line.
struct PartCursor {
    path: PathBuf,
    r: BufReader<File>,
    buf: String,
    line: String,
}

impl PartCursor {
    fn open(path: &Path) -> Result<Self, CheckpointError> {
        let f = File::open(path).map_err(|source| CheckpointError::Io { path: path.to_path_buf(), source })?;
        Ok(PartCursor { path: path.to_path_buf(), r: BufReader::new(f), buf: String::new(), line: String::new() })
    }

    /// Moves to the next row: returns its index, with the row JSON in `self.line`.
    fn advance(&mut self) -> Result<Option<u64>, CheckpointError> {
        self.buf.clear();
        let n = self
            .r
            .read_line(&mut self.buf)
            .map_err(|source| CheckpointError::Io { path: self.path.clone(), source })?;
        if n == 0 {
            return Ok(None);
        }
        let t = self.buf.trim_end_matches('\n');
        let (idx, row) = t.split_once('\t').ok_or_else(|| CheckpointError::Corrupt {
            path: self.path.clone(),
            message: "a line has no index".into(),
        })?;
        let idx = idx
            .parse()
            .map_err(|_| CheckpointError::Corrupt { path: self.path.clone(), message: format!("bad index '{idx}'") })?;
        self.line.clear();
        self.line.push_str(row);
        Ok(Some(idx))
    }
}
