//! The final report: a JSON file beside the output (`<output>.report.json`) and a short human
//! summary. Wall-clock values live here, never in rows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::record::ErrorKind;

pub const REPORT_FORMAT_VERSION: u32 = 1;

/// How the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Completed,
    /// Stopped past `--max-errors` (resumable).
    Aborted,
    /// Stopped by SIGINT/SIGTERM (resumable).
    Interrupted,
    DryRun,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Records this run was responsible for that it read (this shard's records).
    pub records: u64,
    pub ok: u64,
    pub error: u64,
    /// Already committed by an earlier run of the same job (resume).
    pub skipped_done: u64,
    /// `--incremental`: rows taken unchanged from the finished output (not computed).
    #[serde(default)]
    pub reused: u64,
    pub errors_by_kind: BTreeMap<ErrorKind, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tokens {
    /// Prompt tokens of the records processed in this run.
    pub prompt_total: u64,
    /// Prompt tokens actually computed (the rest came from the prefix cache).
    pub prompt_computed: u64,
    pub generated: u64,
    /// Records whose document was cut to fit `max_input_tokens`.
    pub truncated_records: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    pub format_version: u32,
    pub outcome: Outcome,
    pub pipeline: String,
    pub model: String,
    pub inputs: Vec<String>,
    pub output: String,
    pub shard: Option<String>,
    pub counts: Counts,
    /// Error rows among all rows committed for the output, this run's and earlier runs' (the
    /// job exits 3 when this is not 0). They are the rows with an `error` field.
    #[serde(default)]
    pub error_rows: u64,
    pub tokens: Tokens,
    pub wall_seconds: f64,
    /// Seconds spent inside model steps (the rest is job machinery: reading, rendering, writing).
    pub model_seconds: f64,
    pub records_per_second: f64,
    pub generated_tokens_per_second: f64,
    /// The engine's metrics (slots, prompt tokens computed after prefix reuse, KV blocks...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<serde_json::Value>,
    /// The identity of the output in place (this run's when it completed, else the earlier
    /// one's): what a rerun compares itself with (see `identity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<FinishedIdentity>,
    /// `--incremental`: how this run's records compare with the finished output it built on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incremental: Option<super::incremental::IncrementalCounts>,
    /// The error rows a completed job may hold and still exit 0.
    #[serde(default)]
    pub tolerance: super::tolerance::ErrorTolerance,
    /// A completed job: finish reasons and row flags over every row of the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<super::row_stats::RowStats>,
}

/// Writes `value` as pretty JSON to `path` whole: under `<path>.tmp`, then renamed (a failure
/// leaves the file before it as it was, and no temporary).
pub fn write_json(path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, text + "\n").and_then(|_| std::fs::rename(&tmp, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

impl JobReport {
    /// Fills the derived rates from the counts and `wall_seconds`.
    pub fn finalize_rates(&mut self) {
        let w = self.wall_seconds.max(1e-9);
        self.records_per_second = (self.counts.ok + self.counts.error) as f64 / w;
        self.generated_tokens_per_second = self.tokens.generated as f64 / w;
    }

    /// Where the report of `output` goes.
    pub fn path_for(output: &Path) -> PathBuf {
        let mut p = output.as_os_str().to_owned();
        p.push(".report.json");
        PathBuf::from(p)
    }

    /// Written to a temporary file next to `path`, then renamed over it: a kill leaves the old
    /// report or the new one, never a torn one.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        write_json(path, self)
    }

    /// The share of prompt tokens served by the prefix cache, in percent.
    pub fn prefix_reuse_percent(&self) -> f64 {
        if self.tokens.prompt_total == 0 {
            return 0.0;
        }
        100.0 * (1.0 - self.tokens.prompt_computed as f64 / self.tokens.prompt_total as f64)
    }

    /// A few lines for the terminal.
    pub fn human_summary(&self) -> String {
        let c = &self.counts;
        let mut s = format!(
            "{}: {} records ({} ok, {} error, {} already done) -> {}\n",
            match self.outcome {
                Outcome::Completed => "done",
                Outcome::Aborted => "ABORTED (too many errors)",
                Outcome::Interrupted => "INTERRUPTED",
                Outcome::DryRun => "dry run",
            },
            c.records,
            c.ok,
            c.error,
            c.skipped_done,
            self.output
        );
        if let Some(i) = &self.incremental {
            s += &format!(
                "incremental: {} new, {} changed (computed), {} reused unchanged, {} removed (no longer in the input)\n",
                i.new, i.changed, i.reused, i.removed
            );
        }
        if self.error_rows > 0 {
            let kinds: Vec<String> = c.errors_by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let kinds = if kinds.is_empty() { String::new() } else { format!(" (this run: {})", kinds.join(", ")) };
            let place = match self.outcome {
                Outcome::Completed => format!("in {}: the rows with an \"error\" field", self.output),
                _ => "in the checkpoint; they go to the output with the rest".to_string(),
            };
            let errors_file = super::errors_file::errors_path(Path::new(&self.output));
            s += &format!("error rows: {}{kinds}, {place}; listed in {}\n", self.error_rows, errors_file.display());
            if self.outcome == Outcome::Completed {
                let rows = self.finished.as_ref().map_or(c.records, |f| f.rows);
                let verdict = if self.tolerance.tolerates(self.error_rows, rows) { "within" } else { "over" };
                s += &format!(
                    "error rows: {} of {rows} rows ({:.1}%), {verdict} the tolerance ({})\n",
                    self.error_rows,
                    100.0 * self.error_rows as f64 / rows.max(1) as f64,
                    self.tolerance.describe()
                );
            }
        }
        if let Some(r) = &self.rows {
            s += &r.summary();
        }
        s += &format!(
            "tokens: {} prompt ({} computed, {:.1}% from prefix cache), {} generated\n",
            self.tokens.prompt_total,
            self.tokens.prompt_computed,
            self.prefix_reuse_percent(),
            self.tokens.generated
        );
        let machinery =
            if self.wall_seconds > 0.0 { 100.0 * (1.0 - self.model_seconds / self.wall_seconds) } else { 0.0 };
        s += &format!(
            "time: {:.1} s wall, {:.1} records/s, {:.1} generated tokens/s, {:.1}% outside model steps\n",
            self.wall_seconds, self.records_per_second, self.generated_tokens_per_second, machinery
        );
        s
    }
}

/// The identity of the output file in place, as the run that finished it wrote it (read back
/// by `identity` to decide what a rerun does).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FinishedIdentity {
    /// blake3 of `job` (the same as a checkpoint's digest for this job).
    pub digest: String,
    pub job: super::fingerprint::JobFingerprint,
    /// blake3 of the output file's bytes.
    pub output_blake3: String,
    /// blake3 of the per-record digests file (`<output>.digests.tsv`).
    pub digests_blake3: String,
    pub rows: u64,
    pub error_rows: u64,
}
