//! Quantization types (the `--type` of `dustoff quantize`) and the rules that pick each tensor's
//! storage type, following the conventions llama.cpp's quantizer made familiar:
//!
//! - 1-D tensors (norms, biases), `rope_freqs.weight` and MoE routers (`ffn_gate_inp`) stay F32.
//! - The output head (`output.weight`, or `token_embd.weight` when the embedding is tied) is
//!   Q6_K for every type except q8_0 (Q8_0) and f16 (F16).
//! - `_M` mixes (q4_k_m, q5_k_m): `attn_v` and `ffn_down` (the stacked `ffn_down_exps` too) of
//!   "more bits" layers get Q6_K: the first and last eighth of the layers and every third layer
//!   in between (`i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2`).
//! - q4_k_s: `attn_v` of layers 0-3 and `ffn_down` of the first eighth of the layers get Q5_K.
//! - Everything else (the untied embedding included) gets the type's base: Q4_K, Q5_K, Q6_K,
//!   Q8_0, Q4_0 or F16.
//! - A row length the chosen type cannot hold falls back: K types need rows of multiples of
//!   256 (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, as llama.cpp does); the 32-element types
//!   need multiples of 32 (-> F16). The report names every fallback.

use crate::model::quant::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantType {
    Q4KM,
    Q4KS,
    Q5KM,
    Q6K,
    Q8_0,
    Q4_0,
    /// Not a quantization: every matrix to F16 (a reference copy of a quantized model).
    F16,
}

pub const TYPE_NAMES: &str = "q4_k_m, q4_k_s, q5_k_m, q6_k, q8_0, q4_0, f16";

impl QuantType {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "q4_k_m" => Self::Q4KM,
            "q4_k_s" => Self::Q4KS,
            "q5_k_m" => Self::Q5KM,
            "q6_k" => Self::Q6K,
            "q8_0" => Self::Q8_0,
            "q4_0" => Self::Q4_0,
            "f16" => Self::F16,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Q4KM => "q4_k_m",
            Self::Q4KS => "q4_k_s",
            Self::Q5KM => "q5_k_m",
            Self::Q6K => "q6_k",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::F16 => "f16",
        }
    }

    /// `general.file_type` (llama.cpp's `LLAMA_FTYPE_MOSTLY_*` numbers).
    pub fn file_type(self) -> u32 {
        match self {
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q8_0 => 7,
            Self::Q4KS => 14,
            Self::Q4KM => 15,
            Self::Q5KM => 17,
            Self::Q6K => 18,
        }
    }

    pub fn base(self) -> GgmlType {
        match self {
            Self::Q4KM | Self::Q4KS => GgmlType::Q4K,
            Self::Q5KM => GgmlType::Q5K,
            Self::Q6K => GgmlType::Q6K,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q4_0 => GgmlType::Q4_0,
            Self::F16 => GgmlType::F16,
        }
    }
}

/// llama.cpp's "use more bits" layer pattern of the `_M` mixes (attn_v and ffn_down in Q6_K for
/// Q4_K_M): the first and last eighth of the layers and every third one between. Also what
/// `bench --synthetic --dtype q4_k_m` builds on the GPU.
pub fn more_bits(i: usize, n: usize) -> bool {
    // `i - n / 8` is reached only when `i >= n / 8`.
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The layer index of a `blk.N.*` name.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// The type a tensor gets before the row-length check.
fn preferred(t: QuantType, name: &str, is_head: bool, n_layers: usize) -> GgmlType {
    if is_head {
        return match t {
            QuantType::Q8_0 => GgmlType::Q8_0,
            QuantType::F16 => GgmlType::F16,
            _ => GgmlType::Q6K,
        };
    }
    let layer = layer_of(name);
    let v = name.ends_with(".attn_v.weight");
    // Stacked experts (`ffn_down_exps`) follow the dense down projection's rule, as llama.cpp's.
    let down = name.ends_with(".ffn_down.weight") || name.ends_with(".ffn_down_exps.weight");
    match (t, layer) {
        (QuantType::Q4KM | QuantType::Q5KM, Some(i)) if (v || down) && more_bits(i, n_layers) => GgmlType::Q6K,
        (QuantType::Q4KS, Some(i)) if (v && i < 4) || (down && i < n_layers / 8) => GgmlType::Q5K,
        _ => t.base(),
    }
}

/// The type for a matrix whose rows of `cols` elements `ty` cannot hold.
fn fallback(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q5K => GgmlType::Q5_1,
        GgmlType::Q6K => GgmlType::Q8_0,
        _ => GgmlType::F16,
    }
}

/// What one tensor becomes.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub dtype: GgmlType,
    /// The type the rules asked for when a fallback replaced it.
    pub fallback_from: Option<GgmlType>,
}

/// The storage type of tensor `name` (`shape` row-major, outermost first). `tied_head`: the
/// model has no `output.weight`, so `token_embd.weight` is also the output head.
pub fn choose(t: QuantType, name: &str, shape: &[usize], tied_head: bool, n_layers: usize) -> Choice {
    // The MoE router stays F32 as in llama.cpp: a 4-bit router changes which experts run.
    let router = name.ends_with(".ffn_gate_inp.weight");
    if shape.len() < 2 || !name.ends_with(".weight") || name == "rope_freqs.weight" || router {
        return Choice { dtype: GgmlType::F32, fallback_from: None };
    }
    let is_head = name == "output.weight" || (tied_head && name == "token_embd.weight");
    let want = preferred(t, name, is_head, n_layers);
    let cols = shape[shape.len() - 1];
    let mut got = want;
    while got.row_bytes(cols).is_none() {
        got = fallback(got);
    }
    Choice { dtype: got, fallback_from: (got != want).then_some(want) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_rules_on_a_30_layer_model() {
        let c = |name: &str, cols| choose(QuantType::Q4KM, name, &[1536, cols], false, 30).dtype;
        // more_bits(i, 30): i < 3, i >= 26, and (i - 3) % 3 == 2 (5, 8, ..., 23).
        let six: Vec<usize> =
            (0..30).filter(|&i| c(&format!("blk.{i}.ffn_down.weight"), 1536) == GgmlType::Q6K).collect();
        assert_eq!(six, vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
        assert_eq!(c("blk.4.attn_q.weight", 1536), GgmlType::Q4K);
        assert_eq!(c("output.weight", 1536), GgmlType::Q6K);
        assert_eq!(c("token_embd.weight", 1536), GgmlType::Q4K);
        assert_eq!(choose(QuantType::Q4KM, "token_embd.weight", &[10, 256], true, 30).dtype, GgmlType::Q6K);
        assert_eq!(choose(QuantType::Q4KM, "blk.0.attn_norm.weight", &[576], false, 30).dtype, GgmlType::F32);
        let moe = |name: &str| choose(QuantType::Q4KM, name, &[128, 2048, 768], false, 48).dtype;
        assert_eq!(moe("blk.0.ffn_down_exps.weight"), GgmlType::Q6K);
        assert_eq!(moe("blk.6.ffn_down_exps.weight"), GgmlType::Q4K);
        assert_eq!(moe("blk.0.ffn_up_exps.weight"), GgmlType::Q4K);
        assert_eq!(choose(QuantType::Q4KM, "blk.0.ffn_gate_inp.weight", &[128, 2048], false, 48).dtype, GgmlType::F32);
    }

    #[test]
    fn rows_that_do_not_fit_a_super_block_fall_back() {
        let ch = choose(QuantType::Q4KM, "blk.4.attn_q.weight", &[576, 576], false, 30);
        assert_eq!(ch, Choice { dtype: GgmlType::Q5_0, fallback_from: Some(GgmlType::Q4K) });
        let head = choose(QuantType::Q4_0, "output.weight", &[100, 576], false, 30);
        assert_eq!(head, Choice { dtype: GgmlType::Q8_0, fallback_from: Some(GgmlType::Q6K) });
        assert_eq!(choose(QuantType::Q5KM, "blk.4.attn_q.weight", &[8, 576], false, 30).dtype, GgmlType::Q5_1);
        assert_eq!(choose(QuantType::Q4_0, "blk.4.attn_q.weight", &[8, 40], false, 30).dtype, GgmlType::F16);
        assert_eq!(QuantType::parse("Q4_K_M"), Some(QuantType::Q4KM));
        assert_eq!(QuantType::parse("q3_k"), None);
    }

    #[test]
    fn q4_k_m_gives_half_of_36_layers_more_bits() {
        // Qwen3-8B has 36 layers: llama.cpp's Q4_K_M raises 18 of them.
        assert_eq!((0..36).filter(|&i| more_bits(i, 36)).count(), 18);
        assert!(more_bits(0, 36) && more_bits(35, 36) && !more_bits(4, 36));
    }
}
