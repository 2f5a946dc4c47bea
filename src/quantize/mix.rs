//! Quantization types (the `--type` of `dustoff quantize`) and the rules that pick each tensor's
//! storage type, following the conventions llama.cpp's quantizer made familiar (its
//! `llama_tensor_get_type` for these types; the rules name tensors by kind, so they hold for the
//! MoE and hybrid families too):
//!
//! - Kept F32: 1-D tensors (norms, biases, `ssm_a`, `ssm_dt.bias`), `rope_freqs.weight`, MoE
//!   routers (`ffn_gate_inp`: a 4-bit router changes which experts run) and the DeltaNet conv
//!   taps (`ssm_conv1d`, `[C, 4]`: too small to gain, llama.cpp keeps them too).
//! - The output head (`output.weight`, or `token_embd.weight` when the embedding is tied) is
//!   Q6_K for every type except q8_0 (Q8_0) and f16 (F16).
//! - "attn_v-like" tensors are `attn_v` and the DeltaNet `attn_qkv` (one per layer in every
//!   family here, so llama.cpp's running index is the layer index).
//! - `_M` mixes (q4_k_m, q5_k_m): attn_v-like tensors and every `ffn_down` (dense, the stacked
//!   experts `ffn_down_exps`, the shared expert `ffn_down_shexp`) of "more bits" layers get
//!   Q6_K: the first and last eighth of the layers and every third layer in between
//!   (`i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2`).
//! - q4_k_s: attn_v-like tensors of layers 0-3 and `ffn_down*` of the first eighth get Q5_K.
//! - q4_0 with an importance matrix: `ffn_down*` of the first eighth get Q4_1.
//! - Models of exactly 8 experts (llama.cpp's Mixtral rule): attn_v-like tensors and `attn_k`
//!   get Q8_0, and for q4_k_s / q4_k_m `attn_output` gets Q5_K. (Qwen3-30B-A3B has 128 experts,
//!   Qwen3.5-35B-A3B 256: the rule does not apply to them; the tiny reference models have 8.)
//! - Everything else (the untied embedding, q/k/o, gate/up of dense, routed and shared experts,
//!   the DeltaNet `attn_gate`, `ssm_alpha`, `ssm_beta`, `ssm_ba`, `ssm_out`, the shared expert's
//!   gate `ffn_gate_inp_shexp`) gets the type's base: Q4_K, Q5_K, Q6_K, Q8_0, Q4_0 or F16.
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

/// What the rules need to know about the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MixModel {
    /// The model has no `output.weight`: `token_embd.weight` is also the output head.
    pub tied_head: bool,
    pub n_layers: usize,
    /// Routed experts per MoE layer (0 for dense models).
    pub n_experts: usize,
    /// An importance matrix calibrates the quantization.
    pub has_imatrix: bool,
}

/// The type a tensor gets before the row-length check.
fn preferred(t: QuantType, name: &str, is_head: bool, m: &MixModel) -> GgmlType {
    if is_head {
        return match t {
            QuantType::Q8_0 => GgmlType::Q8_0,
            QuantType::F16 => GgmlType::F16,
            _ => GgmlType::Q6K,
        };
    }
    if t == QuantType::F16 {
        return GgmlType::F16;
    }
    let (i, n) = (layer_of(name), m.n_layers);
    let v_like = name.ends_with(".attn_v.weight") || name.ends_with(".attn_qkv.weight");
    // Every FFN down projection, as llama.cpp's "ffn_down" category: dense, experts, shared.
    let down =
        [".ffn_down.weight", ".ffn_down_exps.weight", ".ffn_down_shexp.weight"].iter().any(|s| name.ends_with(s));
    let eight = m.n_experts == 8;
    if v_like {
        let ty = match (t, i) {
            (QuantType::Q4KM | QuantType::Q5KM, Some(i)) if more_bits(i, n) => GgmlType::Q6K,
            (QuantType::Q4KS, Some(i)) if i < 4 => GgmlType::Q5K,
            _ => t.base(),
        };
        return if eight { GgmlType::Q8_0 } else { ty };
    }
    if name.ends_with(".attn_k.weight") && eight {
        return GgmlType::Q8_0;
    }
    if name.ends_with(".attn_output.weight") && eight && matches!(t, QuantType::Q4KS | QuantType::Q4KM) {
        return GgmlType::Q5K;
    }
    match (t, i) {
        (QuantType::Q4KM | QuantType::Q5KM, Some(i)) if down && more_bits(i, n) => GgmlType::Q6K,
        (QuantType::Q4KS, Some(i)) if down && i < n / 8 => GgmlType::Q5K,
        (QuantType::Q4_0, Some(i)) if down && m.has_imatrix && i < n / 8 => GgmlType::Q4_1,
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
/// model has no `output.weight`, so `token_embd.weight` is also the output head. For a dense
/// model without an importance matrix; see [`choose_in`].
pub fn choose(t: QuantType, name: &str, shape: &[usize], tied_head: bool, n_layers: usize) -> Choice {
    choose_in(t, name, shape, &MixModel { tied_head, n_layers, ..Default::default() })
}

/// Whether llama.cpp's quantizer leaves tensor `name` of `shape` as it is (F32 here).
pub fn kept_f32(name: &str, shape: &[usize]) -> bool {
    // The MoE router stays F32 as in llama.cpp: a 4-bit router changes which experts run.
    let router = name.ends_with(".ffn_gate_inp.weight");
    let conv = name.contains("ssm_conv1d");
    shape.len() < 2 || !name.ends_with(".weight") || name == "rope_freqs.weight" || router || conv
}

/// The storage type of tensor `name` (`shape` row-major, outermost first) of model `m`.
pub fn choose_in(t: QuantType, name: &str, shape: &[usize], m: &MixModel) -> Choice {
    if kept_f32(name, shape) {
        return Choice { dtype: GgmlType::F32, fallback_from: None };
    }
    let is_head = name == "output.weight" || (m.tied_head && name == "token_embd.weight");
    let want = preferred(t, name, is_head, m);
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

    /// The MoE and hybrid conventions (llama.cpp's categories): attn_qkv is attn_v-like, the
    /// shared expert's down projection is an ffn_down, conv taps stay F32, 8-expert models get
    /// Q8_0 attn_v/attn_k and Q5_K attn_output.
    #[test]
    fn moe_and_hybrid_rules() {
        let big = MixModel { n_layers: 40, n_experts: 256, ..Default::default() };
        let c = |m: &MixModel, t, name: &str| choose_in(t, name, &[4096, 2048], m).dtype;
        assert_eq!(c(&big, QuantType::Q4KM, "blk.0.attn_qkv.weight"), GgmlType::Q6K);
        assert_eq!(c(&big, QuantType::Q4KM, "blk.6.attn_qkv.weight"), GgmlType::Q4K);
        assert_eq!(c(&big, QuantType::Q4KM, "blk.7.attn_qkv.weight"), GgmlType::Q6K);
        assert_eq!(c(&big, QuantType::Q4KS, "blk.3.attn_qkv.weight"), GgmlType::Q5K);
        assert_eq!(c(&big, QuantType::Q4KM, "blk.0.ffn_down_shexp.weight"), GgmlType::Q6K);
        assert_eq!(c(&big, QuantType::Q4KM, "blk.6.ffn_down_shexp.weight"), GgmlType::Q4K);
        assert_eq!(c(&big, QuantType::Q4KS, "blk.4.ffn_down_exps.weight"), GgmlType::Q5K);
        assert_eq!(c(&big, QuantType::Q4KM, "blk.0.attn_gate.weight"), GgmlType::Q4K);
        assert_eq!(c(&big, QuantType::Q4KM, "blk.0.ssm_out.weight"), GgmlType::Q4K);
        assert_eq!(c(&big, QuantType::Q4KM, "blk.3.attn_k.weight"), GgmlType::Q4K);
        assert_eq!(choose_in(QuantType::Q4KM, "blk.0.ssm_conv1d.weight", &[8192, 4], &big).dtype, GgmlType::F32);
        let eight = MixModel { n_layers: 4, n_experts: 8, ..Default::default() };
        assert_eq!(c(&eight, QuantType::Q4KM, "blk.1.attn_v.weight"), GgmlType::Q8_0);
        assert_eq!(c(&eight, QuantType::Q4KM, "blk.1.attn_qkv.weight"), GgmlType::Q8_0);
        assert_eq!(c(&eight, QuantType::Q6K, "blk.1.attn_k.weight"), GgmlType::Q8_0);
        assert_eq!(c(&eight, QuantType::Q4KM, "blk.1.attn_output.weight"), GgmlType::Q5K);
        assert_eq!(c(&eight, QuantType::Q6K, "blk.1.attn_output.weight"), GgmlType::Q6K);
        let cal = MixModel { n_layers: 16, has_imatrix: true, ..Default::default() };
        assert_eq!(c(&cal, QuantType::Q4_0, "blk.1.ffn_down.weight"), GgmlType::Q4_1);
        assert_eq!(c(&cal, QuantType::Q4_0, "blk.2.ffn_down.weight"), GgmlType::Q4_0);
        assert_eq!(c(&eight, QuantType::F16, "blk.1.attn_v.weight"), GgmlType::F16);
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
