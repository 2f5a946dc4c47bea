//! Incremental detokenization for streaming output.
//!
//! A token may end in the middle of a UTF-8 character (byte-level BPE splits rare characters,
//! e.g. many CJK characters and emoji, into byte tokens). The decoder holds such bytes back
//! until the character is complete, so every returned piece is whole text, and the
//! concatenation of all pieces equals `Tokenizer::decode_generated` of all ids: a character
//! still incomplete at the end (a generation cut at `max_tokens`) is dropped.

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
                Ok(take_complete(pending))
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

    /// Flushes whatever is held back and resets. A character still incomplete (the generation
    /// stopped inside it) is dropped, not written as U+FFFD.
    pub fn finish(&mut self) -> Result<String, TokenizerError> {
        match &mut self.mode {
            Mode::Bytes { pending } => {
                let out = take_complete(pending);
                pending.clear();
                Ok(out)
            }
            Mode::Window { ids, read } => {
                let before = self.tok.decode(&ids[..*read])?;
                let after = self.tok.decode(ids)?;
                let mut delta = after.get(before.len()..).unwrap_or_default().to_string();
                delta.truncate(delta.trim_end_matches('\u{FFFD}').len());
                ids.clear();
                *read = 0;
                Ok(delta)
            }
        }
    }
}

/// How many bytes at the end of `bytes` are the start of a character that is not complete (0
/// to 3): what a cut inside a multi-byte character leaves.
pub(super) fn incomplete_tail(bytes: &[u8]) -> usize {
    let from = bytes.len().saturating_sub(3);
    for start in (from..bytes.len()).rev() {
        if let Err(e) = std::str::from_utf8(&bytes[start..]) {
            if e.valid_up_to() == 0 && e.error_len().is_none() {
                return bytes.len() - start;
            }
        }
    }
    0
}

/// Removes and returns the longest decodable prefix of `pending`. Invalid sequences become one
/// U+FFFD each (as `String::from_utf8_lossy` does); a trailing incomplete character is kept.
fn take_complete(pending: &mut Vec<u8>) -> String {
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
    fn a_character_cut_at_the_end_is_dropped_not_replaced() {
        let tok = sample();
        // "好" takes several byte tokens; a generation stopped after "今天" and part of "好".
        let whole = tok.encode("今天好", false, true).unwrap();
        let head = tok.encode("今天", false, true).unwrap();
        assert!(whole.len() >= head.len() + 2, "'好' is expected to take several byte tokens: {whole:?}");
        assert_eq!(&whole[..head.len()], &head[..], "the head tokenizes alone as in the whole");
        for cut_at in head.len() + 1..whole.len() {
            let cut = &whole[..cut_at];
            assert!(tok.decode(cut).unwrap().ends_with('\u{FFFD}'), "plain decode replaces the partial character");
            assert_eq!(tok.decode_generated(cut).unwrap(), "今天");
            for bytes in [true, false] {
                let pieces = stream(&tok, bytes, cut);
                assert_eq!(pieces.concat(), "今天", "byte mode {bytes}, cut at {cut_at}");
            }
        }
        assert_eq!(tok.decode_generated(&whole).unwrap(), "今天好");
        // Invalid bytes inside the text are not a cut: they stay U+FFFD.
        assert_eq!(super::incomplete_tail(&[0xE5, 0x41]), 0);
        assert_eq!(super::incomplete_tail("好".as_bytes()), 0);
        assert_eq!(super::incomplete_tail(&"好".as_bytes()[..2]), 2);
        assert_eq!(super::incomplete_tail(&"🍕".as_bytes()[..3]), 3);
        assert_eq!(super::incomplete_tail(b"a\xF0"), 1);
    }

    #[test]
    fn invalid_id_is_an_error() {
        let tok = sample();
        let mut d = StreamDecoder::new(&tok);
        assert!(matches!(d.push(1 << 30), Err(TokenizerError::UnknownId { .. })));
    }
}
