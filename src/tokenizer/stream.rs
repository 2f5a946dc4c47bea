//! Incremental detokenization for streaming output.
//!
//! A token may end in the middle of a UTF-8 character (byte-level BPE splits rare characters,
//! e.g. many CJK characters and emoji, into byte tokens). The decoder holds such bytes back
//! until the character is complete, so every returned piece is whole text, and the
//! concatenation of all pieces equals `Tokenizer::decode` of all ids.

use super::{Tokenizer, TokenizerError};

/// Incremental detokenizer: feed ids one by one, get only complete UTF-8 text.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    mode: Mode,
}

enum Mode {
    /// Byte-level vocabularies: exact bytes per token; `pending` holds an incomplete character.
    Bytes { pending: Vec<u8> },
    /// Other decoders (e.g. SentencePiece-style `▁` handling, which depends on neighbours):
    /// decode a window of ids and emit what grew since the last call. `ids[..read]` has been
    /// emitted; `ids` starts at the last point where emitted text was known to be stable.
    Window { ids: Vec<u32>, read: usize },
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer) -> Self {
        Self::with_mode(tok, tok.token_bytes.is_some())
    }

    fn with_mode(tok: &'a Tokenizer, bytes: bool) -> Self {
        let mode = if bytes { Mode::Bytes { pending: Vec::new() } } else { Mode::Window { ids: Vec::new(), read: 0 } };
        StreamDecoder { tok, mode }
    }

    /// Adds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        match &mut self.mode {
            Mode::Bytes { pending } => {
                let tb = self.tok.token_bytes.as_ref().ok_or(TokenizerError::Decode {
                    reason: "byte-level stream decoder on a tokenizer without a byte table".into(),
                })?;
                pending.extend_from_slice(self.tok.bytes_of(tb, id)?);
                Ok(take_complete(pending, false))
            }
            Mode::Window { ids, read } => {
                if id as usize >= self.tok.n_vocab {
                    return Err(TokenizerError::UnknownId { id, n_vocab: self.tok.n_vocab });
                }
                ids.push(id);
                let before = self.tok.decode(&ids[..*read])?;
                let after = self.tok.decode(ids)?;
                // A trailing U+FFFD means the last token ended inside a character: wait.
                if after.len() <= before.len() || after.ends_with('\u{FFFD}') {
                    return Ok(String::new());
                }
                let delta = match after.get(before.len()..) {
                    Some(d) if after.starts_with(&before) => d.to_string(),
                    // The decoder rewrote earlier text (should not happen): emit the new tail.
                    _ => after.chars().skip(before.chars().count()).collect(),
                };
                // Keep the last emitted id as left context for the next decode.
                let keep_from = ids.len() - 1;
                ids.drain(..keep_from);
                *read = ids.len();
                Ok(delta)
            }
        }
    }

    /// Flushes whatever is held back (an incomplete character becomes U+FFFD) and resets.
    pub fn finish(&mut self) -> Result<String, TokenizerError> {
        match &mut self.mode {
            Mode::Bytes { pending } => Ok(take_complete(pending, true)),
            Mode::Window { ids, read } => {
                let before = self.tok.decode(&ids[..*read])?;
                let after = self.tok.decode(ids)?;
                let delta = after.get(before.len()..).unwrap_or_default().to_string();
                ids.clear();
                *read = 0;
                Ok(delta)
            }
        }
    }
}

/// Removes and returns the longest decodable prefix of `pending`. Invalid sequences become one
/// U+FFFD each (as `String::from_utf8_lossy` does); a trailing incomplete character is kept,
/// unless `flush`, when it also becomes U+FFFD.
fn take_complete(pending: &mut Vec<u8>, flush: bool) -> String {
    let mut out = String::new();
    let mut start = 0;
    while start < pending.len() {
        match std::str::from_utf8(&pending[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = pending.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(&String::from_utf8_lossy(&pending[start..start + valid]));
                start += valid;
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        start += n;
                    }
                    None if flush => {
                        out.push('\u{FFFD}');
                        start = pending.len();
                    }
                    None => break,
                }
            }
        }
    }
    pending.drain(..start);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::GgufFile;

    fn sample() -> Tokenizer {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let g = GgufFile::open(path).expect("sample model (samples/models) is missing");
        Tokenizer::from_gguf(&g).expect("sample tokenizer")
    }

    /// Streams `ids` one by one; returns the pieces (finish's output last).
    fn stream(tok: &Tokenizer, bytes: bool, ids: &[u32]) -> Vec<String> {
        let mut d = StreamDecoder::with_mode(tok, bytes);
        let mut pieces: Vec<String> = ids.iter().map(|&id| d.push(id).unwrap()).collect();
        pieces.push(d.finish().unwrap());
        pieces
    }

    #[test]
    fn chinese_split_across_tokens_is_held_back_until_complete() {
        let tok = sample();
        // From tokenizer_cases.jsonl (tok19, tok20): CJK characters are split into byte tokens.
        for text in ["今天天气很好，我们去公园散步吧。", "人工智能是计算机科学的一个分支，它企图了解智能的实质"]
        {
            let ids = tok.encode(text, false, true).unwrap();
            let split = ids.iter().filter(|&&id| std::str::from_utf8(tok.token_bytes(id).unwrap()).is_err()).count();
            assert!(split > 0, "test text must contain tokens that end inside a character");
            for bytes in [true, false] {
                let pieces = stream(&tok, bytes, &ids);
                assert_eq!(pieces.concat(), text, "byte mode {bytes}");
                assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
                assert!(pieces.iter().any(String::is_empty), "some push must wait for more bytes");
                assert_eq!(pieces.last().map(String::as_str), Some(""), "nothing left for finish");
            }
        }
    }

    #[test]
    fn emoji_and_specials_stream_like_decode() {
        let tok = sample();
        let text = "<|im_start|>user\nI love pizza 🍕🍕 and 🎉!<|im_end|>";
        let ids = tok.encode(text, false, true).unwrap();
        assert_eq!(stream(&tok, true, &ids).concat(), text);
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }

    #[test]
    fn truncated_character_is_flushed_as_replacement() {
        let tok = sample();
        let ids = tok.encode("好", false, true).unwrap();
        assert!(ids.len() >= 2, "'好' is expected to take several byte tokens: {ids:?}");
        let cut = &ids[..ids.len() - 1];
        for bytes in [true, false] {
            let pieces = stream(&tok, bytes, cut);
            assert!(pieces[..pieces.len() - 1].iter().all(String::is_empty));
            assert_eq!(pieces.concat(), tok.decode(cut).unwrap());
            assert!(pieces.concat().ends_with('\u{FFFD}'));
        }
    }

    #[test]
    fn invalid_id_is_an_error() {
        let tok = sample();
        let mut d = StreamDecoder::new(&tok);
        assert!(matches!(d.push(1 << 30), Err(TokenizerError::UnknownId { .. })));
    }
}
