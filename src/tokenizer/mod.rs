//! Text <-> token ids, chat templates and streaming detokenization.
//!
//! One [`Tokenizer`] type wraps a Hugging Face `tokenizers` pipeline (byte-level BPE, pre-tokenizer
//! regexes, added/special tokens) built either from GGUF metadata ([`Tokenizer::from_gguf`],
//! see `gguf.rs`) or from a Hugging Face model directory ([`Tokenizer::from_hf_dir`], `hf.rs`).
//!
//! Special tokens follow llama.cpp's rules, because the reference ids come from llama.cpp:
//! - *control* tokens (GGUF token type 3, HF `special: true`) are recognised in the input text
//!   only when `parse_special` is true; otherwise their text is tokenized like any other text;
//! - *user-defined* tokens (GGUF token type 4, HF `special: false`) are always recognised.
//!
//! BOS is never added implicitly: `encode(.., add_bos, ..)` prepends it exactly when asked.
//! Callers that want the model's default pass [`Tokenizer::add_bos_default`].
//!
//! Decoding renders every token, special ones included, as its text (`<|im_end|>` appears
//! verbatim). Invalid UTF-8 (a token sequence cut inside a character) becomes U+FFFD.

mod bytes;
mod chat;
mod gguf;
mod hf;
mod stream;

pub use chat::ChatMessage;
pub use stream::StreamDecoder;

use std::collections::HashSet;
use std::ops::Range;
use std::path::PathBuf;

use bytes::TokenBytes;

/// Token texts that end a generation wherever they appear as tokens (llama.cpp's list of
/// end-of-generation markers): chat-turn ends and end-of-document markers of common families.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] crate::model::gguf::GgufError),
    #[error("{path}: metadata key '{key}' is missing (needed to build the tokenizer)")]
    MissingKey { path: PathBuf, key: &'static str },
    #[error(
        "{path}: tokenizer model '{model}' (tokenizer.ggml.model) is not supported yet; only 'gpt2' byte-level BPE is"
    )]
    UnsupportedModel { path: PathBuf, model: String },
    #[error("{path}: pre-tokenizer '{pre}' (tokenizer.ggml.pre) is not supported; known: {known}")]
    UnsupportedPre { path: PathBuf, pre: String, known: String },
    #[error("{path}: {key}[{index}] = {text:?} is malformed: {reason}")]
    BadEntry { path: PathBuf, key: &'static str, index: usize, text: String, reason: &'static str },
    #[error("{path}: {key} has {found} entries but the vocabulary has {expected} tokens")]
    LengthMismatch { path: PathBuf, key: &'static str, found: usize, expected: usize },
    #[error("{path}: {key} = {id} lies outside the vocabulary ({n_vocab} tokens)")]
    BadTokenId { path: PathBuf, key: String, id: i64, n_vocab: usize },
    #[error("{path}: {key} names the token {token:?}, which is not in the vocabulary")]
    UnknownToken { path: PathBuf, key: String, token: String },
    #[error("{path}: cannot build the tokenizer: {reason}")]
    Build { path: PathBuf, reason: String },
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: {key} has an unexpected shape: {reason}")]
    BadConfig { path: PathBuf, key: &'static str, reason: String },
    #[error("cannot tokenize the text starting {snippet:?}: {reason}")]
    Encode { snippet: String, reason: String },
    #[error("cannot decode token ids: {reason}")]
    Decode { reason: String },
    #[error("token id {id} lies outside the vocabulary ({n_vocab} tokens)")]
    UnknownId { id: u32, n_vocab: usize },
    #[error("add_bos was requested but the model defines no BOS token")]
    NoBos,
    #[error("the model has no chat template (GGUF tokenizer.chat_template / HF chat_template)")]
    NoChatTemplate,
    #[error("the model's chat template does not compile: {reason}")]
    TemplateCompile { reason: String },
    #[error("chat template: {0:#}")]
    Template(#[from] minijinja::Error),
}

/// A loaded tokenizer: encode, decode, special ids and the chat template.
pub struct Tokenizer {
    /// Recognises control tokens in the input (parse_special = true).
    with_special: tokenizers::Tokenizer,
    /// Same pipeline with control tokens treated as plain text (parse_special = false), made on
    /// first use: the copy costs ~0.1 s and memory for a 150k vocabulary, and many jobs never
    /// need it.
    plain: std::sync::OnceLock<tokenizers::Tokenizer>,
    /// Ids of the control (special) added tokens: the ones `parse_special` decides about.
    control_ids: HashSet<u32>,
    n_vocab: usize,
    bos: Option<u32>,
    /// End-of-generation ids: the declared EOS first, then EOT and other end markers.
    eos: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
    /// The template compiled once (or why it failed to compile, reported when it is used).
    chat_env: Option<Result<chat::ChatEnv, String>>,
    bos_text: Option<String>,
    eos_text: Option<String>,
    /// Exact bytes of each token when the decoder is byte-level (always for GGUF "gpt2");
    /// `None` means decoding goes through the `tokenizers` decoder.
    token_bytes: Option<TokenBytes>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.n_vocab)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// Everything a loader determined; [`Tokenizer::assemble`] turns it into a `Tokenizer`.
struct Parts {
    inner: tokenizers::Tokenizer,
    n_vocab: usize,
    bos: Option<u32>,
    eos: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
    token_bytes: Option<TokenBytes>,
}

impl Tokenizer {
    pub fn from_gguf(g: &crate::model::gguf::GgufFile) -> Result<Self, TokenizerError> {
        gguf::load(g).map(Self::assemble)
    }

    /// Loads `tokenizer.json`, `tokenizer_config.json` and (optional) `generation_config.json`
    /// from a Hugging Face model directory.
    pub fn from_hf_dir(dir: &std::path::Path) -> Result<Self, TokenizerError> {
        hf::load(dir).map(Self::assemble)
    }

    fn assemble(p: Parts) -> Self {
        let text_of = |id: Option<u32>| id.and_then(|id| p.inner.id_to_token(id));
        let bos_text = text_of(p.bos);
        let eos_text = text_of(p.eos.first().copied());
        let chat_env = p.chat_template.as_deref().map(|t| chat::ChatEnv::new(t).map_err(|e| format!("{e:#}")));
        let control_ids =
            p.inner.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, _)| id).collect();
        Tokenizer {
            with_special: p.inner,
            plain: std::sync::OnceLock::new(),
            control_ids,
            n_vocab: p.n_vocab,
            bos: p.bos,
            eos: p.eos,
            add_bos: p.add_bos,
            chat_template: p.chat_template,
            chat_env,
            bos_text,
            eos_text,
            token_bytes: p.token_bytes,
        }
    }

    /// Tokenizes `text`. `add_bos` prepends the BOS id (an error if the model has none);
    /// `parse_special = false` tokenizes control-token text such as `<|im_end|>` as plain text.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            ids.push(self.bos.ok_or(TokenizerError::NoBos)?);
        }
        if text.is_empty() {
            return Ok(ids);
        }
        let tok = if parse_special {
            &self.with_special
        } else {
            self.plain.get_or_init(|| {
                let mut plain = self.with_special.clone();
                plain.set_encode_special_tokens(true);
                plain
            })
        };
        // add_special_tokens = false: BOS/EOS insertion by a post-processor is decided above.
        let enc = tok
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode { snippet: text.chars().take(40).collect(), reason: e.to_string() })?;
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Tokenizes a rendered prompt in which the byte ranges `plain` hold untrusted text (a
    /// user's document inside a chat template): control tokens are recognised outside those
    /// ranges, as with `parse_special = true`, but control-token text that lies in a range, or
    /// reaches into one, is tokenized as plain text (no prompt injection through `<|im_start|>`).
    ///
    /// The whole text is tokenized in one pass first; when no control token touches a range (the
    /// normal case) those ids are returned, so they equal `encode(text, add_bos, true)` exactly,
    /// BPE merges across the edges of the ranges included. Otherwise the text is cut only at the
    /// accepted control tokens and the pieces between them are tokenized with
    /// `parse_special = false`. Cutting there changes no merges: the tokenizer splits its input
    /// at every added token before any merge anyway.
    pub fn encode_prompt(&self, text: &str, add_bos: bool, plain: &[Range<usize>]) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            ids.push(self.bos.ok_or(TokenizerError::NoBos)?);
        }
        if text.is_empty() {
            return Ok(ids);
        }
        // `encode` (not `encode_fast`) for the byte offsets of the tokens.
        let enc = self
            .with_special
            .encode(text, false)
            .map_err(|e| TokenizerError::Encode { snippet: text.chars().take(40).collect(), reason: e.to_string() })?;
        let (tokens, offsets) = (enc.get_ids(), enc.get_offsets());
        // A control token belongs to the template when its text lies outside every range. The
        // offsets of a token with lstrip/rstrip include the whitespace it absorbed, so the token's
        // own text is located inside them (whitespace of a document next to a template token
        // must not disown the token).
        let span = |i: usize| -> Result<(usize, usize), TokenizerError> {
            let (s, e) = offsets[i];
            let within = text.get(s..e).ok_or_else(|| TokenizerError::Encode {
                snippet: text.chars().take(40).collect(),
                reason: format!("token offsets {s}..{e} are not on character boundaries"),
            })?;
            let own = self.with_special.id_to_token(tokens[i]).and_then(|c| within.find(&c).map(|p| (s + p, c.len())));
            Ok(own.map_or((s, e), |(p, n)| (p, p + n)))
        };
        let mut injected = vec![false; tokens.len()];
        for (i, flag) in injected.iter_mut().enumerate() {
            if self.control_ids.contains(&tokens[i]) {
                let (s, e) = span(i)?;
                *flag = plain.iter().any(|r| r.start < r.end && s < r.end && r.start < e);
            }
        }
        if !injected.contains(&true) {
            ids.extend_from_slice(tokens);
            return Ok(ids);
        }
        // Offsets from the tokenizer are on character boundaries and in order; a piece that is
        // not (never seen) is an error, not a panic.
        let piece = |a: usize, b: usize| {
            text.get(a..b).ok_or_else(|| TokenizerError::Encode {
                snippet: text.chars().take(40).collect(),
                reason: format!("token offsets {a}..{b} are not on character boundaries"),
            })
        };
        let mut at = 0;
        for i in 0..tokens.len() {
            if self.control_ids.contains(&tokens[i]) && !injected[i] {
                let (s, e) = offsets[i];
                ids.extend(self.encode(piece(at, s)?, false, false)?);
                ids.push(tokens[i]);
                at = e;
            }
        }
        ids.extend(self.encode(piece(at, text.len())?, false, false)?);
        Ok(ids)
    }

    /// The text of `ids`; special tokens are rendered as their text, nothing is skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        match &self.token_bytes {
            Some(tb) => {
                let mut buf = Vec::with_capacity(ids.len() * 4);
                for &id in ids {
                    buf.extend_from_slice(self.bytes_of(tb, id)?);
                }
                Ok(match String::from_utf8(buf) {
                    Ok(s) => s,
                    Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
                })
            }
            None => {
                if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.n_vocab) {
                    return Err(TokenizerError::UnknownId { id, n_vocab: self.n_vocab });
                }
                self.with_special.decode(ids, false).map_err(|e| TokenizerError::Decode { reason: e.to_string() })
            }
        }
    }

    /// The text of generated `ids`, as [`Tokenizer::decode`] except at the end: a character the
    /// last tokens left incomplete (a generation cut at `max_tokens` inside a multi-byte
    /// character, e.g. CJK or emoji split into byte tokens) is dropped, not written as U+FFFD.
    /// Invalid bytes elsewhere still become U+FFFD. Streaming gives the same text
    /// ([`StreamDecoder`]'s pieces, `finish` included).
    pub fn decode_generated(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        match &self.token_bytes {
            Some(tb) => {
                let mut buf = Vec::with_capacity(ids.len() * 4);
                for &id in ids {
                    buf.extend_from_slice(self.bytes_of(tb, id)?);
                }
                buf.truncate(buf.len() - stream::incomplete_tail(&buf));
                Ok(String::from_utf8_lossy(&buf).into_owned())
            }
            // Other decoders write an incomplete character as U+FFFD (byte fallback): a
            // trailing run of them is what the cut left.
            None => {
                let mut t = self.decode(ids)?;
                t.truncate(t.trim_end_matches('\u{FFFD}').len());
                Ok(t)
            }
        }
    }

    fn bytes_of<'t>(&self, tb: &'t TokenBytes, id: u32) -> Result<&'t [u8], TokenizerError> {
        tb.get(id).ok_or(TokenizerError::UnknownId { id, n_vocab: self.n_vocab })
    }

    /// The raw bytes a token stands for, when the tokenizer is byte-level (else `None`).
    /// Useful for constrained decoding, where a token may end inside a UTF-8 character.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.as_ref().and_then(|tb| tb.get(id))
    }

    /// Whether `id` is a control (special) token: text that only `parse_special` turns into it.
    /// Constrained decoding keeps these out of grammars that spell text.
    pub fn is_control(&self, id: u32) -> bool {
        self.control_ids.contains(&id)
    }

    /// A copy of the tokenizer pipeline that treats control-token text as plain text (what
    /// `encode(.., parse_special = false)` uses), for code that must own one, such as the
    /// token environment of constrained decoding.
    pub fn plain_pipeline(&self) -> tokenizers::Tokenizer {
        let mut plain = self.with_special.clone();
        plain.set_encode_special_tokens(true);
        plain
    }

    /// Whether the model expects a BOS token at the start of a prompt.
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// All end-of-generation ids: the declared EOS first, then EOT/EOM and known end markers
    /// present in the vocabulary (e.g. both `<|im_end|>` and `<|endoftext|>`).
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    /// Number of token ids (the largest id + 1), added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.n_vocab
    }

    /// The vocabulary string of a token, as stored (byte-level form, e.g. `Ġworld` for " world";
    /// special tokens as their text). Use `decode(&[id])` for the rendered text.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.with_special.id_to_token(id)
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Renders the model's chat template (Jinja, HF conventions) with thinking off: batch jobs
    /// want the answer, not a reasoning trace (Qwen3 / Qwen3.5+ templates read
    /// `enable_thinking`). A model without a template is an error
    /// ([`TokenizerError::NoChatTemplate`]); there is no silent fallback.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.apply_chat_template_thinking(messages, add_generation_prompt, false)
    }

    /// As [`Self::apply_chat_template`], with `enable_thinking` chosen by the caller.
    pub fn apply_chat_template_thinking(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<String, TokenizerError> {
        let env = match &self.chat_env {
            None => return Err(TokenizerError::NoChatTemplate),
            Some(Err(reason)) => return Err(TokenizerError::TemplateCompile { reason: reason.clone() }),
            Some(Ok(env)) => env,
        };
        env.render(
            messages,
            add_generation_prompt,
            self.bos_text.as_deref().unwrap_or(""),
            self.eos_text.as_deref().unwrap_or(""),
            enable_thinking,
        )
    }
}

/// End-of-generation ids: the declared ones (in order, deduplicated) followed by every token
/// whose text is a known end marker. `lookup` maps a token text to its id.
fn collect_eog(declared: &[u32], lookup: impl Fn(&str) -> Option<u32>) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    let mut push = |id: u32| {
        if !out.contains(&id) {
            out.push(id);
        }
    };
    declared.iter().copied().for_each(&mut push);
    EOG_TEXTS.iter().filter_map(|t| lookup(t)).for_each(push);
    out
}
