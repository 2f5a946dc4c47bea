//! Building the tokenizer from GGUF metadata (`tokenizer.ggml.*`), llama.cpp conventions.
//!
//! Only `tokenizer.ggml.model = "gpt2"` (byte-level BPE) is supported. `tokenizer.ggml.pre`
//! names the pre-tokenizer, i.e. the regexes that cut text into words before BPE runs:
//! - `gpt2` family (`default`, `gpt2`, `mpt`, `olmo`, `jais`): the GPT-2 regex (contractions,
//!   letters, numbers, other symbols, each with an optional leading space; whitespace runs);
//! - `smollm` family (`starcoder`, `refact`, `command-r`, `codeshell`, `exaone`, `minerva`):
//!   every digit isolated first, then the GPT-2 regex (so "2024" is four tokens);
//! - `llama-bpe` family (`llama3`, `llama-v3`, `falcon3`, `pixtral`): case-insensitive
//!   contractions, a letter run that may take one leading non-letter/non-digit, numbers in
//!   groups of up to three digits, symbol runs swallowing trailing newlines, newline runs;
//!   whole words found in the vocabulary skip the merges (`ignore_merges`);
//! - `qwen2` family (`deepseek-r1-qwen`, `stablelm2`, `megrez`): as llama-bpe but every digit
//!   on its own. (The HF tokenizer also applies NFC; llama.cpp does not, and neither do we.)
//! - `qwen35` (Qwen3.5 and later): as qwen2, but combining marks (`\p{M}`) count as letters:
//!   they join the letter run before them instead of starting a symbol run, so a decomposed
//!   "e" + U+0301 stays one word.

use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::bytes::TokenBytes;
use super::{collect_eog, Parts, TokenizerError};
use crate::model::gguf::GgufFile;

/// GGUF token types (llama.cpp `llama_token_type`).
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// Letters-or-numbers-aware split used by Llama 3 (`digits` = `{1,3}`) and Qwen2 (`digits` = ``).
/// Alternatives, in order: English contractions in any case; a letter run with at most one
/// leading character that is neither letter, digit nor newline; digit groups; a symbol run
/// (optionally after one space) with the newlines that follow it; whitespace ending in
/// newlines; whitespace not followed by a non-space (trailing); any whitespace run.
/// `letter` is the class of a word's characters: `\p{L}`, or `\p{L}\p{M}` for Qwen3.5, where
/// combining marks belong to the word (and so are left out of the symbol class too).
fn llama3_style_regex(digits: &str, letter: &str) -> String {
    format!(
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{{L}}\p{{N}}]?[{letter}]+|\p{{N}}{digits}| ?[^\s{letter}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
}

const LETTERS: &str = r"\p{L}";
const LETTERS_AND_MARKS: &str = r"\p{L}\p{M}";

/// How a `tokenizer.ggml.pre` name splits text into words.
enum PreKind {
    /// The GPT-2 regex (ByteLevel's built-in one).
    Gpt2,
    /// Each `\p{N}` isolated, then the GPT-2 regex.
    DigitsThenGpt2,
    /// A single regex split, then byte-level mapping; `ignore_merges` as in llama.cpp.
    Regex { regex: String, ignore_merges: bool },
}

const KNOWN_PRE: &str = "default, gpt2, mpt, olmo, jais, smollm, starcoder, refact, command-r, codeshell, \
exaone, minerva, llama-bpe, llama3, llama-v3, falcon3, pixtral, qwen2, deepseek-r1-qwen, stablelm2, megrez, qwen35";

fn pre_kind(pre: &str) -> Option<PreKind> {
    Some(match pre {
        "default" | "gpt2" | "mpt" | "olmo" | "jais" => PreKind::Gpt2,
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => PreKind::DigitsThenGpt2,
        "llama-bpe" | "llama3" | "llama-v3" | "falcon3" | "pixtral" => {
            PreKind::Regex { regex: llama3_style_regex("{1,3}", LETTERS), ignore_merges: true }
        }
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" => {
            PreKind::Regex { regex: llama3_style_regex("", LETTERS), ignore_merges: false }
        }
        "qwen35" => PreKind::Regex { regex: llama3_style_regex("", LETTERS_AND_MARKS), ignore_merges: false },
        _ => return None,
    })
}

fn build_pre_tokenizer(kind: &PreKind, path: &Path) -> Result<PreTokenizerWrapper, TokenizerError> {
    let split = |re: &str| {
        Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map(PreTokenizerWrapper::Split)
            .map_err(|e| TokenizerError::Build { path: path.to_path_buf(), reason: format!("regex {re:?}: {e}") })
    };
    // ByteLevel(add_prefix_space = false, trim_offsets = false, use_regex): with use_regex it
    // applies the GPT-2 regex itself before mapping bytes to the byte-level alphabet.
    Ok(match kind {
        PreKind::Gpt2 => PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, true)),
        PreKind::DigitsThenGpt2 => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            split(r"\p{N}")?,
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, true)),
        ])),
        PreKind::Regex { regex, .. } => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            split(regex)?,
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
        ])),
    })
}

pub(super) fn load(g: &GgufFile) -> Result<Parts, TokenizerError> {
    let path = g.path.as_path();
    let missing = |key: &'static str| TokenizerError::MissingKey { path: path.to_path_buf(), key };

    let model = g.get_str("tokenizer.ggml.model")?.ok_or_else(|| missing("tokenizer.ggml.model"))?;
    if model != "gpt2" {
        return Err(TokenizerError::UnsupportedModel { path: path.to_path_buf(), model: model.to_string() });
    }
    let pre = g.get_str("tokenizer.ggml.pre")?.unwrap_or("default");
    let kind = pre_kind(pre).ok_or_else(|| TokenizerError::UnsupportedPre {
        path: path.to_path_buf(),
        pre: pre.to_string(),
        known: KNOWN_PRE.to_string(),
    })?;

    let tokens = g.get_str_array("tokenizer.ggml.tokens")?.ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
    let n_vocab = tokens.len();
    let types = match g.get_i64_array("tokenizer.ggml.token_type")? {
        Some(t) if t.len() != n_vocab => {
            return Err(TokenizerError::LengthMismatch {
                path: path.to_path_buf(),
                key: "tokenizer.ggml.token_type",
                found: t.len(),
                expected: n_vocab,
            })
        }
        Some(t) => t,
        None => vec![1; n_vocab],
    };
    let merges_raw = g.get_str_array("tokenizer.ggml.merges")?.ok_or_else(|| missing("tokenizer.ggml.merges"))?;

    // Duplicate token texts (rare) resolve to the last id, as in llama.cpp's token_to_id map.
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
    let mut merges = Vec::with_capacity(merges_raw.len());
    for (index, m) in merges_raw.iter().enumerate() {
        // "a b": the two halves never contain a space themselves (space is `Ġ` in byte-level).
        let (a, b) = m.split_once(' ').ok_or_else(|| TokenizerError::BadEntry {
            path: path.to_path_buf(),
            key: "tokenizer.ggml.merges",
            index,
            text: m.to_string(),
            reason: "expected two tokens separated by one space",
        })?;
        merges.push((a.to_string(), b.to_string()));
    }
    let ignore_merges = matches!(kind, PreKind::Regex { ignore_merges: true, .. });
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Build { path: path.to_path_buf(), reason: format!("BPE model: {e}") })?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(build_pre_tokenizer(&kind, path)?));
    inner.with_decoder(Some(ByteLevel::new(false, false, true)));
    let added = |ty: i64, special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(&types)
            .filter(|&(_, &t)| t == ty)
            .map(|(&text, _)| AddedToken::from(text, special).normalized(false))
            .collect()
    };
    inner.add_special_tokens(&added(TYPE_CONTROL, true));
    inner.add_tokens(&added(TYPE_USER_DEFINED, false));

    let token_id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
        match g.get_u64(key)? {
            None => Ok(None),
            Some(id) if (id as usize) < n_vocab => Ok(Some(id as u32)),
            Some(id) => Err(TokenizerError::BadTokenId {
                path: path.to_path_buf(),
                key: key.to_string(),
                id: id as i64,
                n_vocab,
            }),
        }
    };
    let bos = token_id("tokenizer.ggml.bos_token_id")?;
    let declared: Vec<u32> =
        ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
            .into_iter()
            .map(token_id)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect();
    let eos = collect_eog(&declared, |t| inner.token_to_id(t));
    // llama.cpp's default when the key is absent: Llama 3 style vocabularies add BOS.
    let add_bos = g.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(pre == "llama-bpe" || pre == "llama3");
    let chat_template = g.get_str("tokenizer.chat_template")?.map(str::to_string);

    let token_bytes = TokenBytes::build(
        tokens.iter().zip(&types).map(|(&t, &ty)| (t, ty == TYPE_CONTROL || ty == TYPE_USER_DEFINED)),
    );
    Ok(Parts { inner, n_vocab, bos, eos, add_bos, chat_template, token_bytes: Some(token_bytes) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_pre_name_resolves_and_compiles() {
        for name in KNOWN_PRE.split(", ") {
            let kind = pre_kind(name).unwrap_or_else(|| panic!("{name} listed but unknown"));
            build_pre_tokenizer(&kind, Path::new("test")).unwrap();
        }
        assert!(pre_kind("no-such-pre").is_none());
    }
}
