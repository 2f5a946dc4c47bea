//! Calibration on the prompts a job will feed (`quantize --pipeline P --calibration FILE`):
//! every record of FILE (JSONL or Parquet, read exactly as `dustoff run` reads its input) is
//! rendered through the pipeline's template and chat template and tokenized as the job does
//! (`Pipeline::prompt_ids`: the model's BOS, the template's special tokens parsed, the record's
//! own text as plain text, `limits.max_input_tokens` with the pipeline's overflow policy). So
//! the importance matrix sees the system prompt, the instruction and the chat markup at the
//! positions the job puts them, not only the documents.
//!
//! One window per record, from position 0 (a job runs each prompt as its own sequence);
//! records are taken in input order until `max_tokens`, the last one cut to the budget. The
//! answers the model would write are not included (that would need generation).

use std::path::Path;

use serde::Serialize;

use super::QuantizeError;
use crate::job::adapters::TokenizerCodec;
use crate::job::pipeline::Pipeline;
use crate::job::reader::{ReaderConfig, RecordReader};
use crate::job::record::RecordBody;
use crate::tokenizer::Tokenizer;

/// The token windows of a pipeline's prompts and what was left out.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PromptWindows {
    #[serde(skip)]
    pub windows: Vec<Vec<u32>>,
    /// Records whose prompt went in (the last one possibly cut to the token budget).
    pub records: usize,
    /// Records the job would answer with an error row (unparsable line, missing field, a
    /// prompt over `max_input_tokens` under `overflow = "error"`): not used.
    pub skipped: usize,
    /// Prompts whose document the pipeline's overflow policy shortened.
    pub truncated: usize,
}

/// See the module docs. `input`: the calibration file (JSONL or Parquet).
pub fn pipeline_windows(
    tok: &Tokenizer,
    pipeline: &Pipeline,
    input: &Path,
    max_tokens: usize,
) -> Result<PromptWindows, QuantizeError> {
    let spec = &pipeline.spec.input;
    let fields: Vec<&str> = spec.fields.iter().map(String::as_str).collect();
    let mut cfg = ReaderConfig::new(&spec.id_field, &fields);
    cfg.document_field = Some(pipeline.document_field().to_string());
    let codec = TokenizerCodec(tok);
    let mut out = PromptWindows::default();
    let mut taken = 0usize;
    for item in RecordReader::new(vec![input.to_path_buf()], cfg) {
        if taken >= max_tokens {
            break;
        }
        let item = item?;
        let (Some(id), Ok(RecordBody::Fields(f))) = (&item.id, &item.body) else {
            out.skipped += 1;
            continue;
        };
        let Ok(p) = pipeline.prompt_ids(&codec, id, f) else {
            out.skipped += 1;
            continue;
        };
        let mut ids = p.ids;
        ids.truncate(max_tokens - taken);
        taken += ids.len();
        out.truncated += usize::from(p.truncated);
        out.records += 1;
        out.windows.push(ids);
    }
    if out.windows.is_empty() {
        return Err(QuantizeError::Calibration {
            path: input.to_path_buf(),
            reason: format!(
                "no record gave a prompt through pipeline {} ({} skipped: error rows in a job)",
                pipeline.path.display(),
                out.skipped
            ),
        });
    }
    Ok(out)
}
