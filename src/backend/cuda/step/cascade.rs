//! Shared-prefix (cascade) groups of a decode step, found from the block tables alone: decode
//! tokens whose tables start with the same block ids (the prefix cache hands every request of
//! a shared prompt the same blocks) read those positions once per group of up to 16 members,
//! on the tensor cores (kernels/attention_prefill.cu), then each its own suffix in the split
//! kernel; the partial softmaxes are merged exactly (attn_merge_f32).

use std::collections::BTreeMap;

use crate::backend::cuda::ops::prefill::{heads_per_block, push_tile, TILE_TOKENS};

/// Fewest shared blocks worth a group pass (below, the split kernel reads them as fast).
pub const MIN_SHARED_BLOCKS: usize = 4;
/// Blocks the shared-prefix pass aims for (about one wave: its blocks are short, and each
/// split adds a partial per member to merge).
const TARGET_BLOCKS: usize = 128;
/// Shortest split of the shared-prefix pass.
const MIN_SPLIT: usize = 128;

/// One decode token of a step: its flat index, block-table row and table, and position.
pub struct DecodeTok<'a> {
    pub token: usize,
    pub bt_row: usize,
    pub table: &'a [u32],
    pub pos: usize,
}

/// The groups of a step as prefill tiles (`[first row, count, shared length, block-table row]`,
/// rows = decode tokens) and each decode token's first own position (`kv_begin`, indexed by
/// flat token; 0 outside every group).
#[derive(Debug, PartialEq)]
pub struct Cascade {
    pub tiles: Vec<i32>,
    pub rows: Vec<i32>,
    pub kv_begin: Vec<i32>,
    /// Longest shared length.
    pub max_shared: usize,
}

/// Groups the decode tokens `toks` (flat indices `0..n`) by their first block; a group of two or
/// more whose tables share at least `MIN_SHARED_BLOCKS` leading blocks, all of them before every
/// member's own position, shares them. `None` when no group does.
pub fn plan(toks: &[DecodeTok], n: usize, block_size: usize) -> Option<Cascade> {
    let mut by_first: BTreeMap<u32, Vec<&DecodeTok>> = BTreeMap::new();
    for t in toks {
        if let Some(&b) = t.table.first() {
            by_first.entry(b).or_default().push(t);
        }
    }
    let mut c = Cascade { tiles: Vec::new(), rows: Vec::new(), kv_begin: vec![0; n], max_shared: 0 };
    for members in by_first.values().filter(|m| m.len() >= 2) {
        let first = members[0].table;
        // Common leading blocks, ending before every member's own position (whole blocks).
        let shared = members.iter().fold(usize::MAX, |acc, m| {
            let same = first.iter().zip(m.table).take_while(|(a, b)| a == b).count();
            acc.min(same).min(m.pos / block_size)
        });
        if shared < MIN_SHARED_BLOCKS {
            continue;
        }
        let len = shared * block_size;
        for chunk in members.chunks(TILE_TOKENS) {
            push_tile(&mut c.tiles, &mut c.rows, chunk.iter().map(|m| m.token), len, members[0].bt_row);
        }
        for m in members {
            c.kv_begin[m.token] = len as i32;
        }
        c.max_shared = c.max_shared.max(len);
    }
    (!c.tiles.is_empty()).then_some(c)
}

/// (splits, positions per split) of the shared-prefix pass over `n_tiles` tiles of at most
/// `max_shared` positions: about `TARGET_BLOCKS` blocks, splits of `MIN_SPLIT` or more positions
/// (multiples of 32, the kernel's K/V tile).
pub fn splits(n_tiles: usize, max_shared: usize, n_heads: usize, n_kv: usize, head_dim: usize) -> (usize, usize) {
    let group = (n_heads / n_kv.max(1)).max(1);
    let blocks = (n_tiles * n_kv * (group / heads_per_block(group, head_dim))).max(1);
    let want = TARGET_BLOCKS.div_ceil(blocks).clamp(1, max_shared.div_ceil(MIN_SPLIT).max(1));
    let split = max_shared.div_ceil(want).div_ceil(32).max(1) * 32;
    (max_shared.div_ceil(split).max(1), split)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_share_whole_leading_blocks_before_every_position() {
        let bs = 16;
        // Tokens 0, 2, 3 share blocks 10..=15 (6 blocks); token 3 is at position 80 (block 5),
        // so the group shares 5 blocks; token 1 has its own table; token 4 shares only 2 blocks
        // with token 5 (below the minimum).
        let t0 = [10u32, 11, 12, 13, 14, 15, 20];
        let t1 = [30u32, 31, 32, 33, 34, 35];
        let t2 = [10u32, 11, 12, 13, 14, 15, 21, 22];
        let t3 = [10u32, 11, 12, 13, 14, 15];
        let t4 = [40u32, 41, 42, 43, 44];
        let t5 = [40u32, 41, 50, 51, 52];
        let toks = [
            DecodeTok { token: 0, bt_row: 3, table: &t0, pos: 100 },
            DecodeTok { token: 1, bt_row: 0, table: &t1, pos: 90 },
            DecodeTok { token: 2, bt_row: 1, table: &t2, pos: 120 },
            DecodeTok { token: 3, bt_row: 2, table: &t3, pos: 80 },
            DecodeTok { token: 4, bt_row: 4, table: &t4, pos: 70 },
            DecodeTok { token: 5, bt_row: 5, table: &t5, pos: 70 },
        ];
        let c = plan(&toks, 6, bs).unwrap();
        assert_eq!(c.tiles, vec![0, 3, 80, 3]);
        assert_eq!(c.rows, vec![0, 2, 3]);
        assert_eq!(c.kv_begin, vec![80, 0, 80, 80, 0, 0]);
        assert_eq!(c.max_shared, 80);
        // No group: no plan.
        assert_eq!(plan(&toks[..2], 2, bs), None);
    }

    #[test]
    fn large_groups_take_tiles_of_sixteen() {
        let table: Vec<u32> = (0..70).collect();
        let toks: Vec<DecodeTok> =
            (0..40).map(|i| DecodeTok { token: i, bt_row: i, table: &table, pos: 1000 + i }).collect();
        let c = plan(&toks, 40, 16).unwrap();
        // 1,000 / 16 = 62 whole blocks before the first member's position.
        assert_eq!(c.max_shared, 992);
        assert_eq!(c.tiles, vec![0, 16, 992, 0, 16, 16, 992, 0, 32, 8, 992, 0]);
        assert_eq!(c.rows, (0..40).collect::<Vec<i32>>());
        let (n, len) = splits(3, 992, 32, 8, 128);
        assert!(n * len >= 992 && (n - 1) * len < 992 && len % 32 == 0 && len >= MIN_SPLIT);
        assert!(n > 1, "a 992-position prefix over 24 blocks is split");
    }
}
