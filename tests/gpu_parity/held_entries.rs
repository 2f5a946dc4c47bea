//! A kernel registry held to one model's entries (`Kernels::hold_only`, as a backend holds its
//! own): the entries it keeps load from the cut modules, and an entry of another format still
//! loads (in a module of its own) and computes what the whole module's does. The f32-input
//! GEMV of one token on a Q4_K matrix (held) and a Q4_0 one (not), against the CPU's dot products.

use dustoff::backend::cpu::matmul::matmul;
use dustoff::backend::cuda::compile::model_entries::{entry_spelling, ModelEntries};
use dustoff::backend::cuda::dmat::Linear;
use dustoff::model::quant::GgmlType;

use super::quant::tensor;
use super::quant_bench::gemv;
use super::{compare, gpu};

#[test]
fn a_held_registry_loads_its_entries_and_any_other_on_demand() {
    let Some(mut g) = gpu("held registry") else { return };
    g.k.hold_only(ModelEntries::new([GgmlType::Q4K, GgmlType::Q6K], 128));
    g.k.load_all().expect("the held entries load");
    let s = g.dev.stream.clone();
    let (rows, cols) = (96, 512);
    for dtype in [GgmlType::Q4K, GgmlType::Q4_0] {
        let t = tensor(&mut g, dtype, "w", rows, cols);
        let (lin, _) = Linear::upload(&s, &[&t], false, "w").unwrap();
        let x = g.randn(cols, 2.0);
        let mut want = vec![0f32; rows];
        matmul(&t, &x, 1, &mut want);
        let (xd, od) = (g.up(&x), g.poisoned(rows));
        let m = &lin.parts[0];
        gemv(m.quant(&s).unwrap(), g.d(&xd), g.d(&od), (rows, cols, 1), false, None)
            .launch(&mut g.k, &s)
            .unwrap_or_else(|e| panic!("{dtype}: {e}"));
        compare(&format!("gemv_{}", entry_spelling(dtype)), g.seed, &g.down(&od), &want);
    }
}
