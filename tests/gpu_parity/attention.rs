//! Paged attention kernels against the CPU twin (`ops::attend_batch`): the split decode kernel
//! (every split length and bucket), the tensor-core prefill kernel (one split, and split along
//! the context with the merge), and the shared-prefix (cascade) pass, over a shuffled block pool;
//! the decode and prefill kernels also over the same rows in an 8-bit cache (their `_q8` entries;
//! `DUSTOFF_PREFILL_ACC=0` / `DUSTOFF_PREFILL_QS=1` pick the prefill entries a V100 runs).

use rand::Rng;

use cudarc::driver::CudaSlice;
use dustoff::backend::cpu::ops;
use dustoff::backend::cuda::ops as l;
use dustoff::backend::cuda::ops::launch::KvScales;
use dustoff::backend::cuda::ops::prefill::{
    acc_available, prefill_splits, prefill_supported, push_tiles, PrefillAttention, PrefillSplit,
};
use dustoff::backend::cuda::step::cascade;

use super::{compare, f16_bits, f16_vals, gpu, Gpu};

/// Device buffers of one attention problem (the queries are rows of a qkv-like buffer).
struct Problem {
    q: CudaSlice<f32>,
    kc: CudaSlice<u16>,
    vc: CudaSlice<u16>,
    bt: CudaSlice<i32>,
    tok_seq: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    cache_rows: usize,
    n_seqs: usize,
    shape: (usize, usize, usize),
    bt_stride: usize,
    stride: usize,
    /// The 8-bit cache's scales (K, V), `[cache_rows, kv_dim / 32]` f16; None: an F16 cache.
    scales: Option<(CudaSlice<u16>, CudaSlice<u16>)>,
}

impl Problem {
    fn paged(&self, g: &Gpu, out: &CudaSlice<f32>, n_tok: usize) -> l::PagedAttn {
        let (nh, nkv, hd) = self.shape;
        l::PagedAttn {
            q: g.d(&self.q),
            k_cache: g.d(&self.kc),
            v_cache: g.d(&self.vc),
            kv_scales: self.scales.as_ref().map(|(k, v)| KvScales { k: g.d(k), v: g.d(v) }),
            block_tables: g.d(&self.bt),
            tok_seq: g.d(&self.tok_seq),
            pos: g.d(&self.pos),
            out: g.d(out),
            cache_rows: self.cache_rows,
            n_seqs: self.n_seqs,
            n_tok,
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
            block_size: 16,
            bt_stride: self.bt_stride,
            q_stride: self.stride,
            out_stride: nh * hd,
        }
    }

    /// The prefill kernel over the rows of `tiles`/`rows` (as `push_tiles` lays them out) into
    /// `out`: one split (`None`), or `(split_len, n_splits)` over the partials `parts`
    /// (`[n_tok, heads, n_splits, head_dim]` and `[.., 2]`) with the kernel's own merge; `acc`:
    /// the kernel family with the softmax on the accumulators (`PrefillAttention::launch_kernel`).
    fn prefill(
        &self,
        g: &mut Gpu,
        out: &CudaSlice<f32>,
        n_tok: usize,
        (tiles, rows): (&[i32], &[i32]),
        (po, pml): (&CudaSlice<f32>, &CudaSlice<f32>),
        (split, acc): (Option<(usize, usize)>, bool),
    ) {
        let (tiles_d, rows_d) = (g.up(tiles), g.up(rows));
        let split = split.map(|(split_len, n_splits)| PrefillSplit {
            part_o: g.d(po),
            part_ml: g.d(pml),
            split_len,
            n_splits,
            n_parts: n_splits,
            part0: 0,
            tok0: 0,
            n_part_tok: n_tok,
            merge: true,
        });
        let s = g.dev.stream.clone();
        PrefillAttention {
            paged: self.paged(g, out, n_tok),
            tiles: g.d(&tiles_d),
            rows: g.d(&rows_d),
            n_rows: rows.len(),
            n_tiles: tiles.len() / 4,
            split,
        }
        .launch_kernel(&mut g.k, &s, Some(acc))
        .unwrap();
        eprintln!("prefill kernel: softmax {}", if acc { "on the accumulators" } else { "through shared memory" });
    }
}

/// The prefill kernel families to check: the softmax through shared memory, and on the
/// accumulators where the device has their layout (`prefill::acc_available`).
fn prefill_families(g: &Gpu) -> Vec<bool> {
    if acc_available(&g.k) {
        vec![false, true]
    } else {
        vec![false]
    }
}

/// The tolerance label of a decode launch: the tensor-core kernel rounds Q and the softmax
/// weights to F16.
pub(crate) fn decode_label(kernel: Option<l::DecodeKernel>, hd: usize, group: usize, n_tok: usize) -> &'static str {
    if l::DecodeKernel::resolve(kernel, hd, group, n_tok) == l::DecodeKernel::Tensor {
        "attention_tc"
    } else {
        "attention"
    }
}

/// A shared-prefix group on the device for `decode_attention`: the cascade plan's tiles, rows
/// and each token's `kv_begin`, and its prefix pass's (splits, positions a split).
pub(crate) struct Group<'a> {
    pub dev: (&'a CudaSlice<i32>, &'a CudaSlice<i32>, &'a CudaSlice<i32>),
    pub pre: (usize, usize),
}

/// The decode attention of `paged`'s tokens over `max_len` positions in splits of `split_len`,
/// partials in `parts` (`[n_tok, n_heads, parts, head_dim]` and `[n_tok, n_heads, parts, 2]`
/// f32); with a group, its prefix pass writes the partials after the decode splits.
pub(crate) fn decode_attention(
    g: &Gpu,
    paged: l::PagedAttn,
    (po, pml): (&CudaSlice<f32>, &CudaSlice<f32>),
    max_len: usize,
    split_len: usize,
    kernel: Option<l::DecodeKernel>,
    group: Option<Group>,
) -> l::Attention {
    let splits = max_len.div_ceil(split_len);
    let prefix = group.map(|Group { dev: (tiles, rows, begin), pre: (n_splits, pre_len) }| l::SharedPrefix {
        kv_begin: g.d(begin),
        attn: PrefillAttention {
            paged,
            tiles: g.d(tiles),
            rows: g.d(rows),
            n_rows: rows.len(),
            n_tiles: tiles.len() / 4,
            split: Some(PrefillSplit {
                part_o: g.d(po),
                part_ml: g.d(pml),
                split_len: pre_len,
                n_splits,
                n_parts: splits + n_splits,
                part0: splits,
                tok0: 0,
                n_part_tok: paged.n_tok,
                merge: false,
            }),
        },
    });
    l::Attention { prefix, ..split_attention(g, paged, (po, pml), max_len, (split_len, splits), kernel) }
}

/// The decode attention of `paged`'s tokens over `max_len` positions in `n_splits` splits of
/// `split_len` (more than the positions need is allowed), no shared-prefix group.
fn split_attention(
    g: &Gpu,
    paged: l::PagedAttn,
    (po, pml): (&CudaSlice<f32>, &CudaSlice<f32>),
    max_len: usize,
    (split_len, n_splits): (usize, usize),
    kernel: Option<l::DecodeKernel>,
) -> l::Attention {
    l::Attention { paged, part_o: g.d(po), part_ml: g.d(pml), max_len, n_splits, split_len, kernel, prefix: None }
}

#[test]
fn kv_store_and_paged_attention_match_cpu() {
    let Some(mut g) = gpu("attention") else { return };
    // (n_heads, n_kv, head_dim): SmolLM2 (group 3), Qwen3-8B (group 4): the one-pass decode
    // kernel; Qwen2.5-7B (group 7): the two-pass head-size kernel; head size 80: the generic
    // split kernel (and no prefill kernel); head size 256 (Qwen3.5 / Qwen3-Next full attention,
    // groups 8 and 3): the generic decode kernel, the prefill kernel in 4- and 3-head blocks;
    // group 8 of 128: 8-warp prefill blocks.
    for (nh, nkv, hd) in
        [(9usize, 3usize, 64usize), (32, 8, 128), (28, 4, 128), (8, 2, 80), (16, 2, 256), (6, 2, 256), (64, 8, 128)]
    {
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
        let (mut kv_rows, mut pos, mut tok_seq) = (Vec::new(), Vec::new(), Vec::new());
        for (si, &(c, n)) in seqs.iter().enumerate() {
            for p in 0..c + n {
                kv_rows.push((tables[si][p / bs] as usize * bs + p % bs) as i32);
                pos.push(p);
                tok_seq.push(si);
            }
        }
        let all = kv_rows.len();
        let qkv = g.randn(all * stride, 2.0);
        let cache_rows = n_blocks * bs;
        let (qkvd, sd) = (g.up(&qkv), g.up(&kv_rows));
        let (kc, vc) = (g.zeros::<u16>(cache_rows * kvd), g.zeros::<u16>(cache_rows * kvd));
        super::kv_store(&mut g, &qkvd, (&kc, &vc), None, &sd, cache_rows, all, kvd, stride, qd);
        let (kh, vh) = (g.down(&kc), g.down(&vc));
        let (mut kgot, mut kwant) = (Vec::new(), Vec::new());
        for (t, &row) in kv_rows.iter().enumerate() {
            let row = row as usize;
            kgot.extend(f16_vals(&kh[row * kvd..(row + 1) * kvd]));
            kgot.extend(f16_vals(&vh[row * kvd..(row + 1) * kvd]));
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
        let pr = Problem {
            q: g.up(&qbuf),
            kc,
            vc,
            bt: g.up(&bt),
            tok_seq: g.up(&qseq),
            pos: g.up(&qpos),
            cache_rows,
            n_seqs: seqs.len(),
            shape: (nh, nkv, hd),
            bt_stride,
            stride,
            scales: None,
        };
        // Partials for the most splits any run below uses (a replayed graph launches a
        // power-of-two bucket; 32-position prefill splits).
        let most = l::attn_splits(max_len, 1).next_power_of_two() * 2;
        let (po, pml) = (g.poisoned(n_tok * nh * most * hd), g.poisoned(n_tok * nh * most * 2));

        // The kernels over the F16 cache, then over the same rows stored in an 8-bit cache (the
        // `_q8` entries), each against the CPU over the values its cache holds.
        let (mut tiles, mut rows) = (Vec::new(), Vec::new());
        let mut first = 0;
        for (si, &(c, n)) in seqs.iter().enumerate() {
            push_tiles(&mut tiles, &mut rows, first, n, c, si);
            first += n;
        }
        let qcont: Vec<f32> = q_rows.iter().flat_map(|&r| qkv[r * stride..r * stride + qd].to_vec()).collect();
        let tabs: Vec<&[u32]> = qseq.iter().map(|&si| tables[si as usize].as_slice()).collect();
        let ppos: Vec<usize> = qpos.iter().map(|&p| p as usize).collect();
        let cpu = |k: &[f32], v: &[f32]| {
            let kv = ops::PagedKv { k, v, block_size: bs, n_kv_heads: nkv, head_dim: hd };
            let mut want = vec![0f32; n_tok * qd];
            ops::attend_batch(&kv, &tabs, &ppos, &qcont, nh, &mut want);
            want
        };
        let want = cpu(&f16_vals(&kh), &f16_vals(&vh));
        let cases = Cases {
            tiles: (&tiles, &rows),
            parts: (&po, &pml),
            max_len,
            n_tok,
            prefill: prefill_supported(nh, nkv, hd),
        };
        check_kernels(&mut g, &pr, &cases, &DECODE_CASES, &want);
        if !cases.prefill {
            continue;
        }
        let all_rows: Vec<i32> = (0..cache_rows as i32).collect();
        let (k8, v8, ks, vs) = super::kv_q8::store_q8(&mut g, &qkvd, &sd, cache_rows, (all, kvd, stride, qd));
        let k32 = super::kv_q8::read_back(&g, (&k8, &ks), kvd, &all_rows);
        let v32 = super::kv_q8::read_back(&g, (&v8, &vs), kvd, &all_rows);
        let want = cpu(&k32, &v32);
        let pr = Problem {
            kc: k8,
            vc: v8,
            scales: Some((ks, vs)),
            q: g.up(&qbuf),
            bt: g.up(&bt),
            tok_seq: g.up(&qseq),
            pos: g.up(&qpos),
            ..pr
        };
        check_kernels(&mut g, &pr, &cases, &DECODE_CASES[..5], &want);
    }
}

/// Decode launches: (tokens, split length (0: the step's rule), splits (0: just enough; `MOST`:
/// the most any run uses), kernel (None: the default)); both kernels where the shape has two.
const FULL: usize = usize::MAX;
const MOST: usize = usize::MAX;
const DECODE_CASES: [(usize, usize, usize, Option<l::DecodeKernel>); 12] = {
    use l::DecodeKernel::{OnePass, Tensor, TwoPass};
    [
        (FULL, 0, 0, None),
        (FULL, 64, 0, Some(OnePass)),
        (FULL, 256, 0, Some(TwoPass)),
        (FULL, 0, 0, Some(Tensor)),
        (8, 16, 0, Some(Tensor)),
        (FULL, 0, MOST, None),
        (8, 0, 0, None),
        (8, 0, MOST, None),
        (24, 0, 0, None),
        (FULL, 512, 0, None),
        (FULL, 64, MOST, Some(Tensor)),
        (24, 512, 0, Some(Tensor)),
    ]
};

/// One attention problem's launches: the prefill tiles, the partials for the most splits, the
/// longest context, the query tokens, whether the prefill kernel takes the shape.
struct Cases<'a> {
    tiles: (&'a [i32], &'a [i32]),
    parts: (&'a CudaSlice<f32>, &'a CudaSlice<f32>),
    max_len: usize,
    n_tok: usize,
    prefill: bool,
}

/// The decode kernels of `decode` (FULL: all of `pr`'s tokens) and, where the shape has it, the
/// prefill kernel of each family over every sequence's new tokens (one-token chunks included: a
/// tile of one) in tiles of up to 16 tokens that never cross a sequence: one split (direct
/// output), then split along the context (32 positions: most tiles see splits past their rows'
/// positions; 256) and merged; each against `want`.
fn check_kernels(
    g: &mut Gpu,
    pr: &Problem,
    c: &Cases,
    decode: &[(usize, usize, usize, Option<l::DecodeKernel>)],
    want: &[f32],
) {
    let s = g.dev.stream.clone();
    let (nh, nkv, hd) = pr.shape;
    let (qd, max_len, (po, pml)) = (nh * hd, c.max_len, c.parts);
    let most = l::attn_splits(max_len, 1).next_power_of_two() * 2;
    for &(n_tok, split_len, splits, kernel) in decode {
        let n_tok = n_tok.min(c.n_tok);
        let split_len = if split_len == 0 { l::decode_split_len(n_tok, max_len, nh, nkv, hd) } else { split_len };
        let need = max_len.div_ceil(split_len);
        let splits = if splits == MOST { most.max(need) } else { splits.max(need) };
        let out = g.poisoned(n_tok * qd);
        split_attention(g, pr.paged(g, &out, n_tok), (po, pml), max_len, (split_len, splits), kernel)
            .launch(&mut g.k, &s)
            .unwrap();
        compare(decode_label(kernel, hd, nh / nkv, n_tok), g.seed, &g.down(&out), &want[..n_tok * qd]);
    }
    if !c.prefill {
        return;
    }
    for split_len in [0usize, 32, 256] {
        let split = (split_len > 0).then(|| (split_len, max_len.div_ceil(split_len)));
        for acc in prefill_families(g) {
            let out = g.poisoned(c.n_tok * qd);
            pr.prefill(g, &out, c.n_tok, c.tiles, (po, pml), (split, acc));
            compare("attention_prefill", g.seed, &g.down(&out), want);
        }
    }
}

/// Shared-prefix (cascade) attention equals plain attention: 21 decode tokens, 18 of them in
/// one group whose tables start with the same 40 blocks (plus own suffixes of 1..=200
/// positions), 2 sharing 3 blocks (below the minimum: no group), one alone; the groups found by
/// `cascade::plan` from the tables, the shared range in the tensor-core pass (two tiles: 16 +
/// 2 members), the suffixes in the split kernel, merged. Also plain split attention on the
/// same inputs.
#[test]
fn shared_prefix_attention_equals_plain_attention() {
    let Some(mut g) = gpu("shared-prefix attention") else { return };
    let s = g.dev.stream.clone();
    for (nh, nkv, hd) in [(32usize, 8usize, 128usize), (9, 3, 64), (16, 2, 256)] {
        let (qd, kvd) = (nh * hd, nkv * hd);
        let bs = 16usize;
        let n_blocks = 600usize;
        let mut free: Vec<u32> = (0..n_blocks as u32).collect();
        for i in (1..free.len()).rev() {
            free.swap(i, g.rng.random_range(0..=i));
        }
        let mut take = |n: usize| -> Vec<u32> { (0..n).map(|_| free.pop().unwrap()).collect() };
        let shared = take(40);
        let pair = take(3);
        let mut tables = Vec::new();
        let mut positions = Vec::new();
        for i in 0..18 {
            let own = 1 + (i * 37) % 200;
            let len = 40 * bs + own; // positions 0..len (the last is the token's own)
            let mut t = shared.clone();
            t.extend(take((len - 40 * bs).div_ceil(bs)));
            tables.push(t);
            positions.push(len - 1);
        }
        for i in 0..2 {
            let mut t = pair.clone();
            t.extend(take(5 + i));
            positions.push(t.len() * bs - 3);
            tables.push(t);
        }
        let lone = take(20);
        positions.push(lone.len() * bs - 1);
        tables.push(lone);
        let n_tok = tables.len();
        let bt_stride = tables.iter().map(Vec::len).max().unwrap();
        let mut bt = vec![0i32; n_tok * bt_stride];
        for (si, t) in tables.iter().enumerate() {
            for (j, &b) in t.iter().enumerate() {
                bt[si * bt_stride + j] = b as i32;
            }
        }
        let cache_rows = n_blocks * bs;
        let kvals = f16_bits(&g.randn(cache_rows * kvd, 1.0));
        let vvals = f16_bits(&g.randn(cache_rows * kvd, 1.0));
        let stride = qd + 2 * kvd;
        let qv = g.randn(n_tok * stride, 2.0);
        let pr = Problem {
            q: g.up(&qv),
            kc: g.up(&kvals),
            vc: g.up(&vvals),
            bt: g.up(&bt),
            tok_seq: g.up(&(0..n_tok as i32).collect::<Vec<_>>()),
            pos: g.up(&positions.iter().map(|&p| p as i32).collect::<Vec<_>>()),
            cache_rows,
            n_seqs: n_tok,
            shape: (nh, nkv, hd),
            bt_stride,
            stride,
            scales: None,
        };
        let (k32, v32) = (f16_vals(&kvals), f16_vals(&vvals));
        let kv = ops::PagedKv { k: &k32, v: &v32, block_size: bs, n_kv_heads: nkv, head_dim: hd };
        let qcont: Vec<f32> = (0..n_tok).flat_map(|t| qv[t * stride..t * stride + qd].to_vec()).collect();
        let tabs: Vec<&[u32]> = tables.iter().map(Vec::as_slice).collect();
        let mut want = vec![0f32; n_tok * qd];
        ops::attend_batch(&kv, &tabs, &positions, &qcont, nh, &mut want);

        let toks: Vec<cascade::DecodeTok> = (0..n_tok)
            .map(|t| cascade::DecodeTok { token: t, bt_row: t, table: &tables[t], pos: positions[t] })
            .collect();
        let plan = cascade::plan(&toks, n_tok, bs).expect("one group");
        assert_eq!(plan.max_shared, 40 * bs);
        assert_eq!(plan.tiles.len(), 2 * 4, "18 members: tiles of 16 and 2");
        assert_eq!(plan.kv_begin.iter().filter(|&&b| b > 0).count(), 18);
        let max_len = positions.iter().max().unwrap() + 1;
        let (tiles_d, rows_d, begin_d) = (g.up(&plan.tiles), g.up(&plan.rows), g.up(&plan.kv_begin));
        let split_len = l::decode_split_len(n_tok, max_len, nh, nkv, hd);
        let splits = max_len.div_ceil(split_len);
        let pres = [cascade::splits(2, plan.max_shared, nh, nkv, hd), (1, 640), (20, 32)];
        for ((pre_splits, pre_len), kernel) in
            pres.into_iter().flat_map(|p| [(p, None), (p, Some(l::DecodeKernel::Tensor))])
        {
            let n_parts = splits + pre_splits;
            let (po, pml) = (g.poisoned(n_tok * nh * n_parts * hd), g.poisoned(n_tok * nh * n_parts * 2));
            let out = g.poisoned(n_tok * qd);
            let paged = pr.paged(&g, &out, n_tok);
            let group = Group { dev: (&tiles_d, &rows_d, &begin_d), pre: (pre_splits, pre_len) };
            decode_attention(&g, paged, (&po, &pml), max_len, split_len, kernel, Some(group))
                .launch(&mut g.k, &s)
                .unwrap();
            let tc = l::DecodeKernel::resolve(kernel, hd, nh / nkv, n_tok) == l::DecodeKernel::Tensor;
            compare(if tc { "attention_tc" } else { "attention_cascade" }, g.seed, &g.down(&out), &want);
        }
        // The same tokens without the group pass.
        let (po, pml) = (g.poisoned(n_tok * nh * splits * hd), g.poisoned(n_tok * nh * splits * 2));
        let out = g.poisoned(n_tok * qd);
        split_attention(&g, pr.paged(&g, &out, n_tok), (&po, &pml), max_len, (split_len, splits), None)
            .launch(&mut g.k, &s)
            .unwrap();
        compare(decode_label(None, hd, nh / nkv, n_tok), g.seed, &g.down(&out), &want);
    }
}

/// The whole CUDA backend against the CPU backend on steps whose block tables share leading
/// blocks (random F16 weights, SmolLM2 shape): 20 sequences after one 608-token prefix (38
/// shared blocks), each prefilled with its own 10..=29 tokens (a 390-token step: prefill
/// attention split along the context and merged), then one decode step of all 20 (a
/// 20-token step: the shared-prefix pass, then each suffix). Logits within the backend
/// tolerance, and the decode step repeated gives the same logits bit for bit.
#[test]
fn backend_steps_over_shared_blocks_match_cpu() {
    use dustoff::backend::Backend;
    use dustoff::engine::plan::{SeqChunk, StepPlan};
    use dustoff::model::quant::GgmlType;
    let Some(g) = gpu("shared blocks through the backend") else { return };
    drop(g);
    let cfg = dustoff::model::shapes::shape("smollm2-135m").unwrap();
    let w = dustoff::model::synth::random_weights(&cfg, GgmlType::F16, 11);
    let n_blocks = 128;
    let mut gb = dustoff::backend::cuda::CudaBackend::new(cfg.clone(), &w, &super::opts(n_blocks)).unwrap();
    let mut cb = dustoff::backend::cpu::CpuBackend::new(cfg, w, n_blocks, 16);
    let shared: Vec<u32> = (0..38).collect();
    let prefix: Vec<u32> = (0..608).map(|i| 300 + (i * 53) % 20_000).collect();
    let tables: Vec<Vec<u32>> =
        (0..20u32).map(|i| shared.iter().copied().chain(38 + 3 * i..41 + 3 * i).collect()).collect();
    let own = |i: usize| 10 + i;
    let chunk = |seq: usize, tokens: Vec<u32>, start_pos: usize, table: &[u32]| SeqChunk {
        seq: seq as _,
        tokens,
        start_pos,
        block_table: table.to_vec(),
        want_logits: true,
    };
    let steps = [
        StepPlan::new(vec![chunk(100, prefix, 0, &shared)]),
        StepPlan::new(
            (0..20)
                .map(|i| chunk(i, (0..own(i)).map(|j| (1000 + i * 97 + j * 13) as u32).collect(), 608, &tables[i]))
                .collect(),
        ),
        StepPlan::new((0..20).map(|i| chunk(i, vec![(5000 + i * 7) as u32], 608 + own(i), &tables[i])).collect()),
    ];
    for (k, plan) in steps.iter().enumerate() {
        let got = gb.step(plan).unwrap();
        let want = cb.step(plan).unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            compare("cuda_vs_cpu_logits", (k * 100 + i) as u64, a, b);
        }
        if k == 2 {
            // The decode step again (it rewrites the same K/V): the same logits.
            let again = gb.step(plan).unwrap();
            assert!(again == got, "the shared-prefix decode step is not deterministic");
        }
    }
}

/// Long contexts: one sequence of 16,384 positions in shuffled blocks. Decode tokens at
/// positions 0, 1, 4,095 and 16,383 (contexts 1..16k) through the one-pass kernel, the two-pass
/// kernel and the step's rule, and a prefill tile of the last 16 positions through the
/// tensor-core kernel (one split, and split along the context with the merge), against the CPU
/// twin; Qwen3-8B (32 / 8 heads of 128), groups of 8 (Qwen3-30B-A3B: 32 / 4) and head size 256
/// in groups of 8 (16 / 2).
#[test]
fn long_context_attention_matches_cpu() {
    let Some(mut g) = gpu("long-context attention") else { return };
    let s = g.dev.stream.clone();
    let (bs, len) = (16usize, 16_384usize);
    for (nh, nkv, hd) in [(32usize, 8usize, 128usize), (32, 4, 128), (16, 2, 256)] {
        let (qd, kvd) = (nh * hd, nkv * hd);
        let n_blocks = len / bs;
        let mut table: Vec<u32> = (0..n_blocks as u32).collect();
        for i in (1..table.len()).rev() {
            table.swap(i, g.rng.random_range(0..=i));
        }
        let cache_rows = n_blocks * bs;
        let (kb, vb) = (f16_bits(&g.randn(cache_rows * kvd, 1.0)), f16_bits(&g.randn(cache_rows * kvd, 1.0)));
        let (k32, v32) = (f16_vals(&kb), f16_vals(&vb));
        let kv = ops::PagedKv { k: &k32, v: &v32, block_size: bs, n_kv_heads: nkv, head_dim: hd };
        let bt: Vec<i32> = table.iter().map(|&b| b as i32).collect();
        let (kc, vc, btd) = (g.up(&kb), g.up(&vb), g.up(&bt));
        // Decode tokens and the prefill tile's tokens, each a query row of `stride`.
        let stride = qd + 2 * kvd;
        // Prefill: three tiles of a chunk at the start (contexts 1..48: the causal mask in every
        // K/V tile) and at the end (16k: whole tiles before the diagonal ones).
        let cases: [(&str, Vec<usize>); 3] = [
            ("decode", vec![0, 1, 4095, len - 1]),
            ("prefill", (0..48).collect()),
            ("prefill", (len - 48..len).collect()),
        ];
        for (kind, positions) in cases {
            let n_tok = positions.len();
            let qv = g.randn(n_tok * stride, 2.0);
            let qcont: Vec<f32> = (0..n_tok).flat_map(|t| qv[t * stride..t * stride + qd].to_vec()).collect();
            let tabs: Vec<&[u32]> = vec![table.as_slice(); n_tok];
            let mut want = vec![0f32; n_tok * qd];
            ops::attend_batch(&kv, &tabs, &positions, &qcont, nh, &mut want);
            let pr = Problem {
                q: g.up(&qv),
                kc: kc.clone(),
                vc: vc.clone(),
                bt: btd.clone(),
                tok_seq: g.up(&vec![0i32; n_tok]),
                pos: g.up(&positions.iter().map(|&p| p as i32).collect::<Vec<_>>()),
                cache_rows,
                n_seqs: 1,
                shape: (nh, nkv, hd),
                bt_stride: n_blocks,
                stride,
                scales: None,
            };
            let most = l::attn_splits(len, 1) + 64;
            let (po, pml) = (g.poisoned(n_tok * nh * most * hd), g.poisoned(n_tok * nh * most * 2));
            if kind == "decode" {
                // The rule's split is the one-pass kernel's (up to 1,024 positions); the forced
                // two-pass case takes 256, which its score array holds for every shape here.
                use l::DecodeKernel::{OnePass, Tensor, TwoPass};
                for (split_len, kernel) in [
                    (0, None),
                    (0, Some(OnePass)),
                    (64, Some(OnePass)),
                    (512, Some(OnePass)),
                    (256, Some(TwoPass)),
                    (0, Some(Tensor)),
                    (64, Some(Tensor)),
                    (if matches!(hd, 64 | 128) { 1024 } else { 256 }, Some(Tensor)),
                ] {
                    let split_len =
                        if split_len == 0 { l::decode_split_len(n_tok, len, nh, nkv, hd) } else { split_len };
                    let out = g.poisoned(n_tok * qd);
                    let splits = (split_len, len.div_ceil(split_len));
                    split_attention(&g, pr.paged(&g, &out, n_tok), (&po, &pml), len, splits, kernel)
                        .launch(&mut g.k, &s)
                        .unwrap();
                    compare(decode_label(kernel, hd, nh / nkv, n_tok), g.seed, &g.down(&out), &want);
                }
                continue;
            }
            if !prefill_supported(nh, nkv, hd) {
                continue;
            }
            let (mut tiles, mut rows) = (Vec::new(), Vec::new());
            push_tiles(&mut tiles, &mut rows, 0, n_tok, positions[0], 0);
            let reach = positions[n_tok - 1] + 1;
            let (pf, pl) = prefill_splits(tiles.len() / 4, n_tok, reach, nh, nkv, hd, false);
            for split_len in [0usize, pl] {
                let split = (split_len > 0).then(|| (split_len, pf.max(reach.div_ceil(split_len))));
                for acc in prefill_families(&g) {
                    let out = g.poisoned(n_tok * qd);
                    pr.prefill(&mut g, &out, n_tok, (&tiles, &rows), (&po, &pml), (split, acc));
                    compare("attention_prefill", g.seed, &g.down(&out), &want);
                }
            }
        }
    }
}
