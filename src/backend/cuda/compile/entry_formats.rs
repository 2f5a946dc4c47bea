//! The packed block format an entry reads, from its name, and the set of formats a model holds:
//! a backend loads only the entries of its own formats (`prune::keep_entries`), so that the
//! driver compiles a quarter of the per-format entries for a Q4_K_M model and none for an F16 one.
//!
//! Every per-format entry names its format as one `_`-separated pair (`gemv_q4_k_n1`,
//! `moe_gate_up_q8_q4_0`: int8 activations on Q4_0 blocks); `_q8` alone (the 8-bit KV cache, int8
//! activations) names none. The tests hold every typed handle of `entries` to this rule.

use crate::model::quant::GgmlType;

/// The packed formats the kernels read, as their entry names spell them.
const FORMATS: [(&str, GgmlType); 8] = [
    ("q4_0", GgmlType::Q4_0),
    ("q4_1", GgmlType::Q4_1),
    ("q5_0", GgmlType::Q5_0),
    ("q5_1", GgmlType::Q5_1),
    ("q8_0", GgmlType::Q8_0),
    ("q4_k", GgmlType::Q4K),
    ("q5_k", GgmlType::Q5K),
    ("q6_k", GgmlType::Q6K),
];

/// The packed format `entry` reads; `None` for an entry of no packed format.
pub fn entry_format(entry: &str) -> Option<GgmlType> {
    let parts: Vec<&str> = entry.split('_').collect();
    parts.windows(2).find_map(|w| FORMATS.iter().find(|(n, _)| n.split_once('_') == Some((w[0], w[1]))).map(|f| f.1))
}

/// The packed formats a backend's weights hold: entries of other formats are not loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldFormats(Vec<GgmlType>);

impl HeldFormats {
    pub fn new(formats: impl IntoIterator<Item = GgmlType>) -> Self {
        HeldFormats(formats.into_iter().filter(|t| FORMATS.iter().any(|f| f.1 == *t)).collect())
    }

    /// Whether `entry` is of a held format or of none.
    pub fn keeps(&self, entry: &str) -> bool {
        entry_format(entry).is_none_or(|t| self.0.contains(&t))
    }

    /// The held packed formats (file order), for logs.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|t| t.name()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::compile::entries::*;
    use crate::backend::cuda::compile::kernels::KERNEL_FILES;
    use crate::backend::cuda::qformat::QFormat;

    #[test]
    fn names_parse_to_their_format_or_none() {
        assert_eq!(entry_format("gemv_q4_k_n1"), Some(GgmlType::Q4K));
        assert_eq!(entry_format("moe_gate_up_q8_q4_0"), Some(GgmlType::Q4_0));
        assert_eq!(entry_format("moe_down_sum_q8_q8_0"), Some(GgmlType::Q8_0));
        assert_eq!(entry_format("gemmq_q6_k_r128_t32"), Some(GgmlType::Q6K));
        for none in
            ["attn_decode_tc_q8_hd64", "rmsnorm_q8_f32", "quantize_x_q8", "moe_gate_up_f16_p", "splitk_reduce_q"]
        {
            assert_eq!(entry_format(none), None, "{none}");
        }
    }

    /// Every entry of every file names at most one format, and each format's entries are the
    /// ones a launcher for that format asks for (so a backend never asks for an entry it left out).
    #[test]
    fn every_typed_handle_asks_for_an_entry_of_its_own_format() {
        for f in KERNEL_FILES {
            for e in f.entries {
                let parts: Vec<&str> = e.split('_').collect();
                let hits = parts
                    .windows(2)
                    .filter(|w| FORMATS.iter().any(|(n, _)| n.split_once('_') == Some((w[0], w[1]))))
                    .count();
                assert!(hits <= 1, "{e} names {hits} formats");
            }
        }
        for q in QFormat::all() {
            let t = Some(q.dtype);
            let mut asked = Vec::new();
            for n_tok in 1..=8 {
                for swiglu in [false, true] {
                    let g = Gemv { n_tok, swiglu };
                    asked.extend([gemv_quant(&q, g), gemv_q8(&q, g, false), gemv_q8(&q, g, true)]);
                }
            }
            for tiles in 1..=4 {
                asked.push(gemm_quant(&q, tiles));
            }
            asked.extend([gemm_quant_w128(&q), gemm_quant_r128(&q, 1), gemm_quant_r128(&q, 2)]);
            asked.extend([dequant(&q), embedding_q(&q), moe_down_sum(q.index)]);
            asked.extend([moe_q8(q.index, true), moe_q8(q.index, false)]);
            for (gate_up, grouped) in [(false, false), (false, true), (true, false), (true, true)] {
                asked.push(moe_mat(q.index, MoeProduct { gate_up, grouped }));
            }
            if let Some(col) = MOE_GEMM_FORMATS.iter().position(|&f| f == q.dtype) {
                for tile in 0..7 {
                    for gate_up in [false, true] {
                        asked.extend(moe_gemm(col, gate_up, tile));
                    }
                }
            }
            for e in asked {
                assert_eq!(entry_format(e), t, "{e} is asked for {:?}", q.dtype);
            }
        }
        // The F16 slab's entries name no packed format.
        for (gate_up, grouped) in [(false, false), (true, true)] {
            assert_eq!(entry_format(moe_mat(SLAB_F16, MoeProduct { gate_up, grouped })), None);
        }
        assert_eq!(entry_format(moe_down_sum(SLAB_F16)), None);
    }

    #[test]
    fn a_model_keeps_its_formats_entries_and_every_formatless_one() {
        let held = HeldFormats::new([GgmlType::Q4K, GgmlType::Q6K, GgmlType::F32, GgmlType::F16]);
        assert_eq!(held.names(), ["Q4_K", "Q6_K"]);
        let all: Vec<&str> = KERNEL_FILES.iter().flat_map(|f| f.entries.iter().copied()).collect();
        let kept: Vec<&str> = all.iter().copied().filter(|e| held.keeps(e)).collect();
        assert!(kept.contains(&"gemv_q4_k_n1") && kept.contains(&"moe_gemm_down_q6_k_w48"));
        assert!(kept.contains(&"attn_decode_tc_q8_hd128") && kept.contains(&"rmsnorm_f32"));
        assert!(!kept.contains(&"gemv_q4_0_n1") && !kept.contains(&"moe_gate_up_q8_q5_k"));
        let formatless = all.iter().filter(|e| entry_format(e).is_none()).count();
        let of = |t| all.iter().filter(|e| entry_format(e) == Some(t)).count();
        assert_eq!(kept.len(), formatless + of(GgmlType::Q4K) + of(GgmlType::Q6K));
        assert!(kept.len() * 2 < all.len(), "{} of {}", kept.len(), all.len());
        // An F16 model keeps only the entries of no format.
        assert_eq!(all.iter().filter(|e| HeldFormats::new([GgmlType::F16]).keeps(e)).count(), formatless);
    }
}
