//! Paged attention kernels against the CPU twin (`ops::attend_batch`): the split decode kernel
//! and the tensor-core prefill kernel, over a shuffled block pool.

use rand::Rng;

use dustoff::backend::cpu::ops;
use dustoff::backend::cuda::launch as l;
use dustoff::backend::cuda::prefill::{prefill_supported, push_tiles, PrefillAttention};

use super::{compare, f16_bits, f16_vals, gpu};

#[test]
fn kv_store_and_paged_attention_match_cpu() {
    let Some(mut g) = gpu("attention") else { return };
    let s = g.dev.stream.clone();
    // (n_heads, n_kv, head_dim): SmolLM2 (group 3), Qwen3-8B (group 4): the one-pass decode
    // kernel; Qwen2.5-7B (group 7): the two-pass head-size kernel; head size 80: the generic
    // split kernel (and no prefill kernel).
    for (nh, nkv, hd) in [(9usize, 3usize, 64usize), (32, 8, 128), (28, 4, 128), (8, 2, 80)] {
        let (qd, kvd) = (nh * hd, nkv * hd);
        let stride = qd + 2 * kvd;
        let (bs, n_blocks) = (16usize, 160usize);
        // Each sequence: (context already cached, new tokens this step).
        // Long chunks (37, 40 tokens) span several 16-token prefill tiles, ending in partial ones.
        let seqs = [(700usize, 1usize), (0, 5), (300, 2), (511, 1), (255, 3), (100, 37), (0, 40)];
        let mut free: Vec<u32> = (0..n_blocks as u32).collect();
        for i in (1..free.len()).rev() {
            free.swap(i, g.rng.random_range(0..=i));
        }
        let tables: Vec<Vec<u32>> =
            seqs.iter().map(|&(c, n)| (0..(c + n).div_ceil(bs)).map(|_| free.pop().unwrap()).collect()).collect();
        let bt_stride = tables.iter().map(Vec::len).max().unwrap();

        // Every position of every sequence goes through kv_store (context and new tokens alike).
        let (mut slots, mut pos, mut tok_seq) = (Vec::new(), Vec::new(), Vec::new());
        for (si, &(c, n)) in seqs.iter().enumerate() {
            for p in 0..c + n {
                slots.push((tables[si][p / bs] as usize * bs + p % bs) as i32);
                pos.push(p);
                tok_seq.push(si);
            }
        }
        let all = slots.len();
        let qkv = g.randn(all * stride, 2.0);
        let n_slots = n_blocks * bs;
        let (qkvd, sd) = (g.up(&qkv), g.up(&slots));
        let (kc, vc) = (g.zeros::<u16>(n_slots * kvd), g.zeros::<u16>(n_slots * kvd));
        l::KvStore {
            qkv: g.d(&qkvd),
            k_cache: g.d(&kc),
            v_cache: g.d(&vc),
            slots: g.d(&sd),
            n_slots,
            n_tok: all,
            kv_dim: kvd,
            stride,
            k_off: qd,
            v_off: qd + kvd,
        }
        .launch(&mut g.k, &s)
        .unwrap();
        let (kh, vh) = (g.down(&kc), g.down(&vc));
        let (mut kgot, mut kwant) = (Vec::new(), Vec::new());
        for (t, &sl) in slots.iter().enumerate() {
            let sl = sl as usize;
            kgot.extend(f16_vals(&kh[sl * kvd..(sl + 1) * kvd]));
            kgot.extend(f16_vals(&vh[sl * kvd..(sl + 1) * kvd]));
            kwant.extend(f16_vals(&f16_bits(&qkv[t * stride + qd..t * stride + qd + 2 * kvd])));
        }
        compare("kv_store_f16", g.seed, &kgot, &kwant);

        // Queries: the new tokens of each sequence (rows of the same qkv buffer).
        let q_rows: Vec<usize> = {
            let mut r = Vec::new();
            let mut base = 0;
            for &(c, n) in &seqs {
                r.extend(base + c..base + c + n);
                base += c + n;
            }
            r
        };
        let n_tok = q_rows.len();
        let qbuf: Vec<f32> = q_rows.iter().flat_map(|&r| qkv[r * stride..(r + 1) * stride].to_vec()).collect();
        let qpos: Vec<i32> = q_rows.iter().map(|&r| pos[r] as i32).collect();
        let qseq: Vec<i32> = q_rows.iter().map(|&r| tok_seq[r] as i32).collect();
        let mut bt = vec![0i32; seqs.len() * bt_stride];
        for (si, t) in tables.iter().enumerate() {
            for (j, &b) in t.iter().enumerate() {
                bt[si * bt_stride + j] = b as i32;
            }
        }
        let max_len = seqs.iter().map(|&(c, n)| c + n).max().unwrap();
        // Exactly the splits needed, and more (a replayed graph launches a power-of-two bucket);
        // all queries (prefill-sized: long splits) and the first 8 (decode-sized: short splits).
        let most = l::attn_splits(max_len, 1).next_power_of_two() * 2;
        let (qdv, pd, tsd, btd) = (g.up(&qbuf), g.up(&qpos), g.up(&qseq), g.up(&bt));
        let (po, pml) = (g.zeros::<f32>(n_tok * nh * most * hd), g.zeros::<f32>(n_tok * nh * most * 2));
        let (k32, v32) = (f16_vals(&kh), f16_vals(&vh));
        let kv = ops::PagedKv { k: &k32, v: &v32, block_size: bs, n_kv_heads: nkv, head_dim: hd };
        let qcont: Vec<f32> = q_rows.iter().flat_map(|&r| qkv[r * stride..r * stride + qd].to_vec()).collect();
        let tabs: Vec<&[u32]> = qseq.iter().map(|&si| tables[si as usize].as_slice()).collect();
        let ppos: Vec<usize> = qpos.iter().map(|&p| p as usize).collect();
        let mut want = vec![0f32; n_tok * qd];
        ops::attend_batch(&kv, &tabs, &ppos, &qcont, nh, &mut want);
        let full = n_tok;
        for (n_tok, splits) in [(full, 0), (full, most), (8, 0), (8, most), (24, 0)] {
            let splits = if splits == 0 { l::attn_splits(max_len, n_tok) } else { splits };
            let out = g.poisoned(n_tok * qd);
            l::Attention {
                paged: l::PagedAttn {
                    q: g.d(&qdv),
                    k_cache: g.d(&kc),
                    v_cache: g.d(&vc),
                    block_tables: g.d(&btd),
                    tok_seq: g.d(&tsd),
                    pos: g.d(&pd),
                    out: g.d(&out),
                    n_slots,
                    n_seqs: seqs.len(),
                    n_tok,
                    n_heads: nh,
                    n_kv: nkv,
                    head_dim: hd,
                    block_size: bs,
                    bt_stride,
                    q_stride: stride,
                    out_stride: qd,
                },
                part_o: g.d(&po),
                part_ml: g.d(&pml),
                max_len,
                n_splits: splits,
            }
            .launch(&mut g.k, &s)
            .unwrap();
            compare("attention", g.seed, &g.down(&out), &want[..n_tok * qd]);
        }

        if !prefill_supported(nh, nkv, hd) {
            continue;
        }
        // The prefill kernel over every sequence's new tokens (one-token chunks included: a
        // tile of one), in tiles of up to 16 tokens that never cross a sequence.
        let mut tiles = Vec::new();
        let mut first = 0;
        for &(_, n) in &seqs {
            push_tiles(&mut tiles, first, n);
            first += n;
        }
        let tiles_d = g.up(&tiles);
        let out = g.poisoned(n_tok * qd);
        PrefillAttention {
            paged: l::PagedAttn {
                q: g.d(&qdv),
                k_cache: g.d(&kc),
                v_cache: g.d(&vc),
                block_tables: g.d(&btd),
                tok_seq: g.d(&tsd),
                pos: g.d(&pd),
                out: g.d(&out),
                n_slots,
                n_seqs: seqs.len(),
                n_tok,
                n_heads: nh,
                n_kv: nkv,
                head_dim: hd,
                block_size: bs,
                bt_stride,
                q_stride: stride,
                out_stride: qd,
            },
            tiles: g.d(&tiles_d),
            n_tiles: tiles.len() / 2,
        }
        .launch(&mut g.k, &s)
        .unwrap();
        compare("attention_prefill", g.seed, &g.down(&out), &want);
    }
}
