//! Sharding across machines: `--shard K/N` keeps the records whose id hashes to K (a stable
//! blake3 hash, so every machine agrees without talking), and `merge` puts the shard outputs
//! back together in input order.
//!
//! A sharded run writes `<output>.order` beside its output: a JSON header line, then the global
//! input index of each row, one per line. `merge` k-way merges the shards by that index, so it
//! streams (one row per shard in memory) and needs no access to the input.

use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::writer::{RowLines, RowWriter, WriteError};

pub const ORDER_FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("bad shard '{0}': expected K/N with 0 <= K < N, e.g. 0/4")]
    Spec(String),
    #[error("environment variable {name}='{value}' is not a valid shard number")]
    Env { name: String, value: String },
    #[error("{name} is set but the shard count is not: set {count_var} or pass --shard K/N")]
    NoCount { name: &'static str, count_var: &'static str },
    #[error(
        "--shard-count is given but no shard index: pass --shard K/N, or run as a Slurm array task \
         (SLURM_ARRAY_TASK_ID) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX)"
    )]
    NoIndex,
    #[error("--shard {spec} and --shard-count {count} disagree")]
    CountDisagrees { spec: ShardSpec, count: u32 },
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Order { path: PathBuf, message: String },
    #[error("cannot merge: {0}")]
    Merge(String),
    /// Shard outputs that are not there (a shard not finished, or failed): the command has to
    /// wait or name them (exit 2).
    #[error("cannot merge: {0}")]
    Missing(String),
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// Shard `index` of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSpec {
    pub index: u32,
    pub count: u32,
}

impl std::fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for ShardSpec {
    type Err = ShardError;
    fn from_str(s: &str) -> Result<Self, ShardError> {
        let bad = || ShardError::Spec(s.to_string());
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = k.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(ShardSpec { index, count })
    }
}

impl ShardSpec {
    /// Whether this shard processes the record with this key (its id).
    pub fn owns(&self, key: &str) -> bool {
        shard_of(key, self.count) == self.index
    }

    /// The shard of a run: `--shard K/N` (with a `--shard-count`, which must say N), else the
    /// environment's ([`ShardSpec::from_env`]).
    pub fn resolve(
        shard: Option<&str>,
        count: Option<u32>,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<ShardSpec>, ShardError> {
        match shard {
            Some(s) => {
                let spec = s.parse::<ShardSpec>()?;
                match count {
                    Some(n) if n != spec.count => Err(ShardError::CountDisagrees { spec, count: n }),
                    _ => Ok(Some(spec)),
                }
            }
            None => Self::from_env(get, count),
        }
    }

    /// The shard from the environment when `--shard` is not given:
    /// Slurm job arrays (`SLURM_ARRAY_TASK_ID` minus `SLURM_ARRAY_TASK_MIN`, of
    /// `SLURM_ARRAY_TASK_COUNT`), or a Kubernetes Indexed Job (`JOB_COMPLETION_INDEX` of
    /// `count`, from `--shard-count` or `DUSTOFF_SHARD_COUNT`). `Ok(None)`: not sharded.
    pub fn from_env(get: impl Fn(&str) -> Option<String>, count: Option<u32>) -> Result<Option<ShardSpec>, ShardError> {
        let num = |name: &str| -> Result<Option<u32>, ShardError> {
            match get(name) {
                None => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| ShardError::Env { name: name.to_string(), value: v }),
            }
        };
        let spec = if let Some(id) = num("SLURM_ARRAY_TASK_ID")? {
            let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            // An explicit --shard-count wins (a resubmitted task of a larger array).
            let n = match count.map(Some).unwrap_or(num("SLURM_ARRAY_TASK_COUNT")?) {
                Some(n) => n,
                None => {
                    return Err(ShardError::NoCount {
                        name: "SLURM_ARRAY_TASK_ID",
                        count_var: "SLURM_ARRAY_TASK_COUNT",
                    })
                }
            };
            (id.checked_sub(min).unwrap_or(u32::MAX), n)
        } else if let Some(idx) = num("JOB_COMPLETION_INDEX")? {
            let n = match count.map(Some).unwrap_or(num("DUSTOFF_SHARD_COUNT")?) {
                Some(n) => n,
                None => {
                    return Err(ShardError::NoCount { name: "JOB_COMPLETION_INDEX", count_var: "DUSTOFF_SHARD_COUNT" })
                }
            };
            (idx, n)
        } else if count.is_some() {
            // A count with no index would silently run every record.
            return Err(ShardError::NoIndex);
        } else {
            return Ok(None);
        };
        if spec.1 == 0 || spec.0 >= spec.1 {
            return Err(ShardError::Spec(format!("{}/{} (from the environment)", spec.0, spec.1)));
        }
        Ok(Some(ShardSpec { index: spec.0, count: spec.1 }))
    }
}

/// The stable shard of a key: blake3, first 8 bytes little-endian, modulo `count`.
pub fn shard_of(key: &str, count: u32) -> u32 {
    let d = blake3::hash(key.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d.as_bytes()[..8]);
    (u64::from_le_bytes(b) % u64::from(count.max(1))) as u32
}

/// The header line of an `.order` sidecar.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OrderHeader {
    pub format_version: u32,
    pub shard: ShardSpec,
    /// The job fingerprint without the shard: equal for all shards of one job.
    pub job: String,
    pub json_output: bool,
    pub rows: u64,
}

/// The sidecar path of an output.
pub fn order_path(output: &Path) -> PathBuf {
    let mut p = output.as_os_str().to_owned();
    p.push(".order");
    PathBuf::from(p)
}

/// Streams an `.order` sidecar: the header (with the row count known up front), then one input
/// index per row. Fsync'd by [`OrderWriter::finish`].
pub struct OrderWriter {
    path: PathBuf,
    w: BufWriter<File>,
}

impl OrderWriter {
    pub fn create(output: &Path, header: &OrderHeader) -> Result<Self, ShardError> {
        let path = order_path(output);
        let f = File::create(&path).map_err(|source| ShardError::Io { path: path.clone(), source })?;
        let mut w = OrderWriter { path, w: BufWriter::new(f) };
        let text = serde_json::to_string(header).unwrap_or_default();
        w.line(&text)?;
        Ok(w)
    }

    fn line(&mut self, s: &str) -> Result<(), ShardError> {
        let path = &self.path;
        writeln!(self.w, "{s}").map_err(|source| ShardError::Io { path: path.clone(), source })
    }

    pub fn push(&mut self, index: u64) -> Result<(), ShardError> {
        self.line(&index.to_string())
    }

    pub fn finish(self) -> Result<(), ShardError> {
        let path = self.path;
        let io = |source| ShardError::Io { path: path.clone(), source };
        let f = self.w.into_inner().map_err(|e| io(e.into_error()))?;
        f.sync_all().map_err(io)
    }
}

struct OrderReader {
    path: PathBuf,
    lines: std::io::Lines<BufReader<File>>,
    last: Option<u64>,
}

/// The job digest a shard output's `.order` header holds (equal for every shard of one job).
pub fn shard_job(output: &Path) -> Result<String, ShardError> {
    Ok(open_order(output)?.0.job)
}

fn open_order(output: &Path) -> Result<(OrderHeader, OrderReader), ShardError> {
    let path = order_path(output);
    let f = File::open(&path).map_err(|source| ShardError::Order {
        path: path.clone(),
        message: format!("{source}; was {} written by `dustoff run --shard K/N`?", output.display()),
    })?;
    let mut lines = BufReader::new(f).lines();
    let bad = |m: String| ShardError::Order { path: path.clone(), message: m };
    let first = lines.next().ok_or_else(|| bad("empty order file".into()))?;
    let first = first.map_err(|e| bad(e.to_string()))?;
    let header: OrderHeader = serde_json::from_str(&first).map_err(|e| bad(format!("bad header: {e}")))?;
    if header.format_version != ORDER_FORMAT_VERSION {
        return Err(bad(format!(
            "format_version {} is not supported (this dustoff reads {ORDER_FORMAT_VERSION})",
            header.format_version
        )));
    }
    Ok((header, OrderReader { path, lines, last: None }))
}

impl OrderReader {
    fn next_index(&mut self) -> Result<Option<u64>, ShardError> {
        let bad = |m: String| ShardError::Order { path: self.path.clone(), message: m };
        let Some(l) = self.lines.next() else { return Ok(None) };
        let l = l.map_err(|e| bad(e.to_string()))?;
        let i: u64 = l.trim().parse().map_err(|_| bad(format!("'{l}' is not an index")))?;
        if self.last.is_some_and(|p| p >= i) {
            return Err(bad(format!("indices not increasing at {i}")));
        }
        self.last = Some(i);
        Ok(Some(i))
    }
}

/// What `merge` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeSummary {
    pub shards: u32,
    pub rows: u64,
}

/// Combines the outputs of all shards of one job into `output` (JSONL or Parquet by extension),
/// in input order. Refuses shards of different jobs, a missing or repeated shard, and outputs
/// whose row count does not match their `.order` sidecar.
/// One shard output being merged: its rows, its `.order` file and how many rows it lists.
struct Part {
    rows: RowLines,
    order: OrderReader,
    expect: u64,
    path: PathBuf,
}

/// Merges the shard outputs `inputs` into `output` (see [`merge_with`]).
pub fn merge(inputs: &[PathBuf], output: &Path) -> Result<MergeSummary, ShardError> {
    merge_with(inputs, output, |_, _| Ok(()))
}

/// [`merge`], with `before_rename(partial, rows)` run on the complete merged file before it
/// takes the output's name.
pub fn merge_with(
    inputs: &[PathBuf],
    output: &Path,
    before_rename: impl FnOnce(&Path, u64) -> Result<(), WriteError>,
) -> Result<MergeSummary, ShardError> {
    if inputs.is_empty() {
        return Err(ShardError::Merge("no shard outputs given".into()));
    }
    let inputs = shard_outputs(inputs);
    let inputs = inputs.as_slice();
    if inputs.is_empty() {
        return Err(ShardError::Merge("no shard outputs given (only their error files)".into()));
    }
    if let Some(why) = super::writer::compressed_name(output) {
        return Err(ShardError::Merge(why));
    }
    // Never write over what is being merged: the rows would be lost mid-read.
    let output_file = output.canonicalize().ok();
    for p in inputs {
        if output_file.is_some() && p.canonicalize().ok() == output_file {
            return Err(ShardError::Merge(format!(
                "--output {} is one of the shard outputs being merged",
                output.display()
            )));
        }
    }
    let mut parts = Vec::new();
    let mut first: Option<OrderHeader> = None;
    let mut have = Vec::new();
    let mut absent = Vec::new();
    for p in inputs {
        if !p.is_file() {
            absent.push(p.display().to_string());
            continue;
        }
        let (h, order) = open_order(p)?;
        if let Some(f) = &first {
            if h.job != f.job {
                return Err(ShardError::Merge(format!(
                    "{} belongs to another job than {} (pipeline, model, parameters or inputs differ)",
                    p.display(),
                    inputs[0].display()
                )));
            }
            if h.shard.count != f.shard.count {
                return Err(ShardError::Merge(format!(
                    "{} is shard {} but {} is shard {}",
                    p.display(),
                    h.shard,
                    inputs[0].display(),
                    f.shard
                )));
            }
        }
        if have.contains(&h.shard.index) {
            return Err(ShardError::Merge(format!("shard {} is given twice", h.shard)));
        }
        have.push(h.shard.index);
        let rows = RowLines::open(p)?;
        parts.push(Part { rows, order, expect: h.rows, path: p.clone() });
        first.get_or_insert(h);
    }
    let not_there = |absent: &[String]| {
        if absent.is_empty() {
            String::new()
        } else {
            format!("; not found: {}", absent.join(", "))
        }
    };
    let Some(head) = first else {
        return Err(ShardError::Missing(format!("none of the shard outputs exists{}", not_there(&absent))));
    };
    let missing: Vec<String> =
        (0..head.shard.count).filter(|k| !have.contains(k)).map(|k| format!("{k}/{}", head.shard.count)).collect();
    if !missing.is_empty() || !absent.is_empty() {
        let shards = if missing.is_empty() {
            String::new()
        } else {
            format!(
                "missing shard{} {} (not finished, or failed: see each shard's report and log)",
                if missing.len() > 1 { "s" } else { "" },
                missing.join(", ")
            )
        };
        return Err(ShardError::Missing(
            format!("{shards}{}", not_there(&absent)).trim_start_matches("; ").to_string(),
        ));
    }

    let out = RowWriter::create(output, head.json_output)?;
    let tmp = out.partial_path().to_path_buf();
    let merged = write_merged(parts, out, before_rename);
    if merged.is_err() {
        // A failed merge leaves nothing half-written behind.
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(MergeSummary { shards: head.shard.count, rows: merged? })
}

/// The shard outputs among `inputs`: a shard's error file (`<shard>.errors.jsonl`, written by
/// every run) is left out when its shard is given too, as `shard-*.jsonl` matches both.
pub fn shard_outputs(inputs: &[PathBuf]) -> Vec<PathBuf> {
    inputs
        .iter()
        .filter(|p| {
            let of_a_shard = inputs.iter().any(|s| super::errors_file::errors_path(s) == **p);
            if of_a_shard {
                eprintln!("merge: leaving out {}: the error rows of a shard given too", p.display());
            }
            !of_a_shard
        })
        .cloned()
        .collect()
}

/// Writes the rows of the shards in input order (by their `.order` files) and finishes the
/// output.
fn write_merged(
    mut parts: Vec<Part>,
    mut out: RowWriter,
    before_rename: impl FnOnce(&Path, u64) -> Result<(), WriteError>,
) -> Result<u64, ShardError> {
    let mut seen = vec![0u64; parts.len()];
    // Min-heap of (next index, part) via Reverse ordering.
    let mut heap = BinaryHeap::new();
    for (k, part) in parts.iter_mut().enumerate() {
        if let Some(i) = part.order.next_index()? {
            heap.push(std::cmp::Reverse((i, k)));
        }
    }
    let mut last: Option<u64> = None;
    while let Some(std::cmp::Reverse((i, k))) = heap.pop() {
        if last == Some(i) {
            return Err(ShardError::Merge(format!("input record {i} appears in two shards")));
        }
        last = Some(i);
        let part = &mut parts[k];
        let line = part.rows.next().ok_or_else(|| {
            ShardError::Merge(format!("{} has fewer rows than its .order file", part.path.display()))
        })??;
        seen[k] += 1;
        out.write_row(&line)?;
        if let Some(n) = part.order.next_index()? {
            heap.push(std::cmp::Reverse((n, k)));
        }
    }
    for (part, seen) in parts.iter_mut().zip(seen) {
        if seen != part.expect || part.rows.next().is_some() {
            return Err(ShardError::Merge(format!(
                "{} does not have the {} rows its .order file lists",
                part.path.display(),
                part.expect
            )));
        }
    }
    Ok(out.finish_with(before_rename)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_specs() {
        assert_eq!("1/3".parse::<ShardSpec>().unwrap(), ShardSpec { index: 1, count: 3 });
        for bad in ["3/3", "0/0", "a/2", "1", "-1/2", "1/2/3"] {
            assert!(bad.parse::<ShardSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn every_key_has_exactly_one_owner() {
        let n = 5;
        let mut counts = [0u32; 5];
        for i in 0..5000 {
            let key = format!("doc-{i}");
            let owners: Vec<u32> = (0..n).filter(|&k| ShardSpec { index: k, count: n }.owns(&key)).collect();
            assert_eq!(owners.len(), 1);
            counts[owners[0] as usize] += 1;
        }
        // A usable hash spreads 5000 keys roughly evenly (expected 1000 each).
        assert!(counts.iter().all(|&c| (850..1150).contains(&c)), "{counts:?}");
    }

    #[test]
    fn env_slurm_and_kubernetes() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let s = ShardSpec::from_env(
            env(&[("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_COUNT", "4")]),
            None,
        );
        assert_eq!(s.unwrap(), Some(ShardSpec { index: 2, count: 4 }));
        let s = ShardSpec::from_env(env(&[("JOB_COMPLETION_INDEX", "1")]), Some(2));
        assert_eq!(s.unwrap(), Some(ShardSpec { index: 1, count: 2 }));
        let s = ShardSpec::from_env(env(&[("JOB_COMPLETION_INDEX", "1"), ("DUSTOFF_SHARD_COUNT", "3")]), None);
        assert_eq!(s.unwrap(), Some(ShardSpec { index: 1, count: 3 }));
        assert!(ShardSpec::from_env(env(&[("JOB_COMPLETION_INDEX", "1")]), None).is_err());
        assert!(ShardSpec::from_env(env(&[("JOB_COMPLETION_INDEX", "5")]), Some(2)).is_err());
        assert_eq!(ShardSpec::from_env(env(&[]), None).unwrap(), None);
        // --shard-count beats Slurm's count; alone it is an error, not an unsharded run.
        let s = ShardSpec::from_env(env(&[("SLURM_ARRAY_TASK_ID", "2"), ("SLURM_ARRAY_TASK_COUNT", "1")]), Some(4));
        assert_eq!(s.unwrap(), Some(ShardSpec { index: 2, count: 4 }));
        assert!(matches!(ShardSpec::from_env(env(&[]), Some(2)), Err(ShardError::NoIndex)));
        assert!(ShardSpec::resolve(Some("0/3"), Some(2), env(&[])).is_err());
        assert_eq!(ShardSpec::resolve(Some("0/3"), Some(3), env(&[])).unwrap(), Some(ShardSpec { index: 0, count: 3 }));
    }
}
