//! Which entries a backend launches, from their names: the packed block format an entry reads
//! and the attention head size it serves. A backend loads only the entries of its weights'
//! formats and its head size (`prune::keep_entries`), so that the driver compiles a quarter of
//! the per-format entries for a Q4_K_M model, none for an F16 one, and one head size of three.
//!
//! Every per-format entry names its format as one `_`-separated pair (`gemv_q4_k_n1`,
//! `moe_gate_up_q8_q4_0`: int8 activations on Q4_0 blocks); `_q8` alone (the 8-bit KV cache, int8
//! activations) names none. Every per-head-size entry names it as one part `hd<N>`. The tests
//! hold every typed handle of `entries` and the attention launchers' choices to these rules.

use crate::backend::cuda::qformat::QFormat;
use crate::model::quant::GgmlType;

/// The packed formats the kernels read (`QFormat::all`'s order).
fn packed_formats() -> [GgmlType; 8] {
    QFormat::all().map(|f| f.dtype)
}

/// How entry names spell format `t`: its GGUF name in lower case (`Q4_K` -> `q4_k`).
pub fn entry_spelling(t: GgmlType) -> String {
    t.name().to_ascii_lowercase()
}

/// Whether the name parts `a`, `b` spell format `t` (`q4`, `k` spell Q4_K).
fn spells(t: GgmlType, a: &str, b: &str) -> bool {
    t.name().split_once('_').is_some_and(|(x, y)| x.eq_ignore_ascii_case(a) && y.eq_ignore_ascii_case(b))
}

/// The packed format `entry` reads; `None` for an entry of no packed format.
pub fn entry_format(entry: &str) -> Option<GgmlType> {
    let parts: Vec<&str> = entry.split('_').collect();
    let formats = packed_formats();
    parts.windows(2).find_map(|w| formats.into_iter().find(|t| spells(*t, w[0], w[1])))
}

/// The attention head size an entry serves (`attn_prefill_hd128_q8`: 128); `None` for an entry
/// of any head size or none.
pub fn entry_head_dim(entry: &str) -> Option<usize> {
    entry.split('_').find_map(|p| p.strip_prefix("hd").and_then(|n| n.parse().ok()))
}

/// The head-size entries a model of head size `head_dim` launches: 64 and 128 have their own,
/// every other size takes the 256 ones (prefill, one-pass decode) or the generic two-pass one
/// (`ops::attention::decode_entry`, `ops::prefill::choose_entry`).
fn served_head_dim(head_dim: usize) -> usize {
    match head_dim {
        64 | 128 => head_dim,
        _ => 256,
    }
}

/// What a backend holds: the packed formats of its weights and its attention head size.
/// Entries of other formats and head sizes are not loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelEntries {
    formats: Vec<GgmlType>,
    head_dim: usize,
}

impl ModelEntries {
    pub fn new(formats: impl IntoIterator<Item = GgmlType>, head_dim: usize) -> Self {
        let formats = formats.into_iter().filter(|t| QFormat::of(*t).is_some()).collect();
        ModelEntries { formats, head_dim: served_head_dim(head_dim) }
    }

    /// Whether `entry` is of a held format (or none) and of the held head size (or none).
    pub fn keeps(&self, entry: &str) -> bool {
        entry_format(entry).is_none_or(|t| self.formats.contains(&t))
            && entry_head_dim(entry).is_none_or(|h| h == self.head_dim)
    }
}

#[cfg(test)]
mod tests;
