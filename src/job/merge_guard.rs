//! What `merge` checks around the merge itself (`shard::merge` puts the rows in order):
//! - its `--output` is none of the shards' files (a shard, its `.order`, report, errors or
//!   digests file), not a directory, and its directory is made when missing
//!   (`outputs::check_output`);
//! - an existing `--output` is replaced only when it is an earlier merge, unchanged since (the
//!   merge report beside it says so; of this job, or of the same shards run again over new
//!   input): merge used to overwrite any file, a job's input or a run's finished output included;
//! - the output's job lock is held while it is written (a `run` of the same output: exit 5);
//! - every shard is still the file its run finished (the blake3 its report holds): a truncated
//!   or edited shard was merged with exit 0;
//! - the merge writes `<output>.report.json` (the job, the shards, the rows and error rows, and
//!   the output's blake3) before the merged file takes the output's name, so a merge in place
//!   always has the report that lets a rerun replace it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::identity::file_blake3;
use super::report::JobReport;
use super::usage::UsageError;

/// The report a merge writes beside its output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergeReport {
    pub merged: Merged,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Merged {
    /// The job digest every shard's `.order` header holds (shard left out).
    pub job: String,
    pub shards: Vec<PathBuf>,
    pub rows: u64,
    pub error_rows: u64,
    /// blake3 of the merged output's bytes.
    pub output_blake3: String,
}

/// What a shard's report says of its finished run, checked against its bytes.
pub struct ShardCheck {
    pub error_rows: u64,
    /// The job's input files (as its run named them).
    pub inputs: Vec<PathBuf>,
    /// `--allow-errors` / `--max-error-rate` of its run: the merge exits as the run would.
    pub tolerance: super::tolerance::ErrorTolerance,
}

/// Refuses an output that is a directory, one of the shards' files or one of the job's input
/// files (`inputs`); makes its directory.
pub fn check_paths(output: &Path, shards: &[PathBuf], inputs: &[PathBuf]) -> Result<(), super::outputs::OutputError> {
    let owned: Vec<PathBuf> = shards.iter().flat_map(|s| super::outputs::owned_paths(s)).collect();
    let all: Vec<&Path> = owned.iter().chain(inputs).map(PathBuf::as_path).collect();
    super::outputs::check_output(output, &all)
}

/// Refuses an existing output that is not an unchanged earlier merge (`job`: the shards' job
/// digest; an earlier merge of another job, the same shards run again over a grown input, is
/// replaced, and said).
pub fn check_existing(output: &Path, job: &str) -> Result<(), UsageError> {
    if !output.exists() {
        return Ok(());
    }
    let earlier = std::fs::read_to_string(JobReport::path_for(output))
        .ok()
        .and_then(|t| serde_json::from_str::<MergeReport>(&t).ok());
    let shown = output.display();
    match earlier {
        Some(r) if file_blake3(output).ok().as_deref() != Some(r.merged.output_blake3.as_str()) => {
            Err(UsageError::new(format!(
                "--output {shown} changed since it was merged (its bytes differ from its report's digest); remove it to merge again"
            )))
        }
        Some(r) => {
            if r.merged.job != job {
                eprintln!("merge: replacing {shown}, the earlier merge of another job ({} rows)", r.merged.rows);
            }
            Ok(())
        }
        None => Err(UsageError::new(format!(
            "--output {shown} exists and is not an earlier merge of these shards (no merge report beside it); remove it or choose another --output"
        ))),
    }
}

/// The shard's run finished it and it is unchanged since: its report's `finished` digest
/// equals its bytes' blake3.
pub fn check_shard(shard: &Path) -> Result<ShardCheck, UsageError> {
    let shown = shard.display();
    let report = JobReport::path_for(shard);
    let text = std::fs::read_to_string(&report).map_err(|e| {
        UsageError::new(format!(
            "{shown}: cannot read its run's report {} ({e}): merge takes finished shards",
            report.display()
        ))
    })?;
    let not_finished =
        || UsageError::new(format!("{shown}: its report {} does not describe a finished run", report.display()));
    let r = serde_json::from_str::<JobReport>(&text).map_err(|_| not_finished())?;
    let finished = r.finished.ok_or_else(not_finished)?;
    let bytes = file_blake3(shard).map_err(|e| UsageError::new(format!("cannot read {shown}: {e}")))?;
    if bytes != finished.output_blake3 {
        return Err(UsageError::new(format!(
            "{shown} changed since its run finished it (its bytes differ from the digest in {}): run that shard again",
            report.display()
        )));
    }
    Ok(ShardCheck {
        error_rows: finished.error_rows,
        inputs: r.inputs.iter().map(PathBuf::from).collect(),
        tolerance: r.tolerance,
    })
}

/// Writes the merge report beside `output` (whole, under a temporary name, then renamed).
pub fn write_report(output: &Path, merged: Merged) -> std::io::Result<()> {
    super::report::write_json(&JobReport::path_for(output), &MergeReport { merged })
}
