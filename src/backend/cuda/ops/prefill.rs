//! Launcher of the tensor-core prefill attention (kernels/attention_prefill.cu): tiles of up to
//! 16 query rows that share one block table (the tokens of a prefill chunk, or the members of a
//! shared-prefix group); a block serves one tile, a few query heads of one KV head and one split
//! of the tile's K/V range, so each K/V row is read once per tile instead of once per token and a
//! long prompt fills the GPU. Several splits write partials that `attn_merge_f32` combines.
//! Same conventions as `launch`.

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::tuning::tuning;
use super::super::CudaError;
use super::attention_merge::Merge;
use super::launch::{check, i32_of, launch, need, Dev};
use super::paged_attn::PagedAttn;

/// Query tokens per tile (one wmma row tile).
pub const TILE_TOKENS: usize = 16;
/// Positions per K/V tile (kernels/attention_prefill.cu ATP_KT); splits are multiples of it.
const KT: usize = 32;
/// Fewest blocks a prefill launch should have (about one wave of an H200's 132 SMs, two of a
/// V100's 80): below, the tiles are split along the context. Above, splitting measured slower
/// on the H200 (a 512-token chunk after 8,192 positions, 256 blocks: one split 1,131 us, 8
/// splits 1,279 us a layer): the kernel is bound by its own tensor-core loop, not by idle SMs.
const TARGET_BLOCKS: usize = 160;
/// Shortest split of a long step (shorter ones cost more in partials than they balance).
const MIN_SPLIT: usize = 256;
/// Split length of graph-sized steps (fixed, so a captured graph serves every context length
/// its split count covers).
pub const GRAPH_SPLIT: usize = 512;
/// Most bytes of prefill partials (O and statistics) a step may use.
const PART_BUDGET: usize = 256 << 20;

/// Whether the prefill kernel serves this attention shape (else every token takes the split
/// decode kernel): head size 64, 128 or 256, whole query-head groups.
pub fn prefill_supported(n_heads: usize, n_kv: usize, head_dim: usize) -> bool {
    n_kv > 0 && n_heads >= n_kv && n_heads.is_multiple_of(n_kv) && matches!(head_dim, 64 | 128 | 256)
}

/// Query heads of one block (one warp each): the largest divisor of the group up to 8 (4 for
/// head size 256, whose Q tile lives in shared memory).
pub fn heads_per_block(group: usize, head_dim: usize) -> usize {
    let cap = if head_dim > 128 { 4 } else { 8 };
    (1..=cap.min(group)).rev().find(|d| group.is_multiple_of(*d)).unwrap_or(1)
}

/// Appends the tiles of a chunk of `len` tokens starting at flat token `first` and position
/// `start_pos`, block-table row `bt_row`: `[first row, count, kv_end, bt_row]` per tile of at
/// most `TILE_TOKENS` tokens, the rows (flat tokens) to `rows`.
pub fn push_tiles(
    tiles: &mut Vec<i32>,
    rows: &mut Vec<i32>,
    first: usize,
    len: usize,
    start_pos: usize,
    bt_row: usize,
) {
    for t in (0..len).step_by(TILE_TOKENS) {
        let n = TILE_TOKENS.min(len - t);
        push_tile(tiles, rows, first + t..first + t + n, start_pos + t + n, bt_row);
    }
}

/// Appends one tile of at most `TILE_TOKENS` flat tokens that attend positions `0..kv_end` of
/// block-table row `bt_row`.
pub fn push_tile(
    tiles: &mut Vec<i32>,
    rows: &mut Vec<i32>,
    tokens: impl Iterator<Item = usize>,
    kv_end: usize,
    bt_row: usize,
) {
    let first = rows.len();
    rows.extend(tokens.map(|t| t as i32));
    debug_assert!((1..=TILE_TOKENS).contains(&(rows.len() - first)), "a tile holds 1..=16 rows");
    tiles.extend([first as i32, (rows.len() - first) as i32, kv_end as i32, bt_row as i32]);
}

/// Shared memory of one block (kernels/attention_prefill.cu AtpLayout; `qs`: the Q tile in
/// shared memory, always for head size 256).
fn smem_bytes(head_dim: usize, heads: usize, qs: bool) -> usize {
    let map = 16 * 16 * 4;
    let kv = KT * (head_dim + 16) * 2;
    let q = if qs || head_dim > 128 { 16 * (head_dim + 8) * 2 } else { 0 };
    let per_warp = 16 * (KT + 4) * 4 + 16 * (KT + 16) * 2 + 2 * 16 * 4 + q;
    map + 2 * kv + heads * per_warp
}

/// The kernel entry and its shared memory for head size `hd` and `heads` warps on `arch`
/// (`compute_XY`): from compute capability 8.0 on, the softmax on the accumulators (`_acc`, its
/// fragment layout is that of sm_80 and newer; `DUSTOFF_PREFILL_ACC=0` turns it off); else the
/// Q tile in registers, or with `DUSTOFF_PREFILL_QS=1` (head sizes 64 / 128, at most 4 heads)
/// in shared memory. The second has 168 registers against 255 (three blocks an SM instead of
/// two on an H200, one on a V100 for its 52 KB), but measured 8-17% slower on the H200 (a
/// 512-token chunk after 8,192 positions: 1,067 against 982 us a layer; docs/BENCHMARKS.md,
/// session 4). `q8` (the cache has scales): the `_q8` twin of the entry, which converts a
/// prefetched K/V tile when it is staged instead of at the load.
pub(in crate::backend::cuda) fn choose_entry(
    hd: usize,
    heads: usize,
    arch: &str,
    acc: Option<bool>,
    q8: bool,
) -> (&'static str, usize) {
    let t = tuning();
    // (entry, its 8-bit twin, Q tile in shared memory)
    let (f16, q8_entry, qs) = if acc.unwrap_or(t.prefill_acc) && acc_layout(arch) {
        match hd {
            64 => ("attn_prefill_hd64_acc", "attn_prefill_hd64_acc_q8", false),
            128 => ("attn_prefill_hd128_acc", "attn_prefill_hd128_acc_q8", false),
            _ => ("attn_prefill_hd256_acc", "attn_prefill_hd256_acc_q8", true),
        }
    } else {
        match (hd, t.prefill_qs && heads <= 4) {
            (64, false) => ("attn_prefill_hd64", "attn_prefill_hd64_q8", false),
            (64, true) => ("attn_prefill_hd64_qs", "attn_prefill_hd64_qs_q8", true),
            (128, false) => ("attn_prefill_hd128", "attn_prefill_hd128_q8", false),
            (128, true) => ("attn_prefill_hd128_qs", "attn_prefill_hd128_qs_q8", true),
            _ => ("attn_prefill_hd256", "attn_prefill_hd256_q8", true),
        }
    };
    (if q8 { q8_entry } else { f16 }, smem_bytes(hd, heads, qs))
}

/// Whether the kernels of `k` can take the softmax on the accumulators (the `_acc` entries).
pub fn acc_available(k: &Kernels) -> bool {
    acc_layout(k.arch())
}

/// Whether `arch` (`compute_XY`) has the wmma accumulator layout of two m16n8 tiles that the
/// `_acc` entries assume (compute capability 8.0 and newer; they check it and trap otherwise).
fn acc_layout(arch: &str) -> bool {
    arch.strip_prefix("compute_").and_then(|v| v.parse::<u32>().ok()).is_some_and(|v| v >= 80)
}

/// Above 48 KB of dynamic shared memory a kernel must opt in (sm_70 allows 96 KB per block).
fn allow_smem(f: &cudarc::driver::CudaFunction, entry: &str, smem: usize) -> Result<(), CudaError> {
    if smem > 48 * 1024 {
        f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .map_err(CudaError::driver(format!("allowing {smem} bytes of shared memory for {entry}")))?;
    }
    Ok(())
}

/// (splits, positions per split) of the prefill attention over `n_tiles` tiles reaching at most
/// `max_end` positions, `n_tok` tokens: one split (direct output) when the tiles alone fill the
/// GPU or the context is short; else enough splits for `TARGET_BLOCKS` blocks, no shorter than
/// `MIN_SPLIT`, within `PART_BUDGET`. Graph-sized steps use `GRAPH_SPLIT` and a power-of-two
/// count (part of the graph key).
pub fn prefill_splits(
    n_tiles: usize,
    n_tok: usize,
    max_end: usize,
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
    graph: bool,
) -> (usize, usize) {
    if n_tiles == 0 || max_end == 0 || n_kv == 0 {
        return (1, GRAPH_SPLIT);
    }
    if graph {
        return (max_end.div_ceil(GRAPH_SPLIT).next_power_of_two(), GRAPH_SPLIT);
    }
    let group = n_heads / n_kv;
    let blocks = n_tiles * n_kv * (group / heads_per_block(group, head_dim)).max(1);
    let want = TARGET_BLOCKS.div_ceil(blocks).clamp(1, 64);
    let mut split = max_end.div_ceil(want).div_ceil(KT).max(1) * KT;
    split = split.max(MIN_SPLIT);
    while max_end.div_ceil(split) > 1 && n_tok * n_heads * max_end.div_ceil(split) * (head_dim + 2) * 4 > PART_BUDGET {
        split *= 2;
    }
    (max_end.div_ceil(split), split)
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PrefillParams {
    q: u64,
    k_cache: u64,
    v_cache: u64,
    k_scale: u64,
    v_scale: u64,
    block_tables: u64,
    pos: u64,
    tiles: u64,
    rows: u64,
    out: u64,
    part_o: u64,
    part_ml: u64,
    n_heads: i32,
    n_kv: i32,
    block_size: i32,
    bt_stride: i32,
    q_stride: i32,
    out_stride: i32,
    scale: f32,
    block_shift: i32,
    heads: i32,
    split_len: i32,
    n_parts: i32,
    part0: i32,
    part_tok0: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (trailing padding included).
unsafe impl DeviceRepr for PrefillParams {}

/// Split mode of a prefill launch: split z of a tile writes partial `part0 + z` of each
/// of its rows' (token, head) pairs in `part_o` `[n_part_tok, n_heads, n_parts, head_dim]` /
/// `part_ml` `[n_part_tok, n_heads, n_parts, 2]`, token t at partial row `t - tok0`. With
/// `merge`, the launch then merges every partial of tokens `tok0..tok0 + n_part_tok` into the
/// output (the host guarantees that each of them is a row of exactly one tile and that no
/// other kernel owns their partials); without, the caller merges (shared-prefix groups).
#[derive(Clone, Copy, Debug)]
pub struct PrefillSplit {
    pub part_o: Dev<f32>,
    pub part_ml: Dev<f32>,
    pub split_len: usize,
    pub n_splits: usize,
    pub n_parts: usize,
    pub part0: usize,
    pub tok0: usize,
    pub n_part_tok: usize,
    pub merge: bool,
}

/// Attention of the rows named by `tiles` (`[n_tiles, 4]`: first row in `rows`, count 1..=16,
/// K/V range end, block-table row; `rows` `[n_rows]` flat tokens of `paged`); tokens outside the
/// tiles are left as they are. Each row attends positions `0..min(kv_end, pos + 1)` of its
/// tile's block table. The host guarantees `kv_end <= bt_stride * block_size`, covered by the
/// block table's entries, row tokens `< paged.n_tok` and table rows `< paged.n_seqs`.
/// `split: None`: one split, normalized straight into the output.
pub struct PrefillAttention {
    pub paged: PagedAttn,
    pub tiles: Dev<i32>,
    pub rows: Dev<i32>,
    pub n_rows: usize,
    pub n_tiles: usize,
    pub split: Option<PrefillSplit>,
}

impl PrefillAttention {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        self.launch_kernel(k, s, None)
    }

    /// `launch` with the kernel family chosen by the caller (tests and benchmarks compare both
    /// in one process): `Some(true)` the softmax on the accumulators where `acc_available`,
    /// `Some(false)` through shared memory, `None` the default (`DUSTOFF_PREFILL_ACC`).
    pub fn launch_kernel(&self, k: &mut Kernels, s: &CudaStream, acc: Option<bool>) -> Result<(), CudaError> {
        const K: &str = "attn_prefill";
        let a = &self.paged;
        let (hd, nh, nkv) = (a.head_dim, a.n_heads, a.n_kv);
        check(K, prefill_supported(nh, nkv, hd), || {
            format!("{nh} heads over {nkv} KV heads of size {hd} (head size 64, 128 or 256)")
        })?;
        let (k_scale, v_scale) = a.check(K)?;
        need(K, "tiles", self.tiles, 4 * self.n_tiles)?;
        need(K, "tile rows", self.rows, self.n_rows)?;
        check(K, self.n_rows <= 16 * self.n_tiles, || format!("{} rows in {} tiles", self.n_rows, self.n_tiles))?;
        if self.n_tiles == 0 {
            return Ok(());
        }
        let group = nh / nkv;
        let heads = heads_per_block(group, hd);
        let (mut part_o, mut part_ml) = (0, 0);
        let (mut split_len, mut n_splits, mut n_parts, mut part0, mut tok0) = (1 << 30, 1, 1, 0, 0);
        if let Some(sp) = &self.split {
            check(K, sp.split_len > 0 && sp.split_len.is_multiple_of(KT), || {
                format!("split of {} positions (a multiple of {KT})", sp.split_len)
            })?;
            check(K, sp.n_splits >= 1 && sp.part0 + sp.n_splits <= sp.n_parts, || {
                format!("splits {}..{} beyond {} partials", sp.part0, sp.part0 + sp.n_splits, sp.n_parts)
            })?;
            check(K, sp.tok0 + sp.n_part_tok <= a.n_tok, || "partial rows beyond the tokens".into())?;
            need(K, "partial outputs", sp.part_o, sp.n_part_tok * nh * sp.n_parts * hd)?;
            need(K, "partial statistics", sp.part_ml, sp.n_part_tok * nh * sp.n_parts * 2)?;
            (part_o, part_ml) = (sp.part_o.ptr, sp.part_ml.ptr);
            (split_len, n_splits, n_parts, part0, tok0) = (sp.split_len, sp.n_splits, sp.n_parts, sp.part0, sp.tok0);
        }
        let p = PrefillParams {
            q: a.q.ptr,
            k_cache: a.k_cache.ptr,
            v_cache: a.v_cache.ptr,
            k_scale,
            v_scale,
            block_tables: a.block_tables.ptr,
            pos: a.pos.ptr,
            tiles: self.tiles.ptr,
            rows: self.rows.ptr,
            out: a.out.ptr,
            part_o,
            part_ml,
            n_heads: i32_of(K, nh)?,
            n_kv: i32_of(K, nkv)?,
            block_size: i32_of(K, a.block_size)?,
            bt_stride: i32_of(K, a.bt_stride)?,
            q_stride: i32_of(K, a.q_stride)?,
            out_stride: i32_of(K, a.out_stride)?,
            scale: 1.0 / (hd as f32).sqrt(),
            block_shift: a.block_size.trailing_zeros() as i32,
            heads: heads as i32,
            split_len: i32_of(K, split_len)?,
            n_parts: i32_of(K, n_parts)?,
            part0: i32_of(K, part0)?,
            part_tok0: i32_of(K, tok0)?,
        };
        let (entry, smem) = choose_entry(hd, heads, k.arch(), acc, k_scale != 0);
        allow_smem(k.get(entry)?, entry, smem)?;
        let grid = (i32_of(K, self.n_tiles)? as u32, (nkv * group / heads) as u32, i32_of(K, n_splits)? as u32);
        launch(k, s, entry, grid, (heads * 32) as u32, smem as u32, &p)?;
        match &self.split {
            Some(sp) if sp.merge => Merge {
                part_o: sp.part_o,
                part_ml: sp.part_ml,
                out: a.out.offset(sp.tok0 * a.out_stride),
                n_tok: sp.n_part_tok,
                n_heads: nh,
                head_dim: hd,
                n_parts: sp.n_parts,
                out_stride: a.out_stride,
            }
            .launch(k, s),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_each_chunk_in_sixteens() {
        let (mut t, mut r) = (Vec::new(), Vec::new());
        push_tiles(&mut t, &mut r, 3, 37, 100, 0);
        push_tiles(&mut t, &mut r, 40, 16, 0, 1);
        push_tiles(&mut t, &mut r, 56, 1, 7, 2);
        let want = [0, 16, 116, 0, 16, 16, 132, 0, 32, 5, 137, 0, 37, 16, 16, 1, 53, 1, 8, 2];
        assert_eq!(t, want);
        assert_eq!(r, (3..57).collect::<Vec<i32>>());
    }

    #[test]
    fn supported_shapes_and_shared_memory_within_96k() {
        assert!(prefill_supported(32, 8, 128)); // Qwen3-8B / Llama-3-8B
        assert!(prefill_supported(28, 4, 128)); // Qwen2.5-7B (group 7)
        assert!(prefill_supported(9, 3, 64)); // SmolLM2-135M
        assert!(prefill_supported(64, 8, 128)); // group 8
        assert!(prefill_supported(16, 2, 256)); // Qwen3-Next / Qwen3.5 full attention
        assert!(!prefill_supported(32, 8, 96));
        assert_eq!(heads_per_block(7, 128), 7);
        assert_eq!(heads_per_block(16, 128), 8);
        assert_eq!(heads_per_block(8, 256), 4);
        assert_eq!(heads_per_block(6, 256), 3);
        for (hd, heads) in [(64, 8), (128, 8), (128, 7), (256, 4)] {
            assert!(
                smem_bytes(hd, heads, false) <= 96 * 1024 && smem_bytes(hd, heads.min(4), true) <= 96 * 1024,
                "head size {hd}, {heads} heads"
            );
        }
        // Qwen3-8B (4 heads a block) needs no opt-in above 48 KB; 8-head blocks do (51 KB), and
        // so does the Q tile in shared memory (52 KB: three blocks an SM on an H200, one on a V100).
        assert!(smem_bytes(128, 4, false) <= 48 * 1024);
        assert!(smem_bytes(128, 4, true) > 48 * 1024 && 3 * smem_bytes(128, 4, true) <= 227 * 1024);
    }

    #[test]
    fn every_chosen_entry_is_compiled_and_the_8bit_twin_shares_its_shape() {
        use crate::backend::cuda::compile::kernels::file_of;
        for arch in ["compute_70", "compute_90"] {
            for (hd, heads) in [(64, 8), (128, 4), (128, 8), (256, 4)] {
                for acc in [Some(false), Some(true)] {
                    let (f16, smem) = choose_entry(hd, heads, arch, acc, false);
                    let (q8, smem8) = choose_entry(hd, heads, arch, acc, true);
                    assert_eq!(q8, format!("{f16}_q8"), "{arch} hd {hd}");
                    assert_eq!(smem, smem8, "{q8}: same layout as {f16}");
                    for e in [f16, q8] {
                        assert_eq!(file_of(e).map(|f| f.name), Some("attention_prefill"), "{e}");
                    }
                }
            }
        }
    }

    #[test]
    fn accumulator_softmax_only_from_compute_8_0() {
        assert!(!acc_layout("compute_70") && !acc_layout("compute_75"));
        assert!(acc_layout("compute_80") && acc_layout("compute_90") && acc_layout("compute_120"));
        assert!(!acc_layout("sm_90") && !acc_layout("compute_"));
    }

    #[test]
    fn splits_follow_the_context_and_the_tiles() {
        // One 512-token chunk of Qwen3-8B (32 tiles x 8 KV heads) fills the GPU: one split.
        assert_eq!(prefill_splits(32, 512, 8192, 32, 8, 128, false).0, 1);
        // The Qwen3.5 shape (16 heads over 4 of 256: 32 x 4 blocks) at 8,192: two splits.
        assert_eq!(prefill_splits(32, 512, 8192, 16, 4, 256, false), (2, 4096));
        // One 16-token tile after 8,000 positions: 8 blocks, split 20 ways.
        let (n, len) = prefill_splits(1, 16, 8016, 32, 8, 128, false);
        assert_eq!((n, len), (20, 416));
        // Short contexts keep one split (direct output).
        assert_eq!(prefill_splits(48, 768, 256, 32, 8, 128, false).0, 1);
        // Many tiles already fill the GPU.
        assert_eq!(prefill_splits(128, 2048, 2048, 32, 8, 128, false).0, 1);
        // The partial budget caps a large step's splits (Qwen3.5 shape, 2 KV heads).
        let (n, _) = prefill_splits(20, 320, 32768, 16, 2, 256, false);
        assert!(n > 1 && 320 * 16 * n * 258 * 4 <= PART_BUDGET, "{n} splits");
        // Graph-sized steps: a power of two of fixed splits.
        assert_eq!(prefill_splits(1, 16, 1100, 32, 8, 128, true), (4, GRAPH_SPLIT));
        // Every split count covers the range.
        for end in [1, 31, 32, 500, 4097, 16384] {
            let (n, len) = prefill_splits(4, 64, end, 16, 2, 256, false);
            assert!(n * len >= end && (n - 1) * len < end, "{end}: {n} x {len}");
            assert!(len.is_multiple_of(KT));
        }
    }
}
