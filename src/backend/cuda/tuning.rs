//! Switches for A/B comparisons of kernel choices (docs/BENCHMARKS.md), read from the
//! environment once per process. The defaults are the measured best on the H200.

use std::sync::OnceLock;

pub(super) struct Tuning {
    /// `DUSTOFF_TC_MIN_TOKENS`: fewest tokens of a step for the tensor-core GEMM (default 2).
    pub tc_min_tokens: Option<usize>,
    /// `DUSTOFF_TC_MAX_TOKENS`: most tokens for it; larger steps use cuBLAS (default 16).
    pub tc_max_tokens: Option<usize>,
    /// `DUSTOFF_QGEMV_MAX_TOKENS`: most tokens of a step for the GEMV on packed quantized
    /// blocks (1..=8); larger steps widen the matrix to F16 for the GEMM.
    pub qgemv_max_tokens: Option<usize>,
    /// `DUSTOFF_QGEMV_F32=1`: the f32-input GEMV on packed blocks (gemv_quant.cu) instead of
    /// the int8-activation dp4a GEMV (gemv_q8.cu), for same-run comparisons.
    pub qgemv_f32: bool,
    /// `DUSTOFF_QGEMM_MAX_TOKENS=N`: most tokens of a step for the tensor-core GEMM on packed
    /// blocks (gemm_quant.cu); larger steps widen quantized matrices to F16 (0: always widen).
    pub qgemm_max_tokens: Option<usize>,
    /// `DUSTOFF_QGEMV_ROWS=2`: the 1-token int8 GEMV reads 2 weight rows per warp (else 4).
    pub qgemv_rows2: bool,
    /// `DUSTOFF_QGEMM_Z64=1`: steps above 64 tokens on the packed GEMM take 64-token tiles along
    /// z (4 warps) instead of the 128-token prefill tile (8 warps).
    pub qgemm_z64: bool,
    /// `DUSTOFF_QGEMM_R128=N`: fewest tokens of a step for the 128-row batch tile of the packed
    /// GEMM (gemm_quant.cu `_r128_`; 0: never, the 64-row tiles for every step).
    pub qgemm_r128: Option<usize>,
    /// `DUSTOFF_QGEMM_BLOCKS=N`: blocks the packed GEMM of 9..=64 tokens aims for through
    /// split-K (default 256).
    pub qgemm_blocks: Option<usize>,
    /// `DUSTOFF_QGEMM_SPLIT_COST=N`: a block's start-up in chunks for the packed GEMM's
    /// split-K choice by whole waves (0: the block target alone).
    pub qgemm_split_cost: Option<usize>,
    /// `DUSTOFF_TC_ROWS=64`: 64-row blocks of the wide-tile GEMM even where 128 fit.
    pub tc_rows64: bool,
    /// `DUSTOFF_ATTN_ONEPASS=0`: the two-pass decode attention for every step.
    pub attn_onepass: bool,
    /// `DUSTOFF_ATTN_TC=0`: decode attention on CUDA cores (the one-pass kernel) where the
    /// tensor-core kernel (attention_decode_tc.cu: head sizes 64 and 128) would serve.
    pub attn_tc: bool,
    /// `DUSTOFF_ATTN_TC_MIN_TOKENS=N`: fewest tokens of a decode launch on the tensor cores
    /// (default 8: fewer are faster on the one-pass kernel).
    pub attn_tc_min_tokens: Option<usize>,
    /// `DUSTOFF_ATTN_WARPS=N` (1..=16): warps of a one-pass decode attention block.
    pub attn_warps: Option<usize>,
    /// `DUSTOFF_ATTN_SPLIT=N` (a multiple of 16): positions per decode attention split.
    pub attn_split: Option<usize>,
    /// `DUSTOFF_CASCADE=0`: no shared-prefix (cascade) attention in decode steps.
    pub cascade: bool,
    /// `DUSTOFF_FUSE_NORM=0`: the layer norms as launches of their own (the step before
    /// fused_norm.cu), for same-run comparisons; the default folds them into the products.
    pub fuse_norm: bool,
    /// `DUSTOFF_GEMV_ROWS=2|4|8`: rows a block of the one-token F16 GEMVs (gemv_f16.cu,
    /// fused_norm.cu). Default 4: Qwen3-8B F16 decode 203.9 tok/s against 200.8 with 2 and
    /// 201.5 with 8 (H200, docs/BENCHMARKS.md, 2026-12-01, "decode-step fusion").
    pub gemv_rows: usize,
    /// `DUSTOFF_GRAPH_NODES=1`: print the node count of every captured decode graph.
    pub graph_nodes: bool,
    /// `DUSTOFF_PREFILL_QS=1`: the prefill attention's Q tile in shared memory for head sizes
    /// 64 and 128 too (default: in registers, measured faster on the H200).
    pub prefill_qs: bool,
    /// `DUSTOFF_PREFILL_ACC=0`: the prefill attention's softmax through shared memory from
    /// compute capability 8.0 on too (kernels/attention_prefill.cu, `_acc` entries).
    pub prefill_acc: bool,
    /// `DUSTOFF_ATTN_FAST_EXP=0`: the one-pass decode attention's exponentials as `expf`
    /// instead of one multiply and the SFU's `ex2.approx` (default: 9-14% faster on the H200,
    /// docs/BENCHMARKS.md, "the ticket-1046 job diff, prefill softmax, decode exponentials").
    pub attn_fast_exp: bool,
    /// `DUSTOFF_MOE_FUSED=0`: one-stream MoE steps take the five launches of the grouped walk
    /// instead of the fused router + top-k and down + weighted sum (`moe::fused_enabled`).
    pub moe_fused: bool,
    /// `DUSTOFF_MOE_PAIR_MAX_TOKENS=N`: most tokens of a step for the pair-mode MoE kernels
    /// (default 8); larger steps group by expert.
    pub moe_pair_max_tokens: usize,
    /// `DUSTOFF_MOE_GEMM=0`: steps that group by expert take the grouped GEMV instead of the
    /// tensor-core GEMM.
    pub moe_gemm: bool,
    /// `DUSTOFF_MOE_GEMM_SKIP=0`: the grouped GEMM computes every 16-token fragment of a tile,
    /// also those past its expert's tokens. The default leaves them out (a nightly job's mixed
    /// steps give an expert ~30 tokens: half of a 64-token tile): H200, compute_70 PTX, 512
    /// tokens: gate/up 372 against 435 us, down 209 against 243 (scripts/gpu-moe-prefill.sh).
    pub moe_gemm_skip: bool,
    /// `DUSTOFF_MOE_WIDE_TILE=0`: the grouped GEMM's down product keeps the 64 x 64 tile where
    /// `ops::moe_gemm::Tile::for_step` picks the 128-row x 48-token one (for comparisons).
    pub moe_wide_tile: bool,
    /// `DUSTOFF_MOE_T8=N`: the grouped GEMM's 8-token tile while a step's mean expert holds at
    /// most N tokens (`ops::moe_gemm::Tile::for_step`; 0: never).
    pub moe_t8: Option<usize>,
    /// `DUSTOFF_MOE_MMA=1`: the grouped GEMM's 8- and 16-token tiles dequantize the weights
    /// straight into mma.m8n8k4 fragments (kernels/moe_gemm_mma.cu) instead of staging them.
    pub moe_mma: bool,
    /// `DUSTOFF_MOE_T128=N`: the grouped GEMM's 128-token tile (kernels/moe_gemm_t128.cu) for
    /// the gate/up product of a step whose mean expert holds at least N tokens
    /// (`ops::moe_gemm::Tile::for_step`; 0: never).
    pub moe_t128: Option<usize>,
    /// `DUSTOFF_ROUTER_TILED=1`: the router logits of steps above 8 tokens in 32 x 32 tiles
    /// (`moe_router_logits_tile_f32`: the router read once per 32 tokens) instead of a warp per
    /// (expert, token). Off: measured slower below 768 tokens (H200, compute_70 PTX: ~66 us at
    /// 64..768 tokens against 17 us at 64, 56 at 512, 80 at 768): too few blocks to fill the GPU.
    pub router_tiled: bool,
    /// `DUSTOFF_SHEXP_FUSED=0`: the shared expert's gate applied after its down product
    /// (`shexp_gate_add_f32`) instead of folded into the down GEMV's int8 input.
    pub shexp_fused: bool,
    /// `DUSTOFF_SHEXP_PAIRS=0`: one-stream steps run the shared expert apart from the routed
    /// launches (moe/shexp.rs).
    pub shexp_pairs: bool,
    /// `DUSTOFF_WIDE_MB=N`: the F16 widening scratch in MB (default 32), for comparisons of
    /// the chunking.
    pub wide_mb: Option<usize>,
    /// `DUSTOFF_MEMORY_LOG=1`: a line on stderr per device allocation (`device::log_memory`).
    pub memory_log: bool,
    /// `DUSTOFF_DN_FUSED=0`: a linear layer's conv + L2 norm + gates as two launches instead of
    /// one (`hybrid::fused_conv_prep`).
    pub dn_fused: bool,
    /// `DUSTOFF_DN_RECUR_NORM=0`: the delta rule's step form, then its gated norm as a launch of
    /// its own.
    pub dn_recur_norm: bool,
    /// `DUSTOFF_DN_CHUNK_MIN=N`: fewest tokens of a chunk for the chunked delta rule (default one
    /// sub-chunk; 0: never).
    pub dn_chunk_min: Option<usize>,
}

pub(super) fn tuning() -> &'static Tuning {
    static T: OnceLock<Tuning> = OnceLock::new();
    T.get_or_init(|| {
        let num = |name: &'static str| crate::sys::env::get(name).and_then(|v| v.parse::<usize>().ok());
        Tuning {
            tc_min_tokens: num("DUSTOFF_TC_MIN_TOKENS"),
            tc_max_tokens: num("DUSTOFF_TC_MAX_TOKENS"),
            qgemv_max_tokens: num("DUSTOFF_QGEMV_MAX_TOKENS").filter(|n| (1..=8).contains(n)),
            qgemv_f32: num("DUSTOFF_QGEMV_F32") == Some(1),
            qgemm_max_tokens: num("DUSTOFF_QGEMM_MAX_TOKENS"),
            qgemv_rows2: num("DUSTOFF_QGEMV_ROWS") == Some(2),
            qgemm_z64: num("DUSTOFF_QGEMM_Z64") == Some(1),
            qgemm_r128: num("DUSTOFF_QGEMM_R128"),
            qgemm_blocks: num("DUSTOFF_QGEMM_BLOCKS").filter(|&b| b > 0),
            qgemm_split_cost: num("DUSTOFF_QGEMM_SPLIT_COST"),
            tc_rows64: num("DUSTOFF_TC_ROWS") == Some(64),
            attn_onepass: num("DUSTOFF_ATTN_ONEPASS") != Some(0),
            attn_tc: num("DUSTOFF_ATTN_TC") != Some(0),
            attn_tc_min_tokens: num("DUSTOFF_ATTN_TC_MIN_TOKENS"),
            attn_warps: num("DUSTOFF_ATTN_WARPS").filter(|w| (1..=16).contains(w)),
            attn_split: num("DUSTOFF_ATTN_SPLIT").filter(|&v| v >= 16 && v % 16 == 0),
            cascade: num("DUSTOFF_CASCADE") != Some(0),
            fuse_norm: num("DUSTOFF_FUSE_NORM") != Some(0),
            gemv_rows: num("DUSTOFF_GEMV_ROWS").filter(|r| [2, 4, 8].contains(r)).unwrap_or(4),
            graph_nodes: num("DUSTOFF_GRAPH_NODES") == Some(1),
            prefill_qs: num("DUSTOFF_PREFILL_QS") == Some(1),
            prefill_acc: num("DUSTOFF_PREFILL_ACC") != Some(0),
            attn_fast_exp: num("DUSTOFF_ATTN_FAST_EXP") != Some(0),
            moe_fused: num("DUSTOFF_MOE_FUSED") != Some(0),
            moe_pair_max_tokens: num("DUSTOFF_MOE_PAIR_MAX_TOKENS").unwrap_or(8),
            moe_gemm: num("DUSTOFF_MOE_GEMM") != Some(0),
            moe_gemm_skip: num("DUSTOFF_MOE_GEMM_SKIP") != Some(0),
            moe_wide_tile: num("DUSTOFF_MOE_WIDE_TILE") != Some(0),
            moe_t8: num("DUSTOFF_MOE_T8"),
            moe_mma: num("DUSTOFF_MOE_MMA") == Some(1),
            moe_t128: num("DUSTOFF_MOE_T128"),
            router_tiled: num("DUSTOFF_ROUTER_TILED") == Some(1),
            shexp_fused: num("DUSTOFF_SHEXP_FUSED") != Some(0),
            shexp_pairs: num("DUSTOFF_SHEXP_PAIRS") != Some(0),
            wide_mb: num("DUSTOFF_WIDE_MB"),
            memory_log: num("DUSTOFF_MEMORY_LOG") == Some(1),
            dn_fused: num("DUSTOFF_DN_FUSED") != Some(0),
            dn_recur_norm: num("DUSTOFF_DN_RECUR_NORM") != Some(0),
            dn_chunk_min: num("DUSTOFF_DN_CHUNK_MIN"),
        }
    })
}
