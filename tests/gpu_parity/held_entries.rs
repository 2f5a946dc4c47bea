//! A kernel registry held to one model's entries (`Kernels::hold_only`, as a backend holds its
//! own): the entries it keeps load from the cut modules, and an entry of another format still
//! loads (in a module of its own) and computes what the whole module's does. The f32-input
//! GEMV of one token on a Q4_K matrix (held) and a Q4_0 one (not), against the CPU's dot products.

use dustoff::backend::cpu::matmul::matmul;
use dustoff::backend::cuda::compile::model_entries::ModelEntries;
use dustoff::backend::cuda::dmat::Linear;
use dustoff::backend::cuda::ops::qlaunch::GemvQ;
use dustoff::model::quant::{quantize_row, GgmlType};
use dustoff::model::weights::Tensor;

use super::{compare, gpu};

#[test]
fn a_held_registry_loads_its_entries_and_any_other_on_demand() {
    let Some(mut g) = gpu("held registry") else { return };
    g.k.hold_only(ModelEntries::new([GgmlType::Q4K, GgmlType::Q6K], 128));
    g.k.load_all().expect("the held entries load");
    let s = g.dev.stream.clone();
    let (rows, cols) = (96, 512);
    for dtype in [GgmlType::Q4K, GgmlType::Q4_0] {
        let a = (3.0 / cols as f32).sqrt();
        let bytes: Vec<u8> = (0..rows).flat_map(|_| quantize_row(dtype, &g.randn(cols, a))).collect();
        let t = Tensor::from_bytes("w", dtype, rows, cols, bytes);
        let (lin, _) = Linear::upload(&s, &[&t], false, "w").unwrap();
        let x = g.randn(cols, 2.0);
        let mut want = vec![0f32; rows];
        matmul(&t, &x, 1, &mut want);
        let (xd, od) = (g.up(&x), g.poisoned(rows));
        let m = &lin.parts[0];
        GemvQ {
            w: m.quant(&s).unwrap(),
            x: g.d(&xd),
            out: g.d(&od),
            bias: None,
            rows,
            n_tok: 1,
            x_stride: cols,
            out_stride: rows,
            accumulate: false,
            swiglu: false,
            xq: None,
        }
        .launch(&mut g.k, &s)
        .unwrap_or_else(|e| panic!("{dtype}: {e}"));
        compare(&format!("gemv_{}", dtype.name().to_ascii_lowercase()), g.seed, &g.down(&od), &want);
    }
}
