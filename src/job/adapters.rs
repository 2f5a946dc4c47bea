//! Adapters from the slot engine and the tokenizer to the job loop's two traits.

use std::ops::Range;

use anyhow::Result;

use crate::backend::Backend;
use crate::engine::batch::{Engine, EngineError, Event, Request};
use crate::engine::constraint::Grammar;
use crate::engine::finish::FinishReason;
use crate::job::pipeline::TextCodec;
use crate::job::runner::{Finished, GenRequest, Generate, StopFlag};
use crate::tokenizer::{ChatMessage, Tokenizer};

/// The engine behind `Generate`: requests are queued in the engine, `poll` steps it.
pub struct EngineGenerate<B: Backend> {
    pub engine: Engine<B>,
    stop_ids: Vec<u32>,
    /// Requests the engine refused (e.g. longer than the KV cache): reported as per-record errors.
    refused: Vec<Finished>,
    /// How many requests may wait beyond the running slots (waiting requests let the
    /// scheduler fill a freed slot at once and group requests by shared prefix).
    queue: usize,
    /// When set (SIGTERM), `poll` returns between engine steps instead of waiting for a request
    /// to finish: in-flight requests are dropped anyway, and a long generation must not hold up
    /// the checkpoint past a scheduler's kill timeout.
    stop: Option<StopFlag>,
    /// The pipeline's output grammar: every request is decoded under it.
    grammar: Option<Grammar>,
}

impl<B: Backend> EngineGenerate<B> {
    pub fn new(engine: Engine<B>, stop_ids: Vec<u32>) -> Self {
        let queue = engine.config().slots * 3;
        EngineGenerate { engine, stop_ids, refused: Vec::new(), queue, stop: None, grammar: None }
    }

    /// Decodes every request under `grammar` (the pipeline's `[output]` shape).
    pub fn with_grammar(mut self, grammar: Option<Grammar>) -> Self {
        self.grammar = grammar;
        self
    }

    /// Makes `poll` return early once `stop` is set.
    pub fn with_stop(mut self, stop: StopFlag) -> Self {
        self.stop = Some(stop);
        self
    }
}

impl<B: Backend> Generate for EngineGenerate<B> {
    fn capacity(&self) -> usize {
        self.engine.config().slots + self.queue
    }

    fn slots(&self) -> usize {
        self.engine.config().slots
    }

    fn submit(&mut self, req: GenRequest) -> Result<()> {
        let r = Request {
            id: req.key,
            prompt: req.prompt,
            max_tokens: req.max_tokens as usize,
            sampling: req.sampling,
            stop_ids: self.stop_ids.clone(),
        };
        match self.engine.add_constrained(r, self.grammar.as_ref().map(Grammar::start)) {
            Ok(()) => {}
            // A request the engine cannot take is that record's error, not the job's.
            Err(e @ EngineError::InvalidRequest { .. }) => self.refused.push(Finished {
                key: req.key,
                result: Err(e.to_string()),
                finish_reason: FinishReason::Stop,
                cached_prompt_tokens: 0,
            }),
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    fn poll(&mut self) -> Result<Vec<Finished>> {
        let mut out = std::mem::take(&mut self.refused);
        while out.is_empty() && self.engine.has_work() && !self.stop.as_ref().is_some_and(StopFlag::is_set) {
            for ev in self.engine.step()? {
                if let Event::Finished(c) = ev {
                    out.push(Finished {
                        key: c.id,
                        result: Ok(c.token_ids),
                        finish_reason: c.finish_reason,
                        cached_prompt_tokens: c.cached_prompt_tokens as u32,
                    });
                }
            }
        }
        Ok(out)
    }

    fn metrics_json(&self) -> Option<serde_json::Value> {
        serde_json::to_value(self.engine.metrics()).ok()
    }
}

/// The tokenizer behind `TextCodec`. Text the job gives as a whole (`encode`) is tokenized with
/// special tokens parsed and the model's own BOS rule; a pipeline's rendered prompt
/// (`encode_prompt`) parses only the special tokens outside the record's own text, and a
/// document alone (`encode_plain`) parses none.
pub struct TokenizerCodec<'a>(pub &'a Tokenizer);

impl TextCodec for TokenizerCodec<'_> {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.0.encode(text, self.0.add_bos_default(), true).map_err(|e| e.to_string())
    }
    fn encode_prompt(&self, text: &str, plain: &[Range<usize>]) -> Result<Vec<u32>, String> {
        self.0.encode_prompt(text, self.0.add_bos_default(), plain).map_err(|e| e.to_string())
    }
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>, String> {
        self.0.encode(text, false, false).map_err(|e| e.to_string())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.0.decode(ids).map_err(|e| e.to_string())
    }
    fn decode_generated(&self, ids: &[u32]) -> Result<String, String> {
        self.0.decode_generated(ids).map_err(|e| e.to_string())
    }
    fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, String> {
        self.0.apply_chat_template(messages, true).map_err(|e| e.to_string())
    }
    fn chat_prompt_thinking(&self, messages: &[ChatMessage], thinking: bool) -> Result<String, String> {
        self.0.apply_chat_template_thinking(messages, true, thinking).map_err(|e| e.to_string())
    }
}
