//! Pipelines: a job definition as data (TOML). The prompt template is a minijinja template over
//! the record's fields; the shared system prompt and instruction come first so every record's
//! prompt starts with the same tokens (their KV blocks are computed once per job).
//!
//! ```toml
//! name = "summarize"
//! [input]            # id_field = "id", fields = ["text"], document_field = first field
//! [prompt]           # system, instruction, template = "{{ text }}", chat_template = true,
//!                    # thinking = false (true: see job::thinking)
//! [generation]       # max_tokens, temperature, top_p, top_k, seed
//! [output]           # kind = "text" | "json" | "choice" | "regex" (see job::output),
//!                    # thinking_field = "reasoning" (keeps the think block, with thinking on)
//! [limits]           # max_input_tokens, overflow = "truncate-tail" | "truncate-head" | "error", marker
//! ```

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use minijinja::{Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::output::OutputShape;
pub use super::output_spec::{parse_json_output, OutputKind, OutputSpec};
use super::record::{ChatMessage, ErrorKind, RecordError};
use super::spans::{differing_range, fill_markers, marker, marker_head};
use super::thinking;
use super::writer::RowOutput;
use crate::engine::constraint::OutputConstraint;
use crate::engine::finish::FinishReason;
use crate::engine::sampler::{derive_seed, SamplingParams};

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(
        "pipeline '{name}' not found; looked for:{places}\n(give a path, or a folder of pipelines in \
         DUSTOFF_PIPELINES (or --pipelines DIR for run and generate); `dustoff run --help` says where names \
         are looked up)"
    )]
    NotFound { name: String, places: String },
    #[error("cannot read pipeline {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("pipeline {path} is not a valid pipeline: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("pipeline {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    #[serde(default = "default_id")]
    pub id_field: String,
    /// Text fields the template reads (each must be present and a string).
    #[serde(default = "default_fields")]
    pub fields: Vec<String>,
    /// The field that is checked for emptiness and truncated when too long (default: first field).
    #[serde(default)]
    pub document_field: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptSpec {
    /// Shared system prompt (the first message).
    #[serde(default)]
    pub system: String,
    /// Shared instruction, placed before the per-record text in the user message.
    #[serde(default)]
    pub instruction: String,
    /// minijinja template over the record's fields.
    #[serde(default = "default_template")]
    pub template: String,
    /// Wrap in the model's chat template (off: plain text, parts joined by blank lines).
    #[serde(default = "yes")]
    pub chat_template: bool,
    /// Render the chat template with thinking on (`enable_thinking`) and strip the model's
    /// `<think>...</think>` block from the row (see `job::thinking`). Off by default: batch
    /// jobs want the answer.
    #[serde(default)]
    pub thinking: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationSpec {
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    #[serde(default)]
    pub temperature: f32,
    #[serde(default = "one")]
    pub top_p: f32,
    #[serde(default)]
    pub top_k: usize,
    /// Job seed; each record's seed is derived from it and the record id.
    #[serde(default)]
    pub seed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overflow {
    /// Keep the start of the document, cut its end.
    TruncateTail,
    /// Keep the end of the document, cut its start.
    TruncateHead,
    /// An `input_too_long` error row.
    Error,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    #[serde(default = "default_max_input")]
    pub max_input_tokens: u32,
    #[serde(default = "default_overflow")]
    pub overflow: Overflow,
    /// Put where text was cut.
    #[serde(default = "default_marker")]
    pub marker: String,
}

/// A pipeline file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default = "default_input")]
    pub input: InputSpec,
    #[serde(default = "default_prompt")]
    pub prompt: PromptSpec,
    #[serde(default = "default_generation")]
    pub generation: GenerationSpec,
    #[serde(default = "default_output")]
    pub output: OutputSpec,
    #[serde(default = "default_limits")]
    pub limits: LimitsSpec,
}

/// The keys of a result row, which `output.thinking_field` must not take.
const ROW_KEYS: [&str; 9] = [
    "id",
    "output",
    "finish_reason",
    "prompt_tokens",
    "generated_tokens",
    "input_truncated",
    "empty_output",
    "error",
    "line",
];

fn default_id() -> String {
    "id".into()
}
fn default_fields() -> Vec<String> {
    vec!["text".into()]
}
fn default_template() -> String {
    "{{ text }}".into()
}
fn yes() -> bool {
    true
}
fn one() -> f32 {
    1.0
}
fn default_max_tokens() -> u32 {
    128
}
fn default_max_input() -> u32 {
    2048
}
fn default_overflow() -> Overflow {
    Overflow::TruncateTail
}
fn default_marker() -> String {
    " [...] ".into()
}
fn default_input() -> InputSpec {
    InputSpec { id_field: default_id(), fields: default_fields(), document_field: None }
}
fn default_prompt() -> PromptSpec {
    PromptSpec {
        system: String::new(),
        instruction: String::new(),
        template: default_template(),
        chat_template: yes(),
        thinking: false,
    }
}
fn default_generation() -> GenerationSpec {
    GenerationSpec { max_tokens: default_max_tokens(), temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0 }
}
fn default_output() -> OutputSpec {
    OutputSpec {
        kind: OutputKind::Text,
        required_keys: Vec::new(),
        schema: None,
        schema_file: None,
        choices: Vec::new(),
        pattern: None,
        thinking_field: None,
    }
}
fn default_limits() -> LimitsSpec {
    LimitsSpec { max_input_tokens: default_max_input(), overflow: default_overflow(), marker: default_marker() }
}

/// The tokenizer as the pipeline needs it (implemented by the runner over the real tokenizer).
pub trait TextCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;
    /// A rendered prompt whose byte ranges `plain` hold the record's own text: special tokens
    /// are recognised only outside those ranges, so a document that contains `<|im_start|>`
    /// cannot open a chat turn. The default (`encode`) is right only for codecs without special
    /// tokens; a real tokenizer must override it.
    fn encode_prompt(&self, text: &str, plain: &[Range<usize>]) -> Result<Vec<u32>, String> {
        let _ = plain;
        self.encode(text)
    }
    /// A document alone (to measure and cut it): special-token text as plain text, no BOS.
    /// The default (`encode`) is right only for codecs without special tokens or BOS.
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encode(text)
    }
    fn decode(&self, ids: &[u32]) -> Result<String, String>;
    /// The text of generated `ids`: as `decode`, but a character left incomplete by the last
    /// token (a generation cut at `max_tokens` inside a multi-byte character) is dropped
    /// instead of ending in U+FFFD. The default drops trailing U+FFFD of `decode`; a codec over
    /// a byte-level tokenizer overrides it with the exact bytes.
    fn decode_generated(&self, ids: &[u32]) -> Result<String, String> {
        let mut t = self.decode(ids)?;
        t.truncate(t.trim_end_matches('\u{FFFD}').len());
        Ok(t)
    }
    /// The model's chat template over `messages`, with the assistant turn opened.
    fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, String>;
    /// As `chat_prompt`, with the template's `enable_thinking` set to `thinking`. The default
    /// knows only thinking off; a codec over a real tokenizer overrides it.
    fn chat_prompt_thinking(&self, messages: &[ChatMessage], thinking: bool) -> Result<String, String> {
        if thinking {
            return Err("this codec cannot render a chat template with thinking on".into());
        }
        self.chat_prompt(messages)
    }
}

/// A finished generation turned into a row's content.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedOutput {
    pub output: RowOutput,
    /// With `prompt.thinking`: the reasoning of the think block (`None`: the model wrote none).
    pub reasoning: Option<String>,
}

/// The token ids of one record's prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptIds {
    pub ids: Vec<u32>,
    /// The document was cut to fit `max_input_tokens`.
    pub truncated: bool,
}

/// A loaded, validated pipeline with its template compiled.
pub struct Pipeline {
    pub spec: PipelineSpec,
    pub path: PathBuf,
    /// blake3 of the file's bytes and its schema file's (part of the job fingerprint).
    pub source_hash: String,
    /// The output's grammar and the check of each row.
    pub output: OutputShape,
    env: Environment<'static>,
    /// With thinking on: whether the chat template's generation prompt leaves a think block
    /// open (Qwen3.5+), found from the first prompt rendered (the same for every record).
    think_opened: OnceLock<bool>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline").field("spec", &self.spec).field("path", &self.path).finish()
    }
}

impl Pipeline {
    /// `name_or_path`: a file path, or the name of a file in `pipelines_dir` (without `.toml`).
    pub fn resolve(name_or_path: &str, pipelines_dir: &Path) -> Result<Pipeline, PipelineError> {
        let dirs = [super::search_path::SearchDir { dir: pipelines_dir.to_path_buf(), from: "pipelines folder" }];
        Self::resolve_in(name_or_path, &dirs)
    }

    /// `name_or_path`: a file path, or a name looked up in `dirs` in order (see
    /// [`super::search_path`]); a miss names every place looked.
    pub fn resolve_in(name_or_path: &str, dirs: &[super::search_path::SearchDir]) -> Result<Pipeline, PipelineError> {
        let path = super::search_path::find(name_or_path, dirs).map_err(|looked| PipelineError::NotFound {
            name: name_or_path.to_string(),
            places: super::search_path::describe(&looked, dirs),
        })?;
        let text = std::fs::read_to_string(&path).map_err(|source| match source.kind() {
            // Not text: the pipeline is invalid (exit 2), not unreadable.
            std::io::ErrorKind::InvalidData => {
                PipelineError::Parse { path: path.clone(), message: "not UTF-8 text".into() }
            }
            _ => PipelineError::Io { path: path.clone(), source },
        })?;
        Pipeline::from_toml(&text, &path)
    }

    /// Parses and validates pipeline text; `path` names it in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Pipeline, PipelineError> {
        let spec: PipelineSpec = toml::from_str(text)
            .map_err(|e| PipelineError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        let invalid = |message: String| PipelineError::Invalid { path: path.to_path_buf(), message };
        let g = &spec.generation;
        if g.max_tokens == 0 {
            return Err(invalid("generation.max_tokens must be at least 1".into()));
        }
        if !(g.temperature >= 0.0 && g.temperature.is_finite()) {
            return Err(invalid(format!("generation.temperature must be >= 0, got {}", g.temperature)));
        }
        if !(g.top_p > 0.0 && g.top_p <= 1.0) {
            return Err(invalid(format!("generation.top_p must be in (0, 1], got {}", g.top_p)));
        }
        if spec.input.id_field.is_empty() {
            return Err(invalid("input.id_field is empty".into()));
        }
        if spec.input.fields.is_empty() {
            return Err(invalid("input.fields is empty: name the text fields the template reads".into()));
        }
        if let Some(d) = &spec.input.document_field {
            if !spec.input.fields.contains(d) {
                return Err(invalid(format!("input.document_field '{d}' is not one of input.fields")));
            }
        }
        if spec.limits.max_input_tokens < 16 {
            return Err(invalid("limits.max_input_tokens must be at least 16".into()));
        }
        if spec.limits.overflow != Overflow::Error && spec.limits.marker.is_empty() {
            return Err(invalid("limits.marker is empty; truncation must leave a visible mark".into()));
        }
        if let Some(f) = &spec.output.thinking_field {
            if !spec.prompt.thinking {
                return Err(invalid("output.thinking_field needs prompt.thinking = true".into()));
            }
            if f.is_empty() || ROW_KEYS.contains(&f.as_str()) {
                return Err(invalid(format!(
                    "output.thinking_field '{f}' must be a new, non-empty key (not {ROW_KEYS:?})"
                )));
            }
        }
        if spec.prompt.thinking && !spec.prompt.chat_template {
            return Err(invalid("prompt.thinking = true needs prompt.chat_template = true".into()));
        }
        let output = OutputShape::from_spec(&spec.output, path).map_err(invalid)?;
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.add_template_owned("prompt", spec.prompt.template.clone())
            .map_err(|e| invalid(format!("prompt.template does not compile: {e}")))?;
        let tmpl = env.get_template("prompt").map_err(|e| invalid(e.to_string()))?;
        let mut used: Vec<String> = tmpl.undeclared_variables(false).into_iter().collect();
        used.sort();
        for v in &used {
            if *v != spec.input.id_field && !spec.input.fields.contains(v) {
                return Err(invalid(format!(
                    "prompt.template uses '{v}', which is not in input.fields {:?}",
                    spec.input.fields
                )));
            }
        }
        // A template that reads neither a field nor the id gives every record the same prompt:
        // rows unrelated to their records (an empty template ran a whole job that way).
        if !used.iter().any(|v| spec.input.fields.contains(v) || *v == spec.input.id_field) {
            return Err(invalid(format!(
                "prompt.template reads none of input.fields {:?} (nor the id): every record would get the same prompt",
                spec.input.fields
            )));
        }
        let mut h = blake3::Hasher::new();
        h.update(text.as_bytes());
        h.update(&output.schema_file_bytes);
        Ok(Pipeline {
            source_hash: h.finalize().to_hex().to_string(),
            output,
            spec,
            path: path.to_path_buf(),
            env,
            think_opened: OnceLock::new(),
        })
    }

    /// The field that is checked for emptiness and truncated.
    pub fn document_field(&self) -> &str {
        self.spec.input.document_field.as_deref().unwrap_or(&self.spec.input.fields[0])
    }

    /// The per-record text: the template rendered over `fields` (+ the id).
    pub fn render_record(&self, id: &str, fields: &Map<String, Value>) -> Result<String, RecordError> {
        self.render(&self.context(id, fields))
    }

    /// The template's variables: the record's fields and its id.
    fn context(&self, id: &str, fields: &Map<String, Value>) -> Map<String, Value> {
        let mut ctx = fields.clone();
        ctx.entry(self.spec.input.id_field.clone()).or_insert_with(|| Value::String(id.to_string()));
        ctx
    }

    fn render(&self, ctx: &Map<String, Value>) -> Result<String, RecordError> {
        let tmpl = self.env.get_template("prompt").map_err(|e| RecordError::new(ErrorKind::Template, e.to_string()))?;
        tmpl.render(ctx).map_err(|e| RecordError::new(ErrorKind::Template, format!("prompt template: {e}")))
    }

    /// The messages of a record's prompt: system (if any), then instruction + record text.
    pub fn messages(&self, record_text: &str) -> Vec<ChatMessage> {
        let p = &self.spec.prompt;
        let mut m = Vec::new();
        if !p.system.is_empty() {
            m.push(ChatMessage { role: "system".into(), content: p.system.clone() });
        }
        let user = if p.instruction.is_empty() {
            record_text.to_string()
        } else {
            format!("{}\n\n{record_text}", p.instruction)
        };
        m.push(ChatMessage { role: "user".into(), content: user });
        m
    }

    /// The full prompt text for a record's rendered text.
    pub fn prompt_text(&self, codec: &dyn TextCodec, record_text: &str) -> Result<String, RecordError> {
        let msgs = self.messages(record_text);
        if self.spec.prompt.chat_template {
            let thinking = self.spec.prompt.thinking;
            let text = codec
                .chat_prompt_thinking(&msgs, thinking)
                .map_err(|e| RecordError::new(ErrorKind::Template, format!("chat template: {e}")))?;
            if thinking {
                self.think_opened.get_or_init(|| thinking::prompt_opens_think(&text));
            }
            Ok(text)
        } else {
            Ok(msgs.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n\n"))
        }
    }

    /// A record's full prompt text and the byte ranges in it that hold the record's values: the
    /// text that must be tokenized as plain text, whatever special-token text it contains.
    ///
    /// The ranges are found by rendering the prompt a second time with a marker in place of
    /// each value: a string of private-use characters around a hash of the record's values (a
    /// document cannot contain the marker of its own hash, and special tokens contain no
    /// private-use characters). Cutting the marked rendering at the markers and putting the
    /// values back must give the real prompt exactly; then each value's place is known, and
    /// special tokens the pipeline's own template text writes between fields still count.
    /// Templates that transform a value (filters, slicing, a chat template's `| trim`) fail that
    /// check; then the whole record text is one range: where the real prompt and one rendered
    /// with a single marker for the record text differ.
    ///
    /// The prompt is then tokenized in one piece (`TextCodec::encode_prompt`), not as pieces
    /// whose ids are concatenated: BPE merges across the edges of a value stay exactly as
    /// before, so a document without special-token text gets the same ids as without this guard.
    pub fn prompt_with_spans(
        &self,
        codec: &dyn TextCodec,
        id: &str,
        fields: &Map<String, Value>,
    ) -> Result<(String, Vec<Range<usize>>), RecordError> {
        let ctx = self.context(id, fields);
        let text = self.prompt_text(codec, &self.render(&ctx)?)?;
        let parts: Vec<String> = ctx.iter().flat_map(|(k, v)| [k.clone(), v.to_string()]).collect();
        let head = marker_head(parts.iter().map(String::as_str));
        if let Some(spans) = self.value_spans(codec, &ctx, &head, &text) {
            return Ok((text, spans));
        }
        let marked = self.prompt_text(codec, &marker(&head, None))?;
        let record = differing_range(&text, &marked);
        Ok((text, vec![record]))
    }

    /// Each value's range in `text` (the real prompt), or `None` when the template does more
    /// with a value than copy it (see `prompt_with_spans`).
    fn value_spans(
        &self,
        codec: &dyn TextCodec,
        ctx: &Map<String, Value>,
        head: &str,
        text: &str,
    ) -> Option<Vec<Range<usize>>> {
        let mut marked = Map::new();
        let mut values = Vec::new();
        for (k, v) in ctx {
            match v {
                Value::String(s) => {
                    marked.insert(k.clone(), Value::String(marker(head, Some(values.len()))));
                    values.push(s.as_str());
                }
                // Text inside a list or map would be rendered outside any marker.
                Value::Array(_) | Value::Object(_) => return None,
                _ => {
                    marked.insert(k.clone(), v.clone());
                }
            }
        }
        let rendered = self.prompt_text(codec, &self.render(&marked).ok()?).ok()?;
        fill_markers(&rendered, head, &values, text)
    }

    /// Renders and tokenizes a record, fitting it to `max_input_tokens` by the overflow policy.
    pub fn prompt_ids(
        &self,
        codec: &dyn TextCodec,
        id: &str,
        fields: &Map<String, Value>,
    ) -> Result<PromptIds, RecordError> {
        let tok_err = |e: String| RecordError::new(ErrorKind::Template, format!("tokenizer: {e}"));
        // The record's values are tokenized as plain text, the rest with special tokens parsed.
        let enc = |f: &Map<String, Value>| {
            let (text, plain) = self.prompt_with_spans(codec, id, f)?;
            codec.encode_prompt(&text, &plain).map_err(tok_err)
        };
        let max = self.spec.limits.max_input_tokens as usize;
        let ids = enc(fields)?;
        if ids.len() <= max {
            return Ok(PromptIds { ids, truncated: false });
        }
        let too_long = |n: usize| {
            RecordError::new(
                ErrorKind::InputTooLong,
                format!("prompt has {n} tokens, over limits.max_input_tokens = {max}"),
            )
        };
        let policy = self.spec.limits.overflow;
        if policy == Overflow::Error {
            return Err(too_long(ids.len()));
        }
        let doc_field = self.document_field();
        let doc = fields.get(doc_field).and_then(Value::as_str).unwrap_or_default();
        let doc_ids = codec.encode_plain(doc).map_err(tok_err)?;
        let marker = &self.spec.limits.marker;
        let marker_len = codec.encode_plain(marker).map_err(tok_err)?.len();
        let mut excess = ids.len() - max;
        let mut keep = doc_ids.len();
        // Token counts of the parts do not add up exactly (merges across the cut), so shrink
        // until the whole prompt fits; each round removes at least the measured excess.
        for _ in 0..4 {
            keep = keep.saturating_sub(excess + marker_len);
            if keep == 0 {
                return Err(RecordError::new(
                    ErrorKind::InputTooLong,
                    format!("prompt is over limits.max_input_tokens = {max} even with '{doc_field}' cut to nothing"),
                ));
            }
            let kept = match policy {
                Overflow::TruncateHead => doc_ids[doc_ids.len() - keep..].to_vec(),
                _ => doc_ids[..keep].to_vec(),
            };
            let kept = codec.decode(&kept).map_err(tok_err)?;
            let cut = match policy {
                Overflow::TruncateHead => format!("{}{}", marker.trim_start(), kept),
                _ => format!("{}{}", kept, marker.trim_end()),
            };
            let mut f = fields.clone();
            f.insert(doc_field.to_string(), Value::String(cut));
            let ids = enc(&f)?;
            if ids.len() <= max {
                return Ok(PromptIds { ids, truncated: true });
            }
            excess = ids.len() - max;
        }
        Err(too_long(ids.len()))
    }

    /// The sampling parameters of a record: the pipeline's, with the seed derived from the job
    /// seed and the record id (same text after a resume).
    pub fn sampling(&self, record_id: &str) -> SamplingParams {
        let g = &self.spec.generation;
        SamplingParams {
            temperature: g.temperature,
            top_k: g.top_k,
            top_p: g.top_p,
            seed: derive_seed(g.seed, record_id),
        }
    }

    /// Turns the model's text into the row's `output`: with thinking on, the think block is
    /// split off first (one that never closes is an error row); JSON is parsed and validated
    /// against the schema, labels and patterns checked; output cut at `max_tokens` is a
    /// `truncated` error.
    pub fn parse_output(&self, text: &str, finish: FinishReason) -> Result<RowOutput, RecordError> {
        self.parse_row(text, finish).map(|p| p.output)
    }

    /// As [`Self::parse_output`], with the reasoning of the think block kept beside the output.
    pub fn parse_row(&self, text: &str, finish: FinishReason) -> Result<ParsedOutput, RecordError> {
        if !self.spec.prompt.thinking {
            return Ok(ParsedOutput { output: self.output.parse(text, finish)?, reasoning: None });
        }
        let opened = self.think_opened.get().copied().unwrap_or(false);
        let t = thinking::split(text, opened, finish)?;
        Ok(ParsedOutput { output: self.output.parse(t.answer, finish)?, reasoning: t.reasoning.map(str::to_string) })
    }

    /// The row field that keeps the reasoning (`output.thinking_field`).
    pub fn thinking_field(&self) -> Option<&str> {
        self.spec.output.thinking_field.as_deref()
    }

    /// The grammar generation follows, if the output has a shape. NOTE: none with thinking on:
    /// a grammar from the first token would forbid the think block (starting it after
    /// `</think>` is not done yet), so such answers are checked after generation only.
    pub fn constraint(&self) -> Option<&OutputConstraint> {
        if self.spec.prompt.thinking {
            return None;
        }
        self.output.constraint()
    }
}
