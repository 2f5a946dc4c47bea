//! Byte-level BPE alphabet and the per-token byte table used for exact decoding.
//!
//! Byte-level BPE (GPT-2 and descendants) stores every token as a string over a 256-character
//! alphabet: the printable bytes `!`..`~`, `¡`..`¬`, `®`..`ÿ` stand for themselves, and the
//! remaining 68 bytes (controls, space, 0x7f-0xa0, 0xad) are mapped in increasing order to
//! U+0100, U+0101, ... (so space, 0x20, becomes `Ġ` U+0120 and newline `Ċ` U+010A).

/// `true` for the bytes that the byte-level alphabet keeps as their own code point.
fn is_self_mapped(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff)
}

/// The inverse of the byte-level alphabet: `char -> byte`, indexed by code point (< 0x144).
pub(crate) struct ByteDecoder {
    table: [i16; 0x144],
}

impl ByteDecoder {
    pub(crate) fn new() -> Self {
        let mut table = [-1i16; 0x144];
        let mut next = 0x100usize;
        for b in 0..=255u8 {
            if is_self_mapped(b) {
                table[b as usize] = b as i16;
            } else {
                table[next] = b as i16;
                next += 1;
            }
        }
        ByteDecoder { table }
    }

    /// The bytes a byte-level token string stands for; `None` when a character is outside the
    /// alphabet (such a token is then taken as literal text, as the HF decoder does).
    pub(crate) fn decode_token(&self, token: &str, out: &mut Vec<u8>) -> bool {
        let start = out.len();
        for c in token.chars() {
            match self.table.get(c as usize) {
                Some(&b) if b >= 0 => out.push(b as u8),
                _ => {
                    out.truncate(start);
                    return false;
                }
            }
        }
        true
    }
}

/// All token byte strings in one buffer: token `i` is `data[offsets[i]..offsets[i + 1]]`.
pub(crate) struct TokenBytes {
    data: Vec<u8>,
    offsets: Vec<u32>, // [n_vocab + 1]
}

impl TokenBytes {
    /// `raw[i]` true: token `i` is literal text (a special or user-defined token);
    /// otherwise it is decoded through the byte-level alphabet.
    pub(crate) fn build<'a>(tokens: impl Iterator<Item = (&'a str, bool)>) -> Self {
        let dec = ByteDecoder::new();
        let mut data = Vec::new();
        let mut offsets = vec![0u32];
        for (text, raw) in tokens {
            if raw || !dec.decode_token(text, &mut data) {
                data.extend_from_slice(text.as_bytes());
            }
            offsets.push(data.len() as u32);
        }
        TokenBytes { data, offsets }
    }

    pub(crate) fn get(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (&a, &b) = (self.offsets.get(i)?, self.offsets.get(i + 1)?);
        self.data.get(a as usize..b as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection_with_known_points() {
        let d = ByteDecoder::new();
        let mut seen = [false; 256];
        for &b in d.table.iter().filter(|&&b| b >= 0) {
            assert!(!seen[b as usize], "byte {b} mapped twice");
            seen[b as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        let mut out = Vec::new();
        assert!(d.decode_token("Ġworld\u{010A}", &mut out));
        assert_eq!(out, b" world\n");
        out.clear();
        assert!(!d.decode_token("<|im_end|>\u{4e2d}", &mut out));
        assert!(out.is_empty());
    }
}
