//! What a finished job leaves behind so that a rerun knows what it finished: the job's
//! identity (model, pipeline, generation parameters, a digest of each input file, the shard)
//! and digests of the output and of its per-record digests file, kept in the report
//! (`<output>.report.json`, field `finished`).
//!
//! Before a run computes anything, [`decide`] compares this run's job with the finished one:
//! - the same job, output untouched: nothing to do (the run says so and exits);
//! - a different job (what changed is named): refused like a different job's checkpoint,
//!   unless `--restart` (compute everything again) or `--incremental` over changed inputs only
//!   (compute the new and changed records, reuse the rest: [`super::incremental`]);
//! - no identity, or an output that no longer matches it (edited, or a kill between the output
//!   and its report): the run goes on as before (its checkpoint, if any, decides);
//! - a file no run left at all (no report, no checkpoint): refused unless `--restart`.

use std::path::{Path, PathBuf};

use super::fingerprint::JobFingerprint;
pub use super::report::FinishedIdentity;
use super::report::{JobReport, Outcome};

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "{output} is the finished output of a different job: {differs} changed since it was written \
         ({rows} rows, {error_rows} error rows). To replace it, add --restart (every record is computed \
         again){incremental_hint}"
    )]
    Changed { output: PathBuf, differs: String, rows: u64, error_rows: u64, incremental_hint: String },
    #[error(
        "{output} exists and is not the output of a dustoff run (no run's report {report}, no checkpoint): a run would \
         replace it. Move it away, choose another --output, or add --restart to replace it"
    )]
    Foreign { output: PathBuf, report: PathBuf },
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// What a run does about the output already in place.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// No finished output of a known job (or `--restart`): run as usual.
    Run,
    /// The same job finished this output and nothing changed: do nothing.
    NothingToDo(FinishedIdentity),
    /// `--incremental` over a finished output of the same model, pipeline and parameters:
    /// reuse its rows for unchanged records.
    Incremental(FinishedIdentity),
}

/// blake3 of a whole file (hex), streamed.
pub fn file_blake3(path: &Path) -> std::io::Result<String> {
    let mut h = blake3::Hasher::new();
    let mut f = std::fs::File::open(path)?;
    std::io::copy(&mut f, &mut h)?;
    Ok(h.finalize().to_hex().to_string())
}

/// The finished identity the report of `output` holds, if the output in place is still the
/// one it describes (same bytes, same digests file).
pub fn finished_in_place(output: &Path) -> Option<FinishedIdentity> {
    let text = std::fs::read_to_string(JobReport::path_for(output)).ok()?;
    let report: JobReport = serde_json::from_str(&text).ok()?;
    let f = report.finished?;
    let ok = file_blake3(output).ok()? == f.output_blake3
        && file_blake3(&super::incremental::digests_path(output)).ok()? == f.digests_blake3;
    if !ok {
        eprintln!(
            "note: {} changed since its report was written: its rows are not reused and the run goes on as usual",
            output.display()
        );
        return None;
    }
    Some(f)
}

/// Decides what this run does about the output in place (see the module comment). `this`: this
/// run's job; `unfinished`: a checkpoint of this output exists (it resumes whatever is found here).
pub fn decide(
    output: &Path,
    this: &JobFingerprint,
    restart: bool,
    incremental: bool,
    unfinished: bool,
) -> Result<Decision, IdentityError> {
    if restart || !output.is_file() {
        return Ok(Decision::Run);
    }
    let report = JobReport::path_for(output);
    let dir = super::checkpoint::checkpoint_dir(output);
    // A file no run left (no report a run wrote, no checkpoint, not even one moved aside by a
    // finish that was killed before its report) is someone's data: a run does not overwrite it
    // unasked. A report that is not a run's (garbage, a merge's) counts as none.
    let run_report =
        std::fs::read_to_string(&report).ok().is_some_and(|t| serde_json::from_str::<JobReport>(&t).is_ok());
    if !unfinished && !run_report && !dir.exists() && !super::checkpoint::discard_dir(&dir).exists() {
        return Err(IdentityError::Foreign { output: output.to_path_buf(), report });
    }
    let Some(f) = finished_in_place(output) else { return Ok(Decision::Run) };
    if f.job == *this && !unfinished {
        return Ok(Decision::NothingToDo(f));
    }
    let changed = f.job.differences(this);
    let only_inputs = changed.iter().all(|d| *d == "the input files");
    if incremental && only_inputs {
        return Ok(Decision::Incremental(f));
    }
    if unfinished {
        // A checkpoint of this job (checked before) resumes: it was started by --restart or
        // --incremental, and its output replaces this one when it completes.
        return Ok(Decision::Run);
    }
    let incremental_hint = if only_inputs {
        "; to compute only the new and changed records and keep the other rows, add --incremental".to_string()
    } else {
        String::new()
    };
    Err(IdentityError::Changed {
        output: output.to_path_buf(),
        differs: f.job.describe_differences(this),
        rows: f.rows,
        error_rows: f.error_rows,
        incremental_hint,
    })
}

/// The identity of a just-finished output (`job`: its identity, without an incremental base).
pub fn finished_now(
    output: &Path,
    job: &JobFingerprint,
    rows: u64,
    error_rows: u64,
) -> Result<FinishedIdentity, IdentityError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| IdentityError::Io { path, source }
    };
    let digests = super::incremental::digests_path(output);
    Ok(FinishedIdentity {
        digest: job.digest(),
        job: job.clone(),
        output_blake3: file_blake3(output).map_err(io(output))?,
        digests_blake3: file_blake3(&digests).map_err(io(&digests))?,
        rows,
        error_rows,
    })
}

/// The finished identity to keep in the report of a run that did not complete: the output in
/// place is still the earlier one.
pub fn carried_over(output: &Path) -> Option<FinishedIdentity> {
    let text = std::fs::read_to_string(JobReport::path_for(output)).ok()?;
    let report: JobReport = serde_json::from_str(&text).ok()?;
    if report.outcome == Outcome::DryRun {
        return None;
    }
    report.finished
}
