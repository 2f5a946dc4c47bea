//! llguidance's view of dustoff's tokenizer: the byte string of every token (the token trie)
//! and a tokenizer for byte strings. Built here rather than through the crate's `tokenizers`
//! adapter, which pins its own `tokenizers` version.

use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::ConstraintError;
use crate::tokenizer::Tokenizer;

pub struct DustoffTokEnv {
    trie: TokTrie,
    /// The model's tokenizer with control-token text taken as text (the grammar spells text;
    /// a document's `<|im_end|>` must never become the control token).
    plain: tokenizers::Tokenizer,
}

impl DustoffTokEnv {
    /// Token `t`'s bytes: the exact bytes of a byte-level token, the decoded text otherwise.
    /// Control tokens get llguidance's marker byte 0xFF in front of their text, so no grammar
    /// that spells text can produce them; end-of-sequence tokens are allowed by the parser
    /// itself where the grammar may end.
    pub fn new(tok: &Tokenizer) -> Result<Self, ConstraintError> {
        let n = tok.vocab_size();
        let eos = tok.eos_ids();
        let Some(&first_eos) = eos.first() else {
            return Err(ConstraintError::TokEnv("the tokenizer defines no end-of-sequence token".into()));
        };
        let mut words = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let w = if tok.is_control(id) {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(tok.token_text(id).unwrap_or_default().as_bytes());
                w
            } else if let Some(b) = tok.token_bytes(id) {
                b.to_vec()
            } else {
                tok.decode(&[id]).map(String::into_bytes).unwrap_or_default()
            };
            words.push(w);
        }
        let info = TokRxInfo {
            vocab_size: n as u32,
            tok_eos: first_eos,
            tok_bos: tok.bos_id(),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        if let Some(&bad) = eos.iter().find(|&&e| e as usize >= n) {
            return Err(ConstraintError::TokEnv(format!("end-of-sequence id {bad} is outside the vocabulary ({n})")));
        }
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        Ok(DustoffTokEnv { trie, plain: tok.plain_pipeline() })
    }
}

impl TokenizerEnv for DustoffTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The real tokenizer over the longest valid UTF-8 prefix (canonical ids, as the model saw
    /// in training); the trie's greedy split for a trailing partial character.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let valid = match std::str::from_utf8(s) {
            Ok(t) => t,
            // `valid_up_to` ends the longest valid prefix, so this never fails.
            Err(e) => std::str::from_utf8(&s[..e.valid_up_to()]).unwrap_or_default(),
        };
        let mut ids = match self.plain.encode_fast(valid, false) {
            Ok(enc) => enc.get_ids().to_vec(),
            Err(_) => self.trie.greedy_tokenize(valid.as_bytes()),
        };
        ids.extend(self.trie.greedy_tokenize(&s[valid.len()..]));
        ids
    }
}
