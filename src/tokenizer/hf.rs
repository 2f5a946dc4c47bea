//! Building the tokenizer from a Hugging Face model directory.
//!
//! - `tokenizer.json` (required): the whole pipeline, loaded by the `tokenizers` crate. Its
//!   post-processor (which may insert BOS) is never run: BOS is added by `Tokenizer::encode`.
//! - `tokenizer_config.json` (optional): `bos_token`, `eos_token` (a string or an
//!   `{"content": ..}` object), `add_bos_token`, `chat_template` (a string or a list of
//!   `{"name", "template"}`, of which "default" is used).
//! - `chat_template.jinja` (optional, newer exports): takes precedence over the config's template.
//! - `generation_config.json` (optional): `eos_token_id` (a number or a list), `bos_token_id`.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use tokenizers::DecoderWrapper;

use super::bytes::TokenBytes;
use super::{collect_eog, Parts, TokenizerError};

fn read_json(path: &Path) -> Result<Option<Json>, TokenizerError> {
    match std::fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s)
            .map(Some)
            .map_err(|source| TokenizerError::Json { path: path.to_path_buf(), source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizerError::Io { path: path.to_path_buf(), source }),
    }
}

/// A special-token entry of `tokenizer_config.json`: `"<s>"`, `{"content": "<s>", ..}` or null.
fn token_string<'a>(v: Option<&'a Json>, path: &Path, key: &'static str) -> Result<Option<&'a str>, TokenizerError> {
    match v {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s)),
        Some(Json::Object(o)) => match o.get("content") {
            Some(Json::String(s)) => Ok(Some(s)),
            _ => Err(bad(path, key, "an object without a string \"content\"")),
        },
        Some(_) => Err(bad(path, key, "expected a string, an object with \"content\" or null")),
    }
}

fn bad(path: &Path, key: &'static str, reason: &str) -> TokenizerError {
    TokenizerError::BadConfig { path: path.to_path_buf(), key, reason: reason.to_string() }
}

/// `chat_template` is a string, or a list of named templates of which "default" is the one.
fn template_of(v: Option<&Json>, path: &Path) -> Result<Option<String>, TokenizerError> {
    match v {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(list)) => Ok(list
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_string)),
        Some(_) => Err(bad(path, "chat_template", "expected a string or a list of {name, template}")),
    }
}

/// `eos_token_id` of generation_config.json: a number or a list of numbers.
fn id_list(v: Option<&Json>, path: &Path, key: &'static str) -> Result<Vec<u32>, TokenizerError> {
    let one = |x: &Json| x.as_u64().and_then(|n| u32::try_from(n).ok());
    match v {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(a)) => {
            a.iter().map(|x| one(x).ok_or_else(|| bad(path, key, "list entries must be token ids"))).collect()
        }
        Some(x) => one(x).map(|id| vec![id]).ok_or_else(|| bad(path, key, "expected a token id or a list")),
    }
}

pub(super) fn load(dir: &Path) -> Result<Parts, TokenizerError> {
    let tok_path = dir.join("tokenizer.json");
    if !tok_path.is_file() {
        return Err(TokenizerError::Io {
            path: tok_path,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer.json not found"),
        });
    }
    let inner = tokenizers::Tokenizer::from_file(&tok_path)
        .map_err(|e| TokenizerError::Build { path: tok_path.clone(), reason: e.to_string() })?;
    let n_vocab = inner.get_vocab(true).values().map(|&id| id as usize + 1).max().unwrap_or(0);

    let cfg_path = dir.join("tokenizer_config.json");
    let cfg = read_json(&cfg_path)?.unwrap_or(Json::Null);
    let gen_path = dir.join("generation_config.json");
    let gen = read_json(&gen_path)?.unwrap_or(Json::Null);

    let id_of = |text: &str, path: &PathBuf, key: &'static str| {
        inner.token_to_id(text).ok_or_else(|| TokenizerError::UnknownToken {
            path: path.clone(),
            key: key.to_string(),
            token: text.to_string(),
        })
    };
    let check = |id: u32, path: &PathBuf, key: &'static str| {
        if (id as usize) < n_vocab {
            Ok(id)
        } else {
            Err(TokenizerError::BadTokenId { path: path.clone(), key: key.to_string(), id: id as i64, n_vocab })
        }
    };

    let bos = match token_string(cfg.get("bos_token"), &cfg_path, "bos_token")? {
        Some(t) => Some(id_of(t, &cfg_path, "bos_token")?),
        None => match id_list(gen.get("bos_token_id"), &gen_path, "bos_token_id")?.first() {
            Some(&id) => Some(check(id, &gen_path, "bos_token_id")?),
            None => None,
        },
    };
    let mut declared = Vec::new();
    if let Some(t) = token_string(cfg.get("eos_token"), &cfg_path, "eos_token")? {
        declared.push(id_of(t, &cfg_path, "eos_token")?);
    }
    for id in id_list(gen.get("eos_token_id"), &gen_path, "eos_token_id")? {
        declared.push(check(id, &gen_path, "eos_token_id")?);
    }
    let eos = collect_eog(&declared, |t| inner.token_to_id(t));

    let add_bos = match cfg.get("add_bos_token").and_then(Json::as_bool) {
        Some(b) => b,
        // No explicit flag: the post-processor decides (Llama 3 inserts BOS through it).
        None => match (bos, inner.encode_fast("", true)) {
            (Some(b), Ok(enc)) => enc.get_ids().first() == Some(&b),
            _ => false,
        },
    };

    let jinja_path = dir.join("chat_template.jinja");
    let chat_template = match std::fs::read_to_string(&jinja_path) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => template_of(cfg.get("chat_template"), &cfg_path)?,
        Err(source) => return Err(TokenizerError::Io { path: jinja_path, source }),
    };

    let token_bytes = match inner.get_decoder() {
        Some(DecoderWrapper::ByteLevel(_)) => {
            let added = inner.get_added_tokens_decoder();
            let texts: Vec<(String, bool)> = (0..n_vocab as u32)
                .map(|id| (inner.id_to_token(id).unwrap_or_default(), added.contains_key(&id)))
                .collect();
            Some(TokenBytes::build(texts.iter().map(|(t, raw)| (t.as_str(), *raw))))
        }
        _ => None,
    };

    Ok(Parts { inner, n_vocab, bos, eos, add_bos, chat_template, token_bytes })
}

#[cfg(test)]
mod tests {
    use crate::model::gguf::GgufFile;
    use crate::tokenizer::{ChatMessage, Tokenizer};

    /// Writes the sample model's tokenizer as a Hugging Face directory (the pipeline built from
    /// GGUF, serialized by `tokenizers`, plus HF-style config files) and loads it back.
    #[test]
    fn hf_directory_round_trip_of_the_sample_tokenizer() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let g = GgufFile::open(path).unwrap();
        let from_gguf = Tokenizer::from_gguf(&g).unwrap();
        let dir = std::env::temp_dir().join(format!("dustoff-hf-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        crate::tokenizer::gguf::load(&g).unwrap().inner.save(dir.join("tokenizer.json"), false).unwrap();
        let template = from_gguf.chat_template().unwrap();
        let cfg = serde_json::json!({
            "bos_token": {"content": "<|im_start|>", "special": true},
            "eos_token": "<|im_end|>",
            "chat_template": [{"name": "default", "template": template}],
        });
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [2, 0]}"#).unwrap();

        let hf = Tokenizer::from_hf_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(hf.vocab_size(), 49_152);
        assert_eq!(hf.bos_id(), Some(1));
        assert!(!hf.add_bos_default(), "no post-processor, no add_bos_token: no BOS");
        assert_eq!(hf.eos_ids(), &[2, 0]);
        assert!(hf.token_bytes.is_some(), "ByteLevel decoder gives exact token bytes");
        for text in ["<|im_start|>user\n今天天气很好 1999 🍕<|im_end|>", "x <|im_end|> y", "  tabs\tand\r\nCRLF"]
        {
            for ps in [true, false] {
                assert_eq!(hf.encode(text, false, ps).unwrap(), from_gguf.encode(text, false, ps).unwrap(), "{text:?}");
            }
            assert_eq!(hf.decode(&hf.encode(text, false, true).unwrap()).unwrap(), text);
        }
        let msgs = [ChatMessage::new("user", "Hi")];
        assert_eq!(hf.apply_chat_template(&msgs, true).unwrap(), from_gguf.apply_chat_template(&msgs, true).unwrap());
    }
}
