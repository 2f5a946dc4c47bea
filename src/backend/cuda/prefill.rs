//! Launcher of the tensor-core prefill attention (kernels/attention_prefill.cu): chunks of
//! several query tokens of one sequence, cut into tiles of up to 16 tokens; a block serves one
//! tile and one KV head, so each K/V row is read once per tile instead of once per token.
//! Same conventions as `launch`.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::attention::PagedAttn;
use super::kernels::Kernels;
use super::launch::{check, i32_of, launch, need, Dev};
use super::CudaError;

/// Query tokens per tile (one wmma row tile).
pub const TILE_TOKENS: usize = 16;
/// Most query heads per KV head the kernel takes (one warp each; kernels/attention_prefill.cu).
const MAX_GROUP: usize = 7;
/// Positions per K/V tile (kernels/attention_prefill.cu ATP_KT).
const KT: usize = 32;

/// Whether the prefill kernel serves this attention shape (else every token takes the split
/// decode kernel): head size 64 or 128, 1..=7 query heads per KV head.
pub fn prefill_supported(n_heads: usize, n_kv: usize, head_dim: usize) -> bool {
    n_kv > 0
        && n_heads.is_multiple_of(n_kv)
        && (1..=MAX_GROUP).contains(&(n_heads / n_kv))
        && matches!(head_dim, 64 | 128)
}

/// Appends the tiles of a chunk of `len` tokens starting at flat token `first`: `[first token,
/// count]` pairs of at most `TILE_TOKENS` tokens.
pub fn push_tiles(tiles: &mut Vec<i32>, first: usize, len: usize) {
    for t in (0..len).step_by(TILE_TOKENS) {
        tiles.push((first + t) as i32);
        tiles.push(TILE_TOKENS.min(len - t) as i32);
    }
}

/// Shared memory of one block (kernels/attention_prefill.cu AtpLayout).
fn smem_bytes(head_dim: usize, group: usize) -> usize {
    let map = 16 * 16 * 4;
    let kv = KT * (head_dim + 16) * 2;
    let per_warp = 16 * (KT + 4) * 4 + 16 * (KT + 16) * 2 + 2 * 16 * 4;
    map + 2 * kv + group * per_warp
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PrefillParams {
    q: u64,
    k_cache: u64,
    v_cache: u64,
    block_tables: u64,
    tok_seq: u64,
    pos: u64,
    tiles: u64,
    out: u64,
    n_heads: i32,
    n_kv: i32,
    block_size: i32,
    bt_stride: i32,
    q_stride: i32,
    out_stride: i32,
    scale: f32,
    block_shift: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (trailing padding included).
unsafe impl DeviceRepr for PrefillParams {}

/// Attention of the tokens of `paged` named by `tiles` (`[n_tiles, 2]`: first token, count
/// 1..=16; a tile's tokens share one sequence); tokens outside the tiles are left as they are.
/// The host guarantees each tile's positions are covered by its block table and
/// `pos[t] < bt_stride * block_size`.
pub struct PrefillAttention {
    pub paged: PagedAttn,
    pub tiles: Dev<i32>,
    pub n_tiles: usize,
}

impl PrefillAttention {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "attn_prefill";
        let a = &self.paged;
        let (hd, nh, nkv) = (a.head_dim, a.n_heads, a.n_kv);
        check(K, prefill_supported(nh, nkv, hd), || {
            format!("{nh} heads over {nkv} KV heads of size {hd} (head size 64 or 128, at most {MAX_GROUP} heads per KV head)")
        })?;
        a.check(K)?;
        need(K, "tiles", self.tiles, 2 * self.n_tiles)?;
        if self.n_tiles == 0 {
            return Ok(());
        }
        let group = nh / nkv;
        let p = PrefillParams {
            q: a.q.ptr,
            k_cache: a.k_cache.ptr,
            v_cache: a.v_cache.ptr,
            block_tables: a.block_tables.ptr,
            tok_seq: a.tok_seq.ptr,
            pos: a.pos.ptr,
            tiles: self.tiles.ptr,
            out: a.out.ptr,
            n_heads: i32_of(K, nh)?,
            n_kv: i32_of(K, nkv)?,
            block_size: i32_of(K, a.block_size)?,
            bt_stride: i32_of(K, a.bt_stride)?,
            q_stride: i32_of(K, a.q_stride)?,
            out_stride: i32_of(K, a.out_stride)?,
            scale: 1.0 / (hd as f32).sqrt(),
            block_shift: a.block_size.trailing_zeros() as i32,
        };
        let entry = if hd == 64 { "attn_prefill_hd64" } else { "attn_prefill_hd128" };
        let grid = (i32_of(K, self.n_tiles)? as u32, nkv as u32, 1);
        launch(k, s, entry, grid, (group * 32) as u32, smem_bytes(hd, group) as u32, &p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_each_chunk_in_sixteens() {
        let mut t = Vec::new();
        push_tiles(&mut t, 3, 37);
        push_tiles(&mut t, 40, 16);
        push_tiles(&mut t, 56, 1);
        assert_eq!(t, vec![3, 16, 19, 16, 35, 5, 40, 16, 56, 1]);
    }

    #[test]
    fn supported_shapes_and_shared_memory_under_48k() {
        assert!(prefill_supported(32, 8, 128)); // Qwen3-8B / Llama-3-8B
        assert!(prefill_supported(28, 4, 128)); // Qwen2.5-7B (group 7)
        assert!(prefill_supported(9, 3, 64)); // SmolLM2-135M
        assert!(!prefill_supported(64, 8, 128)); // group 8
        assert!(!prefill_supported(32, 8, 96));
        assert!(smem_bytes(128, MAX_GROUP) <= 48 * 1024);
    }
}
