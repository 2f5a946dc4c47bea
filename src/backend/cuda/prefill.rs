//! Launcher of the tensor-core prefill attention (kernels/attention_prefill.cu): chunks of
//! several query tokens of one sequence, cut into tiles of up to 16 tokens; a block serves one
//! tile and one KV head, so each K/V row is read once per tile instead of once per token.
//! Same conventions as `launch`.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::kernels::Kernels;
use super::launch::{check, extent, i32_of, launch, need, Dev};
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

/// Causal attention of the tokens named by `tiles` (`[n_tiles, 2]`: first token, count 1..=16;
/// a tile's tokens share one sequence, `tok_seq` row of `block_tables` `[n_seqs, bt_stride]`)
/// over positions `0..=pos[t]` of the paged F16 cache (`[n_slots, n_kv * head_dim]`).
/// `q`: `[n_tok, q_stride]`, heads first; `out`: `[n_tok, out_stride]`; tokens outside the
/// tiles are left as they are. The host guarantees each tile's positions are covered by its
/// block table and `pos[t] < bt_stride * block_size`.
pub struct PrefillAttention {
    pub q: Dev<f32>,
    pub k_cache: Dev<u16>,
    pub v_cache: Dev<u16>,
    pub block_tables: Dev<i32>,
    pub tok_seq: Dev<i32>,
    pub pos: Dev<i32>,
    pub tiles: Dev<i32>,
    pub out: Dev<f32>,
    pub n_slots: usize,
    pub n_seqs: usize,
    pub n_tok: usize,
    pub n_tiles: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub bt_stride: usize,
    pub q_stride: usize,
    pub out_stride: usize,
}

impl PrefillAttention {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "attn_prefill";
        let (hd, nh, nkv) = (self.head_dim, self.n_heads, self.n_kv);
        check(K, prefill_supported(nh, nkv, hd), || {
            format!("{nh} heads over {nkv} KV heads of size {hd} (head size 64 or 128, at most {MAX_GROUP} heads per KV head)")
        })?;
        check(K, nh * hd <= self.q_stride && nh * hd <= self.out_stride, || "heads overlap the row stride".into())?;
        check(K, self.block_size.is_power_of_two(), || format!("block size {} (a power of two)", self.block_size))?;
        need(K, "q", self.q, extent(self.n_tok, self.q_stride, nh * hd))?;
        need(K, "K cache", self.k_cache, self.n_slots * nkv * hd)?;
        need(K, "V cache", self.v_cache, self.n_slots * nkv * hd)?;
        need(K, "block tables", self.block_tables, self.n_seqs * self.bt_stride)?;
        need(K, "token sequences", self.tok_seq, self.n_tok)?;
        need(K, "positions", self.pos, self.n_tok)?;
        need(K, "tiles", self.tiles, 2 * self.n_tiles)?;
        need(K, "output", self.out, extent(self.n_tok, self.out_stride, nh * hd))?;
        if self.n_tiles == 0 {
            return Ok(());
        }
        let group = nh / nkv;
        let p = PrefillParams {
            q: self.q.ptr,
            k_cache: self.k_cache.ptr,
            v_cache: self.v_cache.ptr,
            block_tables: self.block_tables.ptr,
            tok_seq: self.tok_seq.ptr,
            pos: self.pos.ptr,
            tiles: self.tiles.ptr,
            out: self.out.ptr,
            n_heads: i32_of(K, nh)?,
            n_kv: i32_of(K, nkv)?,
            block_size: i32_of(K, self.block_size)?,
            bt_stride: i32_of(K, self.bt_stride)?,
            q_stride: i32_of(K, self.q_stride)?,
            out_stride: i32_of(K, self.out_stride)?,
            scale: 1.0 / (hd as f32).sqrt(),
            block_shift: self.block_size.trailing_zeros() as i32,
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
