//! Whether the input is what the job reads: `run` without a pipeline reads OpenAI Batch request
//! files, with one it reads records of the pipeline's fields. Given the other kind, every row
//! became an error row (a missing `custom_id`, or a missing text field), the job "finished"
//! with exit 3, and the corrected command was then refused as a different job. The first record
//! of the first JSONL input is looked at before anything else runs.

use std::path::PathBuf;

use super::exit::UsageError;
use super::reader::{InputFormat, ReaderConfig, RecordReader};
use super::record::RecordBody;
use super::runner::JobKind;

/// `Err` (exit 2) when the first record of `inputs[0]` is plainly of the other kind.
pub fn check_first_record(job: &JobKind, inputs: &[PathBuf]) -> Result<(), UsageError> {
    let Some(first) = inputs.first().filter(|p| InputFormat::from_path(p) != InputFormat::Parquet) else {
        return Ok(());
    };
    // Unreadable or malformed inputs are the reader's to report, row by row.
    let Some(Ok(item)) = RecordReader::new(vec![first.clone()], ReaderConfig::objects("")).next() else {
        return Ok(());
    };
    let Ok(RecordBody::Fields(obj)) = item.body else { return Ok(()) };
    let batch_request = obj.contains_key("custom_id") && obj.contains_key("body");
    let at = format!("{} line {}", first.display(), item.line);
    match job {
        JobKind::OpenAi { .. } if !obj.contains_key("custom_id") && !obj.contains_key("body") => {
            Err(UsageError::new(format!(
                "{at}: no \"custom_id\" and no \"body\": without a pipeline `run` reads OpenAI Batch request \
                 files; name a pipeline for these records (e.g. `dustoff run summarize --input ...`)"
            )))
        }
        JobKind::Pipeline(p) if batch_request && !obj.contains_key(&p.spec.input.id_field) => {
            Err(UsageError::new(format!(
                "{at}: an OpenAI Batch request (\"custom_id\", \"body\"), not a record of pipeline '{}' (no \
                 \"{}\" field): leave out the pipeline to run the requests as they are",
                p.spec.name, p.spec.input.id_field
            )))
        }
        _ => Ok(()),
    }
}
