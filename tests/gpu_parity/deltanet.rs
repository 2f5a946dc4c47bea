//! The hybrid-model kernels (kernels/deltanet.cu, kernels/hybrid_attn.cu) against their CPU
//! twins (backend::cpu::deltanet, the attention of backend::cpu::hybrid), over several
//! sequences per launch with the token counts of a real step (1, 2, 7, 9, 33, 64) and both the
//! test model's head sizes (32) and the released models' (128).

use dustoff::backend::cpu::deltanet::gated_rmsnorm;
use dustoff::backend::cpu::ops;
use dustoff::backend::cuda::ops::deltanet::{
    DnChunked, DnConv, DnConvPrep, DnGatedNorm, DnRecur, DnRecurNorm, StatePool, DN_AB_ROW, DN_CH,
};
use dustoff::backend::cuda::ops::hybrid_attn::{GateMul, HybQkvPost};
use dustoff::backend::cuda::ops::q8x;
use dustoff::backend::cuda::ops::qlaunch::q8x_bytes;
use dustoff::model::config::RopeStyle;

use super::deltanet_case::{
    chunk_table, cpu_conv, cpu_prep, decay_rates, padded_table, Case, Recurrence, COUNTS, SLOTS,
};
use super::{compare, f16_vals, gpu, Gpu};

#[test]
fn conv1d_silu_over_several_sequences_updates_each_window() {
    let Some(mut g) = gpu("dn_conv_silu") else { return };
    let (c, k, stride) = (96, 4, 96 + 40);
    let n: usize = COUNTS.iter().sum();
    let slots = [3, 0, 5, 1, 4, 2]; // not in order: the table names them
    let per_slot = 7 * c; // a bigger slot: this layer's state at offset 2c
    let layer_off = 2 * c;
    let x = g.randn(n * stride, 2.0);
    let w = g.randn(c * k, 0.7);
    let pool = g.randn(6 * per_slot, 1.0);
    let (xd, wd, pd, od) = (g.up(&x), g.up(&w), g.up(&pool), g.poisoned(n * c));
    let td = g.up(&padded_table(&COUNTS, &slots, 8)); // 8 chunks launched, 6 in the table: the others exit
    let s = g.dev.stream.clone();
    DnConv {
        x: g.d(&xd),
        x_stride: stride,
        out: g.d(&od),
        w: g.d(&wd),
        pool: StatePool { state: g.d(&pd), slot_stride: per_slot, layer_off, chunks: g.d(&td), max_chunks: 8 },
        n_tok: n,
        channels: c,
        kernel: k,
    }
    .launch(&mut g.k, &s)
    .unwrap();
    let mut want_pool = pool.clone();
    let want = cpu_conv(&x, stride, &w, (c, k), (&COUNTS, &slots), &mut want_pool, per_slot, layer_off);
    compare("dn_conv_silu_f32", g.seed, &g.down(&od), &want);
    compare("dn_conv_silu_f32", g.seed, &g.down(&pd), &want_pool);
}

#[test]
fn delta_rule_many_token_form_equals_steps_and_the_cpu() {
    let Some(mut g) = gpu("dn_recur") else { return };
    let s = g.dev.stream.clone();
    let cases = [
        Case { nk: 2, nv: 4, dk: 32, dv: 32, tiled: false },
        Case { nk: 2, nv: 4, dk: 32, dv: 32, tiled: true },
        Case { nk: 2, nv: 4, dk: 128, dv: 128, tiled: true },
    ];
    for cs in &cases {
        let vd = cs.nv * cs.dv;
        let n: usize = COUNTS.iter().sum();
        let r = Recurrence::random(&mut g, cs);
        let (mats_off, per_slot) = (r.mats_off, r.per_slot);
        let want = r.cpu(cs, None);
        // The chunked CPU twin from the same prepared inputs (mixed and proj after the prep).
        let want_chunked = r.cpu(cs, Some(DN_CH));
        let (md, pjd, nad, dtd) = (g.up(&r.mixed), g.up(&r.proj), g.up(&r.neg_a), g.up(&r.dt_bias));
        cs.prep(g.d(&md), g.d(&pjd), (g.d(&nad), g.d(&dtd)), n).launch(&mut g.k, &s).unwrap();
        compare("dn_prep_f32", g.seed, &g.down(&md), &want.mixed);
        compare("dn_prep_f32", g.seed, &g.down(&pjd), &want.proj);
        let recur = |g: &mut Gpu, pool: &cudarc::driver::CudaSlice<f32>, table: &[i32], n_tok: usize, first: usize| {
            // Two chunks more launched than the table holds: their blocks exit.
            let max_chunks = (table.len() - 1) / 3 + 2;
            let mut padded = table.to_vec();
            padded.resize(1 + 3 * max_chunks, 0);
            let td = g.up(&padded);
            let od = g.poisoned(n * vd);
            let pool =
                StatePool { state: g.d(pool), slot_stride: per_slot, layer_off: 0, chunks: g.d(&td), max_chunks };
            cs.recur((g.d(&md), g.d(&pjd), g.d(&od)), pool, mats_off, n_tok).launch(&mut g.k, &s).unwrap();
            let o = g.down(&od);
            o[first * vd..(first + n_tok) * vd].to_vec()
        };
        // Many-token form: every chunk's tokens in one launch.
        let pd = g.up(&r.pool);
        let many = recur(&mut g, &pd, &chunk_table(&COUNTS, &SLOTS), n, 0);
        compare("dn_recur_f32", g.seed, &many, &want.out);
        compare("dn_recur_f32", g.seed, &g.down(&pd), &want.pool);
        // Step form: the same tokens one launch per token (decode), all chunks advancing together.
        let ps2 = g.up(&r.pool);
        let mut steps = vec![0f32; n * vd];
        let max_cnt = *COUNTS.iter().max().unwrap();
        for i in 0..max_cnt {
            let mut t0 = 0;
            for (&cnt, &slot) in COUNTS.iter().zip(&SLOTS) {
                if i < cnt {
                    let t = t0 + i;
                    let one = recur(&mut g, &ps2, &[1, t as i32, 1, slot as i32], 1, t);
                    steps[t * vd..(t + 1) * vd].copy_from_slice(&one);
                }
                t0 += cnt;
            }
        }
        compare("dn_recur_step_vs_many", g.seed, &steps, &many);
        compare("dn_recur_step_vs_many", g.seed, &g.down(&ps2), &g.down(&pd));
        // The chunked form (prefill): against its CPU twin and against the step form.
        let max_chunks = COUNTS.len() + 2; // two more launched than the table holds
        let padded = padded_table(&COUNTS, &SLOTS, max_chunks);
        let (td, pc, od) = (g.up(&padded), g.up(&r.pool), g.poisoned(n * vd));
        let abd = g.poisoned(n * cs.nv * DN_AB_ROW);
        let pool = StatePool { state: g.d(&pc), slot_stride: per_slot, layer_off: 0, chunks: g.d(&td), max_chunks };
        let recur = cs.recur((g.d(&md), g.d(&pjd), g.d(&od)), pool, mats_off, n);
        let max_count = *COUNTS.iter().max().unwrap();
        DnChunked { recur: &recur, ab: g.d(&abd), max_count }.launch(&mut g.k, &s).unwrap();
        let chunked = g.down(&od);
        compare("dn_chunk_scan_f32", g.seed, &chunked, &want_chunked.out);
        compare("dn_chunk_scan_f32", g.seed, &g.down(&pc), &want_chunked.pool);
        compare("dn_chunk_vs_step", g.seed, &chunked, &want.out);
        compare("dn_chunk_vs_step", g.seed, &g.down(&pc), &want.pool);
    }
}

/// `dn_recur_norm_f32` (the step form with the gated norm of each token's head output in the
/// same block) against the CPU: l2norm + gates, the delta rule step by step, then
/// `gated_rmsnorm` per head; several chunks per launch, padded table, both head sizes.
#[test]
fn delta_rule_with_the_gated_norm_in_one_kernel_equals_the_cpu() {
    let Some(mut g) = gpu("dn_recur_norm") else { return };
    let s = g.dev.stream.clone();
    let cases =
        [Case { nk: 2, nv: 4, dk: 32, dv: 32, tiled: false }, Case { nk: 2, nv: 4, dk: 128, dv: 128, tiled: true }];
    for cs in &cases {
        let (c, ps, vd) = (cs.channels(), cs.proj_stride(), cs.nv * cs.dv);
        let n: usize = COUNTS.iter().sum();
        let r = Recurrence::random(&mut g, cs);
        let (proj, pool, per_slot) = (&r.proj, &r.pool, r.per_slot);
        let w = g.randn(cs.dv, 1.5);
        let eps = 1e-6;
        let want_r = r.cpu(cs, None);
        let (mut want, want_pool) = (want_r.out, want_r.pool);
        // z: the gate columns right after the q|k|v channels of the projection row.
        for t in 0..n {
            for h in 0..cs.nv {
                let z = &proj[t * ps + c + h * cs.dv..t * ps + c + (h + 1) * cs.dv];
                gated_rmsnorm(&mut want[(t * cs.nv + h) * cs.dv..(t * cs.nv + h + 1) * cs.dv], z, &w, eps);
            }
        }
        let (md, pjd, nad, dtd, wd) = (g.up(&r.mixed), g.up(proj), g.up(&r.neg_a), g.up(&r.dt_bias), g.up(&w));
        cs.prep(g.d(&md), g.d(&pjd), (g.d(&nad), g.d(&dtd)), n).launch(&mut g.k, &s).unwrap();
        let max_chunks = COUNTS.len() + 2; // two more launched than the table holds
        let table = padded_table(&COUNTS, &SLOTS, max_chunks);
        let (td, pd, od) = (g.up(&table), g.up(pool), g.poisoned(n * vd));
        let pool_v = StatePool { state: g.d(&pd), slot_stride: per_slot, layer_off: 0, chunks: g.d(&td), max_chunks };
        let recur = cs.recur((g.d(&md), g.d(&pjd), g.d(&od)), pool_v, r.mats_off, n);
        let norm = cs.gated_norm(g.d(&od), g.d(&pjd), g.d(&wd), n, eps);
        let (ql_off, xs_off, total) = q8x_bytes(n, vd);
        let xq = g.zeros::<u8>(total);
        DnRecurNorm { recur: &recur, norm: &norm, xq: Some(g.d(&xq)) }.launch(&mut g.k, &s).unwrap();
        compare("dn_recur_norm_f32", g.seed, &g.down(&od), &want);
        compare("dn_recur_norm_f32", g.seed, &g.down(&pd), &want_pool);
        // The int8 planes as the out projection's GEMV reads them (d q + dl l) against the
        // CPU's quantization of the CPU's output.
        let b = g.down(&xq);
        let d = |i: usize| f32::from_le_bytes(b[xs_off + 8 * (i / 16)..xs_off + 8 * (i / 16) + 4].try_into().unwrap());
        let got: Vec<f32> = (0..n * vd)
            .map(|i| (d(i) * q8x::Q8X_LO).mul_add(b[ql_off + i] as i8 as f32, d(i) * (b[i] as i8 as f32)))
            .collect();
        compare("dn_recur_norm_f32", g.seed, &got, &q8x::dequantized(&want, vd));
        // Without the planes: the same output and states.
        let (pd2, od2) = (g.up(pool), g.poisoned(n * vd));
        let recur2 = DnRecur { out: g.d(&od2), pool: StatePool { state: g.d(&pd2), ..recur.pool }, ..recur };
        let norm2 = DnGatedNorm { o: g.d(&od2), ..norm };
        DnRecurNorm { recur: &recur2, norm: &norm2, xq: None }.launch(&mut g.k, &s).unwrap();
        compare("dn_recur_step_vs_many", g.seed, &g.down(&od2), &g.down(&od));
        compare("dn_recur_step_vs_many", g.seed, &g.down(&pd2), &g.down(&pd));
    }
}

#[test]
fn gated_rmsnorm_per_value_head() {
    let Some(mut g) = gpu("dn_gated_norm") else { return };
    let s = g.dev.stream.clone();
    let (nv, dv, eps) = (4, 128, 1e-6);
    for n in COUNTS {
        let (zoff, zs) = (40, 40 + nv * dv + 8);
        let o = g.randn(n * nv * dv, 3.0);
        let z = g.randn(n * zs, 4.0);
        let w = g.randn(dv, 1.5);
        let (od, zd, wd) = (g.up(&o), g.up(&z), g.up(&w));
        DnGatedNorm {
            o: g.d(&od),
            z: g.d(&zd).offset(zoff),
            z_stride: zs,
            w: g.d(&wd),
            n_tok: n,
            n_v: nv,
            d_v: dv,
            eps,
        }
        .launch(&mut g.k, &s)
        .unwrap();
        let mut want = o.clone();
        for t in 0..n {
            for h in 0..nv {
                let zh = &z[t * zs + zoff + h * dv..t * zs + zoff + (h + 1) * dv];
                gated_rmsnorm(&mut want[(t * nv + h) * dv..(t * nv + h + 1) * dv], zh, &w, eps);
            }
        }
        compare("dn_gated_norm_f32", g.seed, &g.down(&od), &want);
    }
}

/// The gated attention's pre- and post-processing: q (with its gate beside it), k, v from one
/// projection row; q/k head RMSNorm, RoPE on the first `rot` dims, K/V to the F16 cache; then
/// the attention output times sigmoid(gate).
#[test]
fn gated_partial_rope_qkv_post_and_output_gate() {
    let Some(mut g) = gpu("hyb_qkv_post") else { return };
    let s = g.dev.stream.clone();
    let (nh, nkv, eps, max_pos) = (4, 2, 1e-6, 4096);
    for (hd, rot) in [(64, 16), (256, 64)] {
        let n = 9;
        let (qr, kvd) = (2 * nh * hd, nkv * hd);
        let stride = qr + 2 * kvd + 8;
        let proj = g.randn(n * stride, 3.0);
        let (qn, kn) = (g.randn(hd, 1.5), g.randn(hd, 1.5));
        let inv: Vec<f32> = (0..rot / 2).map(|i| 1e7f32.powf(-(2.0 * i as f32) / rot as f32)).collect();
        let all: Vec<usize> = (0..max_pos).collect();
        let (cos, sin) = ops::rope_table(&all, &inv);
        let pos: Vec<usize> = (0..n).map(|i| (i * 397 + 11) % max_pos).collect();
        let kv_rows: Vec<i32> = (0..n as i32).map(|i| (i * 5 + 3) % 32).collect();
        let cache_rows = 32;
        let (pd, qnd, knd, cd, sd) = (g.up(&proj), g.up(&qn), g.up(&kn), g.up(&cos), g.up(&sin));
        let posd = g.up(&pos.iter().map(|&p| p as i32).collect::<Vec<_>>());
        let rowsd = g.up(&kv_rows);
        let (kc, vc) = (g.zeros::<u16>(cache_rows * kvd), g.zeros::<u16>(cache_rows * kvd));
        let qd = g.poisoned(n * nh * hd);
        HybQkvPost {
            proj: g.d(&pd),
            stride,
            q: g.d(&qd),
            store: super::rope_store(
                &g,
                Some((&qnd, &knd)),
                &posd,
                (&cd, &sd, max_pos),
                (&kc, &vc),
                (&rowsd, cache_rows),
            ),
            n_tok: n,
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
            rot,
            gated: true,
            eps,
        }
        .launch(&mut g.k, &s)
        .unwrap();
        // CPU: the steps of HybridCpu::attention.
        let (c, sn) = ops::rope_table(&pos, &inv);
        let half = rot / 2;
        let (mut want_q, mut want_k, mut want_v) = (Vec::new(), Vec::new(), Vec::new());
        for t in 0..n {
            let row = &proj[t * stride..(t + 1) * stride];
            let mut q: Vec<f32> = (0..nh).flat_map(|h| row[2 * h * hd..(2 * h + 1) * hd].to_vec()).collect();
            let mut k = row[qr..qr + kvd].to_vec();
            ops::rmsnorm_heads_inplace(&mut q, &qn, eps);
            ops::rmsnorm_heads_inplace(&mut k, &kn, eps);
            let (cs, ss) = (&c[t * half..(t + 1) * half], &sn[t * half..(t + 1) * half]);
            for head in q.chunks_exact_mut(hd).chain(k.chunks_exact_mut(hd)) {
                ops::rope_token(&mut head[..rot], rot, cs, ss, RopeStyle::Halves);
            }
            want_q.extend(q);
            want_k.push(k);
            want_v.push(row[qr + kvd..qr + 2 * kvd].to_vec());
        }
        compare("hyb_qkv_post_f32", g.seed, &g.down(&qd), &want_q);
        let (kg, vg) = (f16_vals(&g.down(&kc)), f16_vals(&g.down(&vc)));
        let at = |cache: &[f32], t: usize| cache[kv_rows[t] as usize * kvd..(kv_rows[t] as usize + 1) * kvd].to_vec();
        let (gk, gv): (Vec<f32>, Vec<f32>) =
            ((0..n).flat_map(|t| at(&kg, t)).collect(), (0..n).flat_map(|t| at(&vg, t)).collect());
        let round = |v: Vec<Vec<f32>>| f16_vals(&super::f16_bits(&v.concat()));
        compare("hyb_kv_store_f16", g.seed, &gk, &round(want_k));
        compare("hyb_kv_store_f16", g.seed, &gv, &round(want_v));

        let att = g.randn(n * nh * hd, 2.0);
        let ad = g.up(&att);
        GateMul { att: g.d(&ad), proj: g.d(&pd), stride, n_tok: n, n_heads: nh, head_dim: hd }
            .launch(&mut g.k, &s)
            .unwrap();
        let mut want = att.clone();
        for t in 0..n {
            for (e, a) in want[t * nh * hd..(t + 1) * nh * hd].iter_mut().enumerate() {
                let (h, d) = (e / hd, e % hd);
                let gate = proj[t * stride + (2 * h + 1) * hd + d];
                *a *= 1.0 / (1.0 + (-gate).exp());
            }
        }
        compare("hyb_gate_mul_f32", g.seed, &g.down(&ad), &want);
    }
}

/// `dn_conv_prep_f32` (conv + SiLU, q/k L2 norms, gates in one launch) against its CPU twins
/// in order (conv1d_silu, l2norm_inplace and the q scale, gates_inplace), over several
/// sequences with their own conv windows; the projection's q|k|v channels are its first
/// columns, the gates after the z block, as in a layer.
#[test]
fn conv_norm_and_gates_in_one_kernel_equal_the_cpu_steps() {
    let Some(mut g) = gpu("dn_conv_prep") else { return };
    let s = g.dev.stream.clone();
    for cs in
        [Case { nk: 2, nv: 4, dk: 32, dv: 32, tiled: false }, Case { nk: 2, nv: 4, dk: 128, dv: 128, tiled: true }]
    {
        let (c, ps, kk) = (cs.channels(), cs.proj_stride(), 4);
        let n: usize = COUNTS.iter().sum();
        let slots = [3, 0, 5, 1, 4, 2];
        let per_slot = (kk - 1) * c + 5;
        let proj = g.randn(n * ps, 2.0);
        let w = g.randn(c * kk, 0.7);
        let pool = g.randn(6 * per_slot, 1.0);
        let neg_a = decay_rates(&mut g, cs.nv);
        let dt_bias = g.randn(cs.nv, 1.0);
        // CPU: the three steps.
        let (mut want_pool, mut want_proj) = (pool.clone(), proj.clone());
        let mut want = cpu_conv(&proj, ps, &w, (c, kk), (&COUNTS, &slots), &mut want_pool, per_slot, 0);
        cpu_prep(&cs, n, &mut want, &mut want_proj, &neg_a, &dt_bias);
        let table = padded_table(&COUNTS, &slots, 8); // 8 chunks launched, 6 in the table
        let (pjd, wd, pd, td, od) = (g.up(&proj), g.up(&w), g.up(&pool), g.up(&table), g.poisoned(n * c));
        let (nad, dtd) = (g.up(&neg_a), g.up(&dt_bias));
        let pool_v =
            StatePool { state: g.d(&pd), slot_stride: per_slot, layer_off: 0, chunks: g.d(&td), max_chunks: 8 };
        let conv = DnConv {
            x: g.d(&pjd),
            x_stride: ps,
            out: g.d(&od),
            w: g.d(&wd),
            pool: pool_v,
            n_tok: n,
            channels: c,
            kernel: kk,
        };
        let prep = cs.prep(g.d(&od), g.d(&pjd), (g.d(&nad), g.d(&dtd)), n);
        DnConvPrep { conv: &conv, prep: &prep }.launch(&mut g.k, &s).unwrap();
        compare("dn_conv_prep_f32", g.seed, &g.down(&od), &want);
        compare("dn_conv_prep_f32", g.seed, &g.down(&pd), &want_pool);
        compare("dn_conv_prep_f32", g.seed, &g.down(&pjd), &want_proj);
    }
}

/// GPU time of one Gated DeltaNet layer's kernels (conv, prep, recurrence, gated norm; the
/// matmuls excluded) at the linear-layer shape of Qwen3.5-9B / Qwen3-Next (16 key heads and 32
/// value heads of 128, state 32 x 128 x 128 f32 = 2 MB per sequence and layer): decode of 1 and
/// 64 sequences, and one 512-token prefill chunk. Reports the medians of 20 runs and the
/// recurrence's state traffic (read + write) per second.
/// `gpu_parity deltanet_layer_timings -- --ignored --nocapture`.
#[test]
#[ignore]
fn deltanet_layer_timings() {
    let Some(mut g) = gpu("deltanet timings") else { return };
    let s = g.dev.stream.clone();
    let copy = g.dev.copy_bandwidth(1 << 30, 10).unwrap();
    println!("device copy bandwidth (read + write), same run: {:.0} GB/s", copy / 1e9);
    let cs = Case { nk: 16, nv: 32, dk: 128, dv: 128, tiled: true };
    let (c, ps, vd, kk) = (cs.channels(), cs.proj_stride(), cs.nv * cs.dv, 4);
    let per_slot = (kk - 1) * c + cs.nv * cs.mat();
    for (what, counts) in
        [("decode, 1 sequence", vec![1]), ("decode, 64 sequences", vec![1; 64]), ("prefill, 512 tokens", vec![512])]
    {
        let n: usize = counts.iter().sum();
        let slots: Vec<usize> = (0..counts.len()).collect();
        let table = chunk_table(&counts, &slots);
        let (x, mixed) = (g.randn(n * ps, 1.0), g.randn(n * c, 1.0));
        let (xd, md, td) = (g.up(&x), g.up(&mixed), g.up(&table));
        let pool0 = g.randn(counts.len() * per_slot, 0.1);
        let pd = g.up(&pool0);
        let conv_w = g.randn(c * kk, 0.5);
        let (wd, nad, dtd, nwd) =
            (g.up(&conv_w), g.up(&vec![-1f32; cs.nv]), g.up(&vec![0f32; cs.nv]), g.up(&vec![1f32; cs.dv]));
        let od = g.zeros::<f32>(n * vd);
        let pool = StatePool {
            state: g.d(&pd),
            slot_stride: per_slot,
            layer_off: 0,
            chunks: g.d(&td),
            max_chunks: counts.len(),
        };
        let conv =
            DnConv { x: g.d(&xd), x_stride: ps, out: g.d(&md), w: g.d(&wd), pool, n_tok: n, channels: c, kernel: kk };
        let prep = cs.prep(g.d(&md), g.d(&xd), (g.d(&nad), g.d(&dtd)), n);
        let recur = cs.recur((g.d(&md), g.d(&xd), g.d(&od)), pool, (kk - 1) * c, n);
        let norm = cs.gated_norm(g.d(&od), g.d(&xd), g.d(&nwd), n, 1e-6);
        let t_conv = super::bench::time(&mut g, &mut |g| conv.launch(&mut g.k, &s).unwrap());
        let t_prep = super::bench::time(&mut g, &mut |g| prep.launch(&mut g.k, &s).unwrap());
        let t_recur = super::bench::time(&mut g, &mut |g| recur.launch(&mut g.k, &s).unwrap());
        let longest = counts.iter().copied().max().unwrap_or(0);
        if longest > 1 {
            let abd = g.zeros::<f32>(n * cs.nv * DN_AB_ROW);
            let ch = DnChunked { recur: &recur, ab: g.d(&abd), max_count: longest };
            let t = super::bench::time(&mut g, &mut |g| ch.launch(&mut g.k, &s).unwrap());
            println!(
                "deltanet 9B shape, {what}: chunked delta rule {:.1} us ({} + {} blocks) against the step form's {:.1} us ({} blocks)",
                t * 1e6,
                cs.nv * longest.div_ceil(DN_CH),
                cs.nv * cs.dv / dustoff::backend::cuda::ops::deltanet::DN_COLS,
                t_recur * 1e6,
                cs.nv
            );
        }
        let t_norm = super::bench::time(&mut g, &mut |g| norm.launch(&mut g.k, &s).unwrap());
        let state_bytes = (counts.len() * cs.nv * cs.mat() * 4 * 2) as f64;
        // The decode step's fused form: the delta rule, the gated norm and the out
        // projection's int8 input in one launch.
        let xq = g.zeros::<u8>(q8x_bytes(n, vd).2);
        let fused = DnRecurNorm { recur: &recur, norm: &norm, xq: Some(g.d(&xq)) };
        let t_fused = super::bench::time(&mut g, &mut |g| fused.launch(&mut g.k, &s).unwrap());
        let fc = DnConvPrep { conv: &conv, prep: &prep };
        let t_cp = super::bench::time(&mut g, &mut |g| fc.launch(&mut g.k, &s).unwrap());
        println!(
            "deltanet 9B shape, {what}: conv + prep in one launch {:.1} us; delta rule + gated norm + int8 planes in one launch {:.1} us ({:.0} GB/s of state) against {:.1} us apart",
            t_cp * 1e6,
            t_fused * 1e6,
            state_bytes / t_fused / 1e9,
            (t_recur + t_norm) * 1e6
        );
        println!(
            "deltanet 9B shape, {what}: conv {:.1} us, prep {:.1} us, recurrence {:.1} us ({:.0} GB/s of state), gated norm {:.1} us, total {:.1} us per layer",
            t_conv * 1e6,
            t_prep * 1e6,
            t_recur * 1e6,
            state_bytes / t_recur / 1e9,
            t_norm * 1e6,
            (t_conv + t_prep + t_recur + t_norm) * 1e6
        );
    }
}
