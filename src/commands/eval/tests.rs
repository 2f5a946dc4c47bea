//! Batched windows against one window at a time on the CPU backend, with the sample model.

use std::path::PathBuf;

use super::scorer_cpu::CpuHead;
use super::windows::{batch_rows, scored_from, STEP_TOKENS};
use super::{run, EvalArgs, BUILTIN_TEXT};
use crate::backend::kv_type::KvType;
use crate::model::loader::{load_model, SAMPLE_MODEL};

fn sample() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(SAMPLE_MODEL)
}

/// Four windows of 40, 17, 33 and 5 tokens in steps of 16 tokens a window: the second step
/// holds a one-token chunk between two longer ones (the GPU lays those out first), the last
/// window ends in the first step. Each window's head input at its scored positions is the
/// same, to the bit, as when it runs alone in one step.
#[test]
fn batched_windows_give_each_window_the_head_input_it_has_alone() {
    let m = load_model(&sample()).unwrap();
    let ids = m.tokenizer.encode(BUILTIN_TEXT, false, false).unwrap();
    let (ctx, dim) = (48, m.config.dim);
    let windows: Vec<&[u32]> = vec![&ids[..40], &ids[40..57], &ids[57..90], &ids[90..95]];
    let mut batched = CpuHead::new(&m, ctx, windows.len(), KvType::F16).unwrap();
    let got = batch_rows(&mut batched, &windows, ctx, 16).unwrap();
    let mut alone = CpuHead::new(&m, ctx, 1, KvType::F16).unwrap();
    for (i, w) in windows.iter().enumerate() {
        let want = batch_rows(&mut alone, &[w], ctx, STEP_TOKENS).unwrap().remove(0);
        assert_eq!(want.len(), (w.len() - 1 - scored_from(w.len())) * dim, "window {i}: rows of the scored positions");
        assert!(got[i] == want, "window {i} of {} tokens: batched head input differs", w.len());
    }
    // Rows of different windows differ (a mix-up between sequences would not go unseen).
    assert!(got[0][..dim] != got[2][..dim]);
}

/// `eval` itself: 1 window at a time and 4 at a time (two batches, the second ragged) give
/// the same perplexities, KL statistics and top-1 agreement, with the 8-bit cache on the
/// scored model so the KL is not trivially zero.
#[test]
fn eval_numbers_do_not_depend_on_the_batch_of_windows() {
    let args = |batch_windows| EvalArgs {
        models: vec![sample()],
        reference: Some(sample()),
        text: Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md")),
        ctx: 32,
        max_tokens: 200,
        kv_type: KvType::Q8,
        batch_windows,
        ..EvalArgs::default()
    };
    let one = run(&args(1)).unwrap();
    let four = run(&args(4)).unwrap();
    assert!(one.windows >= 6, "{} windows: two batches of 4 wanted", one.windows);
    assert_eq!((one.batch_windows, four.batch_windows), (1, 4));
    let kl = one.models[0].kl_divergence.as_ref().unwrap();
    assert!(kl.mean > 0.0 && kl.mean.is_finite(), "{kl:?}");
    let strip = |s: &super::EvalSummary| {
        let mut v = serde_json::to_value(s).unwrap();
        v.as_object_mut().unwrap().remove("batch_windows");
        v
    };
    assert_eq!(strip(&one), strip(&four));
}

#[test]
fn a_batch_of_no_windows_or_too_many_is_refused() {
    for n in [0, 257] {
        let e = run(&EvalArgs { models: vec![sample()], batch_windows: n, ..EvalArgs::default() }).unwrap_err();
        assert!(e.to_string().contains("--batch-windows must be 1..=256"), "{e}");
    }
}
