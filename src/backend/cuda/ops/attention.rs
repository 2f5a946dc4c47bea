//! Launcher of the decode attention (kernels/attention_decode.cu): split attention over the
//! paged F16 cache for one-token chunks, then the merge of its partials (attention_merge.rs,
//! which prefill.rs launches too). Same conventions as `launch`.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::tuning::tuning;
use super::super::CudaError;
use super::attention_merge::Merge;
use super::launch::{check, grid_yz, i32_of, launch, need, Dev};
use super::paged_attn::PagedAttn;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct AttnParams {
    q: u64,
    k_cache: u64,
    v_cache: u64,
    k_scale: u64,
    v_scale: u64,
    block_tables: u64,
    tok_seq: u64,
    pos: u64,
    kv_begin: u64,
    part_o: u64,
    part_ml: u64,
    out: u64,
    n_tok: i32,
    n_heads: i32,
    n_kv: i32,
    head_dim: i32,
    block_size: i32,
    bt_stride: i32,
    q_stride: i32,
    out_stride: i32,
    n_splits: i32,
    split_len: i32,
    scale: f32,
    block_shift: i32,
    fast_exp: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for AttnParams {}

/// Shortest split of the attention pass (a split is one block's share of a sequence) for a
/// step of `n_tok` query tokens: short for decode steps of few tokens (the splits are what fills
/// the GPU), longer from 17 and 33 tokens on (the tokens fill it; fewer partials to merge).
/// `decode_split_len` never goes below it, so `attn_splits` bounds the partials of a step.
pub fn attn_split_len(n_tok: usize) -> usize {
    if let Some(v) = tuning().attn_split {
        return v; // for comparisons
    }
    match n_tok {
        0..=16 => 64,
        17..=32 => 128,
        _ => 256,
    }
}

/// Blocks a decode attention launch aims for (n_kv x tokens x splits): ~8 per SM of an H200,
/// ~13 of a V100. Measured on the H200 (docs/BENCHMARKS.md, 2026-12-01 session 3): 1,024
/// blocks beat 2,048 at 1 sequence x 16k (88 against 136 us a layer), 32 x 1,300 and 64 x 1,024.
const DECODE_TARGET_BLOCKS: usize = 1024;
/// Longest decode split.
const DECODE_MAX_SPLIT: usize = 1024;

/// Blocks a one-pass decode launch aims for: about two an SM of an H200 (its occupancy at 207
/// registers) for a few tokens, four times that from 16 tokens on. Measured on the H200
/// (docs/BENCHMARKS.md, session 4), best split of 64..1,024 per row: 1 sequence x 8k: 256
/// (256 blocks), x 16k: 512 (256), 8 x 870: 256 (256), 32 x 1,300: 512 (768), 64 x 1,024:
/// 1,024 (1,024).
fn onepass_target_blocks(n_tok: usize) -> usize {
    if n_tok < 16 {
        256
    } else {
        1024
    }
}

/// Which decode attention kernel a launch takes (all write the same partials).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeKernel {
    /// attn_split_f16 (any even head size up to 256) or its head-size 64 / 128 forms.
    TwoPass,
    /// attn_onepass_f16_hd* (64, 128, 256): flash-decoding inside the split on CUDA cores.
    OnePass,
    /// attn_decode_tc_hd* (64, 128; attention_decode_tc.cu): the group's heads as the rows of
    /// tensor-core tiles.
    Tensor,
}

/// Whether a decode launch takes the one-pass kernel: head sizes 64, 128 and 256 (unless
/// `DUSTOFF_ATTN_ONEPASS=0`). It was as fast or faster than the two-pass kernel at its best
/// split in every measured row (1 to 64 sequences, contexts 870 to 16k, groups 4 and 8).
pub fn onepass_for(head_dim: usize) -> bool {
    matches!(head_dim, 64 | 128 | 256) && tuning().attn_onepass
}

/// The decode kernel of a launch of `n_tok` one-token chunks, head size `head_dim` and `group`
/// query heads per KV head: the tensor cores (head sizes 64 and 128, groups up to 16, from
/// `TC_MIN_DECODE_TOKENS` tokens on; unless `DUSTOFF_ATTN_TC=0`), else the one-pass kernel where
/// `onepass_for`, else the two-pass one. Measured on the H200 (attention_breakdown, session 19),
/// each kernel at its best split: group 8, 48 sequences x 2,000: 106 against 200 us (one-pass);
/// 64 x 1,024: 72 against 155; group 4, 64 x 1,024: 122 against 155; one sequence x 16k: 48
/// against 53; 1 x 870: 22 against 21.
pub fn decode_kernel_for(head_dim: usize, group: usize, n_tok: usize) -> DecodeKernel {
    let tc_from = tuning().attn_tc_min_tokens.unwrap_or(TC_MIN_DECODE_TOKENS);
    if tensor_fits(head_dim, group) && tuning().attn_tc && n_tok >= tc_from {
        DecodeKernel::Tensor
    } else if onepass_for(head_dim) {
        DecodeKernel::OnePass
    } else {
        DecodeKernel::TwoPass
    }
}

/// Fewest tokens of a decode launch that take the tensor-core kernel. Below it the one-pass
/// kernel was faster end to end: `bench --batch 1,2,4,8,16 --gen-tokens 100 --runs 2` on the
/// Qwen3-30B-A3B shape (Q4_K_M, compute_70 PTX, H200, one call each,
/// `DUSTOFF_ATTN_TC_MIN_TOKENS=32` against `=1`): 293 against 277 tok/s at 1 sequence, 455 / 445
/// at 2, 638 / 630 at 4, 813 / 825 at 8, 1,483 / 1,661 at 16; one stream on the Qwen3-8B shape
/// 282 against 277 (docs/BENCHMARKS.md Q9, M6). `DUSTOFF_ATTN_TC_MIN_TOKENS` moves it.
const TC_MIN_DECODE_TOKENS: usize = 8;

/// Shapes the tensor-core decode kernel serves: head size 64 or 128, at most 16 query heads
/// (the rows of its tiles) per KV head.
fn tensor_fits(head_dim: usize, group: usize) -> bool {
    matches!(head_dim, 64 | 128) && (1..=16).contains(&group)
}

/// The entry of a decode launch of `kernel` (as `DecodeKernel::resolve` gave it) for head size
/// `hd`, over the 8-bit cache when `q8` (its tensor-core twins keep loads raw until a tile is
/// staged, kernels/attention_decode_tc.cu: 2.2x faster on it, 3-5% slower on F16). The two-pass
/// kernel of another head size is the generic `attn_split_f16`.
pub(in crate::backend::cuda) fn decode_entry(kernel: DecodeKernel, hd: usize, q8: bool) -> &'static str {
    match (kernel, hd) {
        (DecodeKernel::Tensor, 64) if q8 => "attn_decode_tc_q8_hd64",
        (DecodeKernel::Tensor, _) if q8 => "attn_decode_tc_q8_hd128",
        (DecodeKernel::Tensor, 64) => "attn_decode_tc_hd64",
        (DecodeKernel::Tensor, _) => "attn_decode_tc_hd128",
        (DecodeKernel::OnePass, 64) => "attn_onepass_f16_hd64",
        (DecodeKernel::OnePass, 128) => "attn_onepass_f16_hd128",
        (DecodeKernel::OnePass, _) => "attn_onepass_f16_hd256",
        (DecodeKernel::TwoPass, 64) => "attn_split_f16_hd64",
        (DecodeKernel::TwoPass, 128) => "attn_split_f16_hd128",
        (DecodeKernel::TwoPass, _) => "attn_split_f16",
    }
}

impl DecodeKernel {
    /// The kernel a launch takes for `choice` (`decode_kernel_for` when `None`): a choice the
    /// shape does not allow falls back to the one-pass kernel, then to the two-pass one.
    pub fn resolve(choice: Option<DecodeKernel>, head_dim: usize, group: usize, n_tok: usize) -> DecodeKernel {
        let one = matches!(head_dim, 64 | 128 | 256);
        match choice.unwrap_or_else(|| decode_kernel_for(head_dim, group, n_tok)) {
            DecodeKernel::Tensor if tensor_fits(head_dim, group) => DecodeKernel::Tensor,
            DecodeKernel::Tensor | DecodeKernel::OnePass if one => DecodeKernel::OnePass,
            _ => DecodeKernel::TwoPass,
        }
    }
}

/// Blocks a tensor-core decode launch aims for: about one wave of an H200 (two 4-warp blocks
/// an SM at ~246 registers a thread). Measured on the H200 (attention_breakdown, session 19):
/// 1 to 64 sequences, contexts 870 to 16k, groups 4 and 8: the split nearest 256 blocks was the
/// fastest of 64..=1,024 or within 6% of it (48 x 2,000, group 8: 112 against 106 us).
const TC_TARGET_BLOCKS: usize = 256;

/// Warps of a tensor-core decode block (its `__launch_bounds__`).
const TC_WARPS: usize = 4;

/// Shared memory of a tensor-core decode block (kernels/attention_decode_tc.cu, `Adt`): Q hi
/// and lo `[16, hd + 8]` f16, then per warp K and V `[16, hd + 8]` f16 (S and P live in the K
/// area) and 32 floats of row state.
fn tc_smem(hd: usize) -> usize {
    let ld = hd + 8;
    2 * 16 * ld * 2 + TC_WARPS * (2 * 16 * ld * 2 + 32 * 4)
}

/// Positions per split of a decode step of `n_tok` tokens over sequences of at most `max_len`
/// positions (`n_heads` query heads over `n_kv` KV heads of `head_dim`), a power of two (graph
/// keys carry it) no shorter than `attn_split_len`. One-pass kernel: the split (64..=1,024)
/// whose block count is nearest `onepass_target_blocks` (ties: the longer). Two-pass kernel:
/// the shortest split unless the step already has `DECODE_TARGET_BLOCKS` blocks with longer
/// ones, short enough for its score array.
pub fn decode_split_len(n_tok: usize, max_len: usize, n_heads: usize, n_kv: usize, head_dim: usize) -> usize {
    let base = attn_split_len(n_tok);
    if tuning().attn_split.is_some() || n_kv == 0 {
        return base;
    }
    let group = (n_heads / n_kv).max(1);
    let kernel = decode_kernel_for(head_dim, group, n_tok);
    if kernel != DecodeKernel::TwoPass {
        // Blocks per (KV head, token, split): the one-pass kernel's head chunks; one for the
        // tensor cores (each of its blocks serves the whole group).
        let (per, target) = if kernel == DecodeKernel::Tensor {
            (1, TC_TARGET_BLOCKS)
        } else {
            (onepass_shape(group, head_dim, ATTN_THREADS).0, onepass_target_blocks(n_tok))
        };
        let units = (n_tok * n_kv * per).max(1) as f64;
        let target = target as f64;
        let off = |len: usize| ((units * max_len.max(1).div_ceil(len) as f64) / target).ln().abs();
        let mut best = base.max(64);
        let mut len = best;
        while len < DECODE_MAX_SPLIT {
            len *= 2;
            if off(len) <= off(best) {
                best = len;
            }
        }
        return best;
    }
    // Two-pass shared memory: (group * hd + group * split + warps * VCHUNK * hd) floats <= 48 KB.
    let fixed = group * head_dim + (ATTN_THREADS / 32) * ATTN_VCHUNK * head_dim;
    let fit = (12 * 1024usize).saturating_sub(fixed) / group;
    let most = if fit >= base { DECODE_MAX_SPLIT.min(1 << fit.ilog2()) } else { base };
    let want = DECODE_TARGET_BLOCKS.div_ceil((n_tok * n_kv).max(1)).max(1);
    max_len.div_ceil(want).next_power_of_two().clamp(base, most.max(base))
}
const ATTN_MAX_GROUP: usize = 16;
const ATTN_MAX_HD: usize = 256;
const ATTN_VCHUNK: usize = 4;
const ATTN_THREADS: usize = 128;

/// Most query heads of a one-pass decode block (kernels/attention_decode.cu): a larger group
/// takes `ceil(group / 4)` blocks of equal head counts.
const ATTN_ONEPASS_MAX_HEADS: usize = 4;

/// (blocks per KV head, query heads per block, shared-memory bytes) of the one-pass decode
/// kernel for `group` query heads per KV head of `hd` and `threads` per block: q
/// `[heads, lanes per position, dims per lane + 4]` + per warp `[heads, hd + 2]` floats.
pub fn onepass_shape(group: usize, hd: usize, threads: usize) -> (usize, usize, usize) {
    let chunks = group.div_ceil(ATTN_ONEPASS_MAX_HEADS).max(1);
    let heads = group.div_ceil(chunks);
    let dl = if hd >= 128 { 16 } else { 8 };
    (chunks, heads, (heads * (hd / dl) * (dl + 4) + (threads / 32) * heads * (hd + 2)) * 4)
}

/// Splits needed for sequences of at most `max_len` positions, `n_tok` query tokens, at the
/// shortest split: an upper bound of every step's decode splits.
pub fn attn_splits(max_len: usize, n_tok: usize) -> usize {
    max_len.div_ceil(attn_split_len(n_tok)).max(1)
}

/// Split attention of every token of `paged` (one-token chunks: decode). Scratch `part_o`
/// `[n_tok, n_heads, n_parts, head_dim]`, `part_ml` `[n_tok, n_heads, n_parts, 2]`: partials
/// `0..n_splits` are the splits of `split_len` positions (`n_splits * split_len >= max_len`;
/// more is allowed: the extra blocks mark their partial empty, so a captured graph can serve
/// growing lengths), the partials past them belong to `prefix`. The host guarantees
/// `pos[t] < max_len`.
pub struct Attention {
    pub paged: PagedAttn,
    pub part_o: Dev<f32>,
    pub part_ml: Dev<f32>,
    pub max_len: usize,
    pub n_splits: usize,
    pub split_len: usize,
    /// The kernel (`decode_kernel_for` when `None`); a choice the shape does not allow falls
    /// back as `DecodeKernel::resolve` says.
    pub kernel: Option<DecodeKernel>,
    pub prefix: Option<SharedPrefix>,
}

/// Shared-prefix (cascade) attention inside a decode step: the members of each group attend
/// positions `kv_begin[t]..=pos[t]` in the split kernel, and `attn` (split mode, no merge of
/// its own, partials after the decode splits) covers positions `0..kv_begin[t]` once per group of
/// up to 16 members. Tokens outside any group have `kv_begin` 0.
pub struct SharedPrefix {
    pub kv_begin: Dev<i32>,
    pub attn: super::prefill::PrefillAttention,
}

impl Attention {
    /// Partials per (token, head) of the partial buffers.
    pub fn n_parts(&self) -> usize {
        self.n_splits + self.prefix.as_ref().and_then(|p| p.attn.split.as_ref()).map_or(0, |s| s.n_splits)
    }

    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "attn_split_f16";
        let a = &self.paged;
        let (hd, nh) = (a.head_dim, a.n_heads);
        check(K, a.n_kv > 0 && nh.is_multiple_of(a.n_kv), || format!("{nh} heads over {} KV heads", a.n_kv))?;
        let group = nh / a.n_kv;
        check(K, group <= ATTN_MAX_GROUP, || format!("{group} query heads per KV head (at most {ATTN_MAX_GROUP})"))?;
        check(K, hd.is_multiple_of(2) && hd <= ATTN_MAX_HD, || {
            format!("head size {hd} (even, at most {ATTN_MAX_HD})")
        })?;
        grid_yz(K, a.n_tok, "query tokens")?;
        let (splits, split_len) = (self.n_splits, self.split_len);
        check(K, splits >= 1 && split_len >= 1 && splits * split_len >= self.max_len, || {
            format!("{splits} splits of {split_len} positions do not cover {}", self.max_len)
        })?;
        let (k_scale, v_scale) = a.check(K)?;
        check(K, a.bt_stride * a.block_size >= self.max_len, || {
            "block tables shorter than the longest sequence".into()
        })?;
        let parts = self.n_parts();
        need(K, "partial outputs", self.part_o, a.n_tok * nh * parts * hd)?;
        need(K, "partial statistics", self.part_ml, a.n_tok * nh * parts * 2)?;
        if let Some(pre) = &self.prefix {
            need(K, "prefix starts", pre.kv_begin, a.n_tok)?;
            let sp = pre.attn.split.as_ref();
            check(
                K,
                sp.is_some_and(|sp| !sp.merge && sp.part0 == splits && sp.n_parts == parts && sp.tok0 == 0),
                || "the shared-prefix pass must write the partials after the decode splits, unmerged".into(),
            )?;
        }
        if a.n_tok == 0 {
            return Ok(());
        }
        let p = AttnParams {
            q: a.q.ptr,
            k_cache: a.k_cache.ptr,
            v_cache: a.v_cache.ptr,
            k_scale,
            v_scale,
            block_tables: a.block_tables.ptr,
            tok_seq: a.tok_seq.ptr,
            pos: a.pos.ptr,
            kv_begin: self.prefix.as_ref().map_or(0, |p| p.kv_begin.ptr),
            part_o: self.part_o.ptr,
            part_ml: self.part_ml.ptr,
            out: a.out.ptr,
            n_tok: a.n_tok as i32,
            n_heads: i32_of(K, nh)?,
            n_kv: i32_of(K, a.n_kv)?,
            head_dim: i32_of(K, hd)?,
            block_size: i32_of(K, a.block_size)?,
            bt_stride: i32_of(K, a.bt_stride)?,
            q_stride: i32_of(K, a.q_stride)?,
            out_stride: i32_of(K, a.out_stride)?,
            n_splits: i32_of(K, parts)?,
            split_len: i32_of(K, split_len)?,
            scale: 1.0 / (hd as f32).sqrt(),
            block_shift: a.block_size.trailing_zeros() as i32,
            fast_exp: i32::from(tuning().attn_fast_exp),
        };
        let t = tuning();
        let kernel = DecodeKernel::resolve(self.kernel, hd, group, a.n_tok);
        let mut smem = (group * hd + group * split_len + (ATTN_THREADS / 32) * ATTN_VCHUNK * hd) * 4;
        let mut grid = (a.n_kv as u32, a.n_tok as u32, i32_of(K, splits)? as u32);
        let mut threads = ATTN_THREADS;
        let entry = decode_entry(kernel, hd, k_scale != 0);
        match kernel {
            DecodeKernel::Tensor => {
                threads = TC_WARPS * 32;
                smem = tc_smem(hd);
            }
            DecodeKernel::OnePass => {
                // `DUSTOFF_ATTN_WARPS` (1..=16) sets the warps of a block (for comparisons).
                threads = t.attn_warps.map_or(ATTN_THREADS, |w| w * 32);
                let (chunks, _, bytes) = onepass_shape(group, hd, threads);
                grid.0 = i32_of(K, a.n_kv * chunks)? as u32;
                smem = bytes;
            }
            DecodeKernel::TwoPass => {}
        }
        check(K, smem <= 48 * 1024, || {
            format!("{smem} bytes of shared memory ({group} heads per KV head, splits of {split_len})")
        })?;
        launch(k, s, entry, grid, threads as u32, smem as u32, &p)?;
        if let Some(pre) = &self.prefix {
            pre.attn.launch(k, s)?;
        }
        Merge {
            part_o: self.part_o,
            part_ml: self.part_ml,
            out: a.out,
            n_tok: a.n_tok,
            n_heads: nh,
            head_dim: hd,
            n_parts: parts,
            out_stride: a.out_stride,
        }
        .launch(k, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_splits_follow_context_and_sequences() {
        // Qwen3-8B: 32 query heads over 8 KV heads of 128 (from 8 sequences the tensor-core
        // kernel: about 256 blocks, one block per KV head, token and split).
        let q3 = |n, len| decode_split_len(n, len, 32, 8, 128);
        // One sequence (the one-pass kernel, about 256 blocks too): 32 splits of 512 at 16k, 33
        // of 256 at 8k; a short one: the shortest.
        assert_eq!(q3(1, 16384), 512);
        assert_eq!(q3(1, 8193), 256);
        assert_eq!(q3(1, 900), 64);
        // 8 sequences at 870: 4 splits of 256 (256 blocks).
        assert_eq!(q3(8, 871), 256);
        // 32 at 1,300 (512 blocks with 2 splits) and 64 at 1k: the longest split.
        assert_eq!(q3(32, 1301), 1024);
        assert_eq!(q3(64, 1024), 1024);
        assert_eq!(q3(64, 8192), 1024);
        // Fewer KV heads: more splits for the same sequences.
        assert!(decode_split_len(8, 4096, 16, 2, 128) < q3(8, 4096));
        // Qwen3-30B-A3B (32 over 4, groups of 8): on the tensor cores half the blocks of
        // Qwen3-8B per split; one stream on the one-pass kernel takes two blocks per KV head
        // (4 heads each), the same as Qwen3-8B.
        assert_eq!(decode_split_len(8, 2049, 32, 4, 128), decode_split_len(8, 2049, 32, 8, 128) / 2);
        assert_eq!(decode_split_len(1, 8193, 32, 4, 128), 256);
        // Head size 256 (Qwen3.5 full attention): the one-pass kernel's rule.
        assert_eq!(decode_split_len(1, 8193, 16, 2, 256), 128);
        // Head size 80 (the two-pass kernel): the score array caps the split.
        assert_eq!(decode_split_len(1, 16384, 32, 8, 80), 128);
        for (n, len) in [(1, 1), (3, 70_000), (17, 5000), (64, 100), (8, 30_000)] {
            for (nh, nkv, hd) in [(32, 8, 128), (9, 3, 64), (16, 2, 256), (32, 2, 256), (8, 2, 80)] {
                let l = decode_split_len(n, len, nh, nkv, hd);
                assert!(l.is_power_of_two() && l >= attn_split_len(n) && len.div_ceil(l) <= attn_splits(len, n));
                let group = nh / nkv;
                if onepass_for(hd) {
                    assert!(l <= DECODE_MAX_SPLIT && onepass_shape(group, hd, ATTN_THREADS).2 <= 48 * 1024);
                } else {
                    assert!((group * hd + group * l + 16 * hd) * 4 <= 48 * 1024 || l == attn_split_len(n));
                }
            }
        }
    }

    #[test]
    fn tensor_kernel_fits_its_shared_memory_and_falls_back() {
        assert!(tc_smem(128) <= 48 * 1024 && tc_smem(64) < tc_smem(128));
        use DecodeKernel::*;
        assert_eq!(DecodeKernel::resolve(Some(Tensor), 128, 8, 8), Tensor);
        assert_eq!(DecodeKernel::resolve(Some(Tensor), 256, 8, 8), OnePass);
        assert_eq!(DecodeKernel::resolve(Some(Tensor), 128, 17, 8), OnePass);
        assert_eq!(DecodeKernel::resolve(Some(Tensor), 80, 4, 8), TwoPass);
        assert_eq!(DecodeKernel::resolve(Some(OnePass), 96, 4, 8), TwoPass);
    }

    #[test]
    fn onepass_blocks_split_groups_evenly() {
        // (blocks per KV head, heads per block): groups up to 4 in one block, 7 in 4 + 3,
        // 8 in 2 x 4, 16 in 4 x 4.
        let shape = |g, hd| {
            let (chunks, heads, _) = onepass_shape(g, hd, ATTN_THREADS);
            (chunks, heads)
        };
        assert_eq!(shape(3, 64), (1, 3));
        assert_eq!(shape(4, 128), (1, 4));
        assert_eq!(shape(7, 128), (2, 4));
        assert_eq!(shape(8, 256), (2, 4));
        assert_eq!(shape(16, 128), (4, 4));
    }
}
