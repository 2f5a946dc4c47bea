//! `dustoff generate`: JSONL prompts in, JSONL completions out; or one `--prompt` streamed to the
//! terminal with prefill and decode speed at the end.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use serde_json::{json, Value};

use super::common::{read_jsonl, JsonlWriter};
use crate::backend::Backend;
use crate::engine::engine::{Engine, EngineMetrics, Event, Request};
use crate::engine::sampler::{derive_seed, Sampler, SamplingParams};
use crate::engine::single::generate_one;
use crate::model::loader::LoadedModel;
use crate::tokenizer::{ChatMessage, StreamDecoder};

#[derive(Clone, Debug)]
pub struct GenOptions {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

impl GenOptions {
    /// Per-request sampling: the seed is derived from (job seed, record id) so reordering or
    /// resuming a job does not change a record's text.
    pub fn sampling_for(&self, record_key: &str) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: derive_seed(self.seed, record_key),
        }
    }
}

/// A prompt ready to run.
pub struct Prepared {
    pub id: Value,
    pub prompt_ids: Vec<u32>,
}

/// Turns one input line into prompt ids: `{"id", "prompt"}` (raw text, BOS as the model says),
/// `{"id", "prompt_ids": [...]}`, optionally `"chat": true` for the model's chat template.
pub fn prepare(m: &LoadedModel, v: &Value) -> Result<Prepared, String> {
    let id = v.get("id").cloned().unwrap_or(Value::Null);
    if !v.is_object() {
        return Err("each line must be a JSON object".into());
    }
    let chat = match v.get("chat") {
        None => false,
        Some(c) => c.as_bool().ok_or("field 'chat' is not a bool")?,
    };
    let prompt_ids = if let Some(p) = v.get("prompt_ids") {
        let arr = p.as_array().ok_or("field 'prompt_ids' is not an array")?;
        let mut ids = Vec::with_capacity(arr.len());
        for x in arr {
            let t = x.as_u64().filter(|&t| (t as usize) < m.config.vocab_size).ok_or_else(|| {
                format!("prompt_ids holds {x}, not a token id below the vocabulary size {}", m.config.vocab_size)
            })?;
            ids.push(t as u32);
        }
        ids
    } else {
        let text = v
            .get("prompt")
            .and_then(Value::as_str)
            .ok_or("field 'prompt' (or 'prompt_ids') is missing or not a string")?;
        let tok = &m.tokenizer;
        if chat {
            let msgs = [ChatMessage { role: "user".into(), content: text.into() }];
            let rendered = tok.apply_chat_template(&msgs, true).map_err(|e| e.to_string())?;
            // The template writes any BOS itself; special tokens in it must be parsed.
            tok.encode(&rendered, false, true).map_err(|e| e.to_string())?
        } else {
            tok.encode(text, tok.add_bos_default(), false).map_err(|e| e.to_string())?
        }
    };
    if prompt_ids.is_empty() {
        return Err("the prompt is empty".into());
    }
    Ok(Prepared { id, prompt_ids })
}

/// Stable key of a record id for seed derivation.
pub fn id_key(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// JSONL mode: every prompt goes through the slot engine; rows are written in input order.
/// Returns the number of error rows and the engine's metrics.
pub fn run_jsonl<B: Backend>(
    m: &LoadedModel,
    engine: &mut Engine<B>,
    input: &Path,
    output: &Path,
    opt: &GenOptions,
) -> Result<(usize, EngineMetrics)> {
    let stop = m.tokenizer.eos_ids().to_vec();
    let records = read_jsonl(input)?;
    let total = records.len();
    // rows[i]: the finished row of input line i (error rows are ready at once).
    let mut rows: Vec<Option<Value>> = vec![None; total];
    let mut prompt_len = vec![0usize; total];
    let mut ids = vec![Value::Null; total];
    let mut errors = 0;
    for (i, (line, rec)) in records.into_iter().enumerate() {
        // A row that failed keeps its id when the line had one; `line` locates it either way.
        let prepared = match rec {
            Err(msg) => Err((Value::Null, msg)),
            Ok(v) => prepare(m, &v).map_err(|e| (v.get("id").cloned().unwrap_or(Value::Null), e)),
        };
        let p = match prepared {
            Ok(p) => p,
            Err((id, msg)) => {
                errors += 1;
                eprintln!("{}:{line}: {msg}", input.display());
                rows[i] = Some(json!({"id": id, "line": line, "error": msg}));
                continue;
            }
        };
        let req = Request {
            id: i as u64,
            prompt: p.prompt_ids.clone(),
            max_tokens: opt.max_tokens,
            sampling: opt.sampling_for(&id_key(&p.id)),
            stop_ids: stop.clone(),
        };
        prompt_len[i] = p.prompt_ids.len();
        ids[i] = p.id;
        if let Err(e) = engine.add_request(req) {
            errors += 1;
            eprintln!("{}:{line}: {e}", input.display());
            rows[i] = Some(json!({"id": ids[i], "line": line, "error": e.to_string()}));
        }
    }
    let mut done = rows.iter().filter(|r| r.is_some()).count();
    while engine.has_work() {
        for ev in engine.step()? {
            if let Event::Finished(c) = ev {
                let i = c.id as usize;
                let text = m.tokenizer.decode(&c.token_ids).map_err(|e| anyhow::anyhow!("{e}"))?;
                rows[i] = Some(json!({
                    "id": ids[i],
                    "prompt_tokens": prompt_len[i],
                    "token_ids": c.token_ids,
                    "text": text,
                    "finish_reason": c.finish_reason.as_str(),
                }));
                done += 1;
                eprintln!("[{done}/{total}] done");
            }
        }
    }
    let mut w = JsonlWriter::create(output)?;
    for r in rows.into_iter().flatten() {
        w.write(&r)?;
    }
    w.finish()?;
    Ok((errors, engine.metrics()))
}

/// Interactive mode: streams the completion of one prompt to stdout.
pub fn run_prompt<B: Backend + ?Sized>(
    m: &LoadedModel,
    b: &mut B,
    prompt: &str,
    chat: bool,
    opt: &GenOptions,
) -> Result<()> {
    let p = prepare(m, &json!({"id": "prompt", "prompt": prompt, "chat": chat})).map_err(anyhow::Error::msg)?;
    let mut sampler = Sampler::new(opt.sampling_for("prompt"));
    let mut dec = StreamDecoder::new(&m.tokenizer);
    let mut stdout = std::io::stdout();
    let mut err = None;
    let out =
        generate_one(b, &p.prompt_ids, opt.max_tokens, &mut sampler, m.tokenizer.eos_ids(), |t| match dec.push(t) {
            Ok(s) => {
                let _ = stdout.write_all(s.as_bytes());
                let _ = stdout.flush();
            }
            Err(e) => err = Some(e),
        })?;
    if let Some(e) = err {
        return Err(anyhow::anyhow!("detokenizing: {e}"));
    }
    let tail = dec.finish().map_err(|e| anyhow::anyhow!("detokenizing: {e}"))?;
    println!("{tail}");
    let n = out.token_ids.len();
    let pf = out.prefill_time.as_secs_f64();
    let dc = out.decode_time.as_secs_f64();
    eprintln!(
        "\n[{}] prompt {} tokens, prefill {:.1} tok/s; generated {} tokens, decode {:.1} tok/s; finish: {}",
        b.describe(),
        p.prompt_ids.len(),
        p.prompt_ids.len() as f64 / pf.max(1e-9),
        n,
        if n > 1 { (n - 1) as f64 / dc.max(1e-9) } else { 0.0 },
        out.finish_reason.as_str()
    );
    Ok(())
}
