//! Where untrusted values (a record's fields, chat message contents) sit in a rendered prompt,
//! so that the tokenizer keeps them plain text (`TextCodec::encode_prompt`): the prompt is
//! rendered again with a numbered marker in place of each value, and the values are put back
//! in place of the markers; when that gives the real prompt, the places are exact. Where a
//! template transforms a value (`| trim`), the caller falls back to `differing_range`.

use std::ops::Range;

/// A marker prefix no value can contain: a private-use character and a hash of the values.
pub(crate) fn marker_head<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p.as_bytes()).update(&[0]);
    }
    format!("\u{E000}{}", &h.finalize().to_hex()[..16])
}

/// The marker of value `i` (`None`: the single marker of a one-value rendering).
pub(crate) fn marker(head: &str, i: Option<usize>) -> String {
    match i {
        Some(i) => format!("{head}{i}\u{E001}"),
        None => format!("{head}\u{E001}"),
    }
}

/// The byte range of each non-empty value in `text` (the real prompt), from `rendered` (the
/// prompt with `marker(head, Some(i))` for value `i`), or `None` when putting the values back
/// does not give `text`.
pub(crate) fn fill_markers(rendered: &str, head: &str, values: &[&str], text: &str) -> Option<Vec<Range<usize>>> {
    let mut rebuilt = String::with_capacity(text.len());
    let mut spans = Vec::new();
    let mut rest = rendered;
    while let Some(at) = rest.find(head) {
        rebuilt.push_str(&rest[..at]);
        let after = &rest[at + head.len()..];
        let end = after.find('\u{E001}')?;
        let value = values.get(after[..end].parse::<usize>().ok()?)?;
        if !value.is_empty() {
            spans.push(rebuilt.len()..rebuilt.len() + value.len());
        }
        rebuilt.push_str(value);
        rest = &after[end + '\u{E001}'.len_utf8()..];
    }
    rebuilt.push_str(rest);
    (rebuilt == text).then_some(spans)
}

/// The byte range of `a` where it differs from `b`: what is left of `a` after the longest common
/// prefix and (not overlapping it) the longest common suffix, widened to character boundaries.
pub(crate) fn differing_range(a: &str, b: &str) -> Range<usize> {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    let mut start = x.iter().zip(y).take_while(|(p, q)| p == q).count();
    let room = x.len().min(y.len()) - start;
    let mut end = x.len() - x.iter().rev().zip(y.iter().rev()).take(room).take_while(|(p, q)| p == q).count();
    while !a.is_char_boundary(start) {
        start -= 1;
    }
    while !a.is_char_boundary(end) {
        end += 1;
    }
    start..end
}
