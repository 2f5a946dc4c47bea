//! The naming rules of `model_entries` held against every entry a launcher asks for: the typed
//! handles of `entries` for every format, and the attention launchers' choices for every head size
//! (a file of its own: these tests reach the registry and the launchers, which use this module).

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
    for none in ["attn_decode_tc_q8_hd64", "rmsnorm_q8_f32", "quantize_x_q8", "moe_gate_up_f16_p", "splitk_reduce_q"] {
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
            let hits = parts.windows(2).filter(|w| packed_formats().into_iter().any(|t| spells(t, w[0], w[1]))).count();
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
fn a_model_keeps_its_formats_and_head_size_entries_and_every_other_one() {
    let held = ModelEntries::new([GgmlType::Q4K, GgmlType::Q6K, GgmlType::F32, GgmlType::F16], 128);
    assert_eq!(held, ModelEntries::new([GgmlType::Q4K, GgmlType::Q6K], 128), "F32 and F16 hold no entries");
    let all: Vec<&str> = KERNEL_FILES.iter().flat_map(|f| f.entries.iter().copied()).collect();
    let kept: Vec<&str> = all.iter().copied().filter(|e| held.keeps(e)).collect();
    for e in ["gemv_q4_k_n1", "moe_gemm_down_q6_k_w48", "attn_decode_tc_q8_hd128", "attn_prefill_hd128_acc"] {
        assert!(kept.contains(&e), "{e}");
    }
    for e in ["rmsnorm_f32", "attn_split_f16", "moe_gate_up_f16_g", "quantize_x_q8"] {
        assert!(kept.contains(&e), "{e}");
    }
    for e in ["gemv_q4_0_n1", "moe_gate_up_q8_q5_k", "attn_prefill_hd64", "attn_onepass_f16_hd256"] {
        assert!(!kept.contains(&e), "{e}");
    }
    assert!(kept.len() * 2 < all.len(), "{} of {}", kept.len(), all.len());
    // An F16 model keeps the entries of no format: of no head size and of its own.
    let neutral = all.iter().filter(|e| entry_format(e).is_none() && entry_head_dim(e).is_none()).count();
    let f16_64: Vec<&&str> = all.iter().filter(|e| ModelEntries::new([GgmlType::F16], 64).keeps(e)).collect();
    assert!(f16_64.iter().all(|e| entry_format(e).is_none() && entry_head_dim(e).is_none_or(|h| h == 64)));
    assert!(f16_64.len() > neutral && f16_64.contains(&&"attn_prefill_hd64_qs"));
    // Head sizes without entries of their own take the 256 ones.
    let hd96 = ModelEntries::new([], 96);
    assert!(hd96.keeps("attn_prefill_hd256") && !hd96.keeps("attn_prefill_hd128"));
}

/// For every head size and every choice of the decode and prefill launchers, the entry they
/// ask for is one a backend of that head size loads.
#[test]
fn the_attention_launchers_ask_for_entries_of_the_held_head_size() {
    use crate::backend::cuda::ops::attention::{decode_entry, DecodeKernel};
    use crate::backend::cuda::ops::prefill::choose_entry;
    for hd in [64, 80, 96, 128, 192, 256] {
        let held = ModelEntries::new([], hd);
        for k in [DecodeKernel::TwoPass, DecodeKernel::OnePass, DecodeKernel::Tensor] {
            for (group, n_tok) in [(1, 1), (4, 8), (8, 64), (16, 128), (32, 16)] {
                let kernel = DecodeKernel::resolve(Some(k), hd, group, n_tok);
                for q8 in [false, true] {
                    let e = decode_entry(kernel, hd, q8);
                    assert!(held.keeps(e), "head size {hd}: {e} ({k:?} resolved to {kernel:?})");
                }
            }
        }
        for arch in ["compute_70", "compute_90"] {
            for heads in [2, 4, 8] {
                for acc in [None, Some(false), Some(true)] {
                    for q8 in [false, true] {
                        let e = choose_entry(hd, heads, arch, acc, q8).0;
                        assert!(held.keeps(e), "head size {hd}: prefill {e}");
                    }
                }
            }
        }
    }
}
