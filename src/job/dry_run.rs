//! `--dry-run`: read, render, tokenize and plan without the model. Says how many records there
//! are, their token counts, how much the prefix cache would save, and which records would fail.

use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::pipeline::TextCodec;
use super::reader::RecordReader;
use super::record::ErrorKind;
use super::runner::{prepare, JobKind, Prepared};
use super::shard::ShardSpec;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DryRunReport {
    pub records: u64,
    pub ok: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<ErrorKind, u64>,
    /// The first few error rows' (line, message), to show the user.
    pub first_errors: Vec<(u64, String)>,
    pub prompt_tokens: u64,
    /// Prompt tokens left to compute with full-block prefix reuse across the job.
    pub prompt_tokens_uncached: u64,
    pub max_prompt_tokens: u64,
    /// Upper bound of generated tokens (sum of max_tokens).
    pub generation_budget: u64,
    pub truncated: u64,
    pub seconds: f64,
    /// Hybrid models: bytes of one sequence's recurrent state (conv window + delta-rule
    /// matrices of every linear layer), from the model's metadata; absent for other models and
    /// vocab-only files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recurrent_state_bytes_per_sequence: Option<u64>,
    /// Rows an unfinished checkpoint of this job already holds (the real run skips them).
    #[serde(default)]
    pub resumed_rows: u64,
    /// The exit code the real run would end with if every record ran as planned (0, or 3 when
    /// the records that would fail are over the error tolerance); also the dry run's own.
    #[serde(default)]
    pub exit_code: u8,
    /// GPU KV cache bytes of one cached position (every attention layer, K and V) by cache type
    /// (`f16`, `q8`: `--kv-cache`), from the model's metadata; absent for vocab-only files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_bytes_per_position: Option<BTreeMap<String, u64>>,
}

impl DryRunReport {
    /// KV positions a sequence of this job holds on average while it runs, when its shared
    /// prefix blocks are held once for all: its own (uncached) prompt tokens and a whole
    /// generation (`generation_budget`: every `max_tokens`), rounded up to whole blocks and
    /// one block more for the partly filled last one; `None` when no record would run.
    pub fn expected_positions(&self, block_size: usize) -> Option<usize> {
        let ok = self.ok.max(1);
        (self.ok > 0).then(|| {
            let own = (self.prompt_tokens_uncached + self.generation_budget).div_ceil(ok) as usize;
            own.div_ceil(block_size.max(1)) * block_size.max(1) + block_size.max(1)
        })
    }

    pub fn records_per_second(&self) -> f64 {
        self.records as f64 / self.seconds.max(1e-9)
    }

    /// A few lines for the operator (`--json` prints the report itself).
    pub fn human_summary(&self, output: &str) -> String {
        let mut s = format!(
            "dry run: {} records, {} would run, {} would fail -> {output}\n",
            self.records, self.ok, self.errors
        );
        if self.resumed_rows > 0 {
            s += &format!("checkpoint: {} rows already committed; the run resumes after them\n", self.resumed_rows);
        }
        let reuse = if self.prompt_tokens > 0 {
            100.0 * (1.0 - self.prompt_tokens_uncached as f64 / self.prompt_tokens as f64)
        } else {
            0.0
        };
        s += &format!(
            "prompt tokens: {} ({} to compute, {reuse:.1}% from the prefix cache), longest {}; at most {} generated\n",
            self.prompt_tokens, self.prompt_tokens_uncached, self.max_prompt_tokens, self.generation_budget
        );
        if self.truncated > 0 {
            s += &format!("truncated: {} records cut to max_input_tokens\n", self.truncated);
        }
        if self.errors > 0 {
            let kinds: Vec<String> = self.errors_by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
            s += &format!("would fail: {} ({})\n", self.errors, kinds.join(", "));
            for (line, m) in &self.first_errors {
                s += &format!("  line {line}: {m}\n");
            }
            if self.errors as usize > self.first_errors.len() {
                s += &format!("  ... {} more\n", self.errors as usize - self.first_errors.len());
            }
        }
        s += &format!("time: {:.2} s, {:.0} records/s\n", self.seconds, self.records_per_second());
        s
    }
}

/// Most block hashes remembered by the estimate (64 MiB of u64s at most).
const MAX_BLOCKS: usize = 8 << 20;

/// Runs the job up to the engine. Records are prepared in parallel in chunks (rayon), then
/// counted in input order, so the estimate of prefix reuse is the same as a one-slot run's.
pub fn dry_run(
    job: &JobKind,
    inputs: &[PathBuf],
    shard: Option<ShardSpec>,
    codec: &(dyn TextCodec + Sync),
    block_size: usize,
) -> anyhow::Result<DryRunReport> {
    scan(job, inputs, shard, codec, block_size, u64::MAX)
}

/// The dry run of the job's first `records` records: what `--slots auto` sizes the KV pool by
/// ([`DryRunReport::expected_positions`]) before the model is placed.
pub fn sample(
    job: &JobKind,
    inputs: &[PathBuf],
    shard: Option<ShardSpec>,
    codec: &(dyn TextCodec + Sync),
    block_size: usize,
    records: u64,
) -> anyhow::Result<DryRunReport> {
    scan(job, inputs, shard, codec, block_size, records)
}

fn scan(
    job: &JobKind,
    inputs: &[PathBuf],
    shard: Option<ShardSpec>,
    codec: &(dyn TextCodec + Sync),
    block_size: usize,
    limit: u64,
) -> anyhow::Result<DryRunReport> {
    let start = Instant::now();
    let mut cfg = job.reader_config();
    cfg.shard = shard;
    let mut reader = RecordReader::new(inputs.to_vec(), cfg);
    let mut rep = DryRunReport::default();
    let mut blocks: HashSet<u64> = HashSet::new();
    let bs = block_size.max(1);
    loop {
        let mut chunk = Vec::with_capacity(2048);
        let room = limit.saturating_sub(rep.records).min(2048) as usize;
        for item in reader.by_ref().take(room) {
            chunk.push(item?);
        }
        if chunk.is_empty() {
            break;
        }
        let prepared: Vec<Prepared> = chunk.par_iter().map(|it| prepare(job, codec, it)).collect();
        for (item, p) in chunk.iter().zip(prepared) {
            rep.records += 1;
            match p {
                Prepared::Row(e) => {
                    rep.errors += 1;
                    *rep.errors_by_kind.entry(e.kind).or_insert(0) += 1;
                    if rep.first_errors.len() < 20 {
                        rep.first_errors.push((item.line, e.to_string()));
                    }
                }
                Prepared::Request(req, _, truncated) => {
                    rep.ok += 1;
                    rep.truncated += u64::from(truncated);
                    let n = req.prompt.len() as u64;
                    rep.prompt_tokens += n;
                    rep.max_prompt_tokens = rep.max_prompt_tokens.max(n);
                    rep.generation_budget += u64::from(req.max_tokens);
                    // Full blocks chained by hash, as the KV pool identifies them; a hit is
                    // capped so the last prompt token is always computed.
                    let mut parent = 0u64;
                    let mut hit = 0u64;
                    let mut missed = false;
                    for b in req.prompt.chunks_exact(bs) {
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        parent.hash(&mut h);
                        b.hash(&mut h);
                        parent = h.finish();
                        if !missed && blocks.contains(&parent) {
                            hit += bs as u64;
                        } else {
                            missed = true;
                            if blocks.len() < MAX_BLOCKS {
                                blocks.insert(parent);
                            }
                        }
                    }
                    rep.prompt_tokens_uncached += n - hit.min(n.saturating_sub(1));
                }
            }
        }
    }
    rep.seconds = start.elapsed().as_secs_f64();
    Ok(rep)
}
