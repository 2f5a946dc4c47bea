//! Tensor parallel on the CPU (`--tensor-parallel N`): N rank backends, each holding its shard
//! of the heads, KV cache and FFN columns, summing their partial outputs after every block's two
//! output projections. Real models only: the sample model (9 heads / 3 KV heads: N = 1 and 3),
//! the qwen3_moe reference model (4 / 2 heads, 8 experts: N = 1 and 2) and the hybrid reference
//! models (2 KV heads, 2 linear key heads / 4 value heads: N = 2) in both their forms.
//!
//! - N = 1 runs the whole rank path (threads, all-reduce, residual rule) and must give logits
//!   bit-identical to the plain backend.
//! - N > 1 adds the same products in a different order (each rank's dot products over its
//!   columns, then the ranks' sums), so logits differ by rounding: they must agree within
//!   `LOGIT_TOL`, and greedy tokens must be equal up to the plain backend's first near-tie.

mod common;

use common::*;

use dustoff::backend::cpu::tensor_parallel::tp_cpu_group;
use dustoff::backend::cpu::CpuBackend;
use dustoff::backend::rank_group::RankGroup;
use dustoff::backend::Backend;
use dustoff::engine::plan::{SeqChunk, StateOp, StatePlan, StepPlan};
use dustoff::engine::sampler::argmax;
use dustoff::engine::single::SingleSeq;
use dustoff::model::loader::{load_model, LoadedModel};

/// Largest |logit difference| allowed between N ranks and the plain backend (logits of these
/// models span about 20-40; measured: 7e-5 on the sample model with N = 3, 2.3e-5 on qwen3_moe
/// with N = 2: f32 rounding of the reordered sums).
const LOGIT_TOL: f32 = 1e-3;
/// Top-2 margin of the plain backend's logits below which a greedy choice is a near-tie.
const TAU: f32 = 0.02;
const BLOCKS: usize = 64;
const BS: usize = 16;

fn qwen3_moe() -> LoadedModel {
    load_model(&shared_testdata().join("arch/qwen3_moe/qwen3_moe-f16.gguf")).expect("load qwen3_moe reference")
}

fn plain(m: &LoadedModel) -> CpuBackend {
    CpuBackend::new(m.config.clone(), m.weights.clone(), BLOCKS, BS)
}

fn tp(m: &LoadedModel, n: usize) -> RankGroup {
    tp_cpu_group(&m.config, &m.weights, n, BLOCKS, BS).expect("model splits")
}

fn margin(l: &[f32]) -> f32 {
    let best = argmax(l);
    let second = l.iter().enumerate().filter(|(i, _)| *i as u32 != best).map(|(_, v)| *v).fold(f32::MIN, f32::max);
    l[best as usize] - second
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Teacher-forced run of `prompt` then `n` greedy tokens of `reference` on both backends: per
/// step the logits of both. The tokens fed are the reference's own choices.
fn logits_side_by_side(
    reference: &mut dyn Backend,
    other: &mut dyn Backend,
    prompt: &[u32],
    n: usize,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut a = SingleSeq::new(reference, 0, prompt.len() + n + 1).unwrap();
    let mut b = SingleSeq::new(other, 0, prompt.len() + n + 1).unwrap();
    let (mut la, mut lb) = (a.feed(reference, prompt).unwrap(), b.feed(other, prompt).unwrap());
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&la);
        out.push((la, lb));
        la = a.feed(reference, &[t]).unwrap();
        lb = b.feed(other, &[t]).unwrap();
    }
    out.push((la, lb));
    out
}

fn sample_prompts() -> Vec<(String, Vec<u32>)> {
    read_cases("greedy_cases.jsonl")
        .iter()
        .map(|c| (c["id"].as_str().unwrap().to_string(), ids(c, "prompt_ids")))
        .collect()
}

#[test]
fn one_rank_gives_the_plain_backends_logits_bit_for_bit() {
    let m = sample_model();
    let (mut p, mut t) = (plain(&m), tp(&m, 1));
    for (id, prompt) in sample_prompts().into_iter().take(3) {
        for (step, (a, b)) in logits_side_by_side(&mut p, &mut t, &prompt, 12).iter().enumerate() {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "case {id} step {step}: N=1 logits differ (max |d| {})", max_diff(a, b));
        }
    }
    let m = qwen3_moe();
    let (mut p, mut t) = (plain(&m), tp(&m, 1));
    for (step, (a, b)) in logits_side_by_side(&mut p, &mut t, &[2046, 882, 198, 40, 1041], 10).iter().enumerate() {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "qwen3_moe step {step}: N=1 differs");
    }
}

/// Teacher-forced `steps` greedy steps after each prompt on both backends: every step's logits
/// within `LOGIT_TOL`, the same greedy choice away from near-ties. Returns the largest
/// difference and the choices compared.
fn compare_split(
    p: &mut dyn Backend,
    t: &mut dyn Backend,
    prompts: &[(String, Vec<u32>)],
    steps: usize,
) -> (f32, usize) {
    let (mut worst, mut compared) = (0f32, 0);
    for (id, prompt) in prompts {
        for (step, (a, b)) in logits_side_by_side(p, t, prompt, steps).iter().enumerate() {
            let d = max_diff(a, b);
            worst = worst.max(d);
            assert!(d <= LOGIT_TOL, "{id} step {step}: split logits differ by {d} > {LOGIT_TOL}");
            if margin(a) >= TAU {
                assert_eq!(argmax(a), argmax(b), "{id} step {step}: the split chose another token");
                compared += 1;
            }
        }
    }
    (worst, compared)
}

#[test]
fn three_ranks_match_the_plain_backend_on_the_sample_model() {
    let m = sample_model();
    let (mut p, mut t) = (plain(&m), tp(&m, 3));
    assert!(t.describe().starts_with("3 x tensor parallel"), "{}", t.describe());
    let (worst, compared) = compare_split(&mut p, &mut t, &sample_prompts(), 16);
    assert!(compared > 50, "only {compared} greedy choices compared");
    eprintln!("sample model, N=3: largest |logit difference| {worst:e} over {compared} greedy choices");
}

#[test]
fn free_running_greedy_with_three_ranks_equals_one_backend() {
    // Free-running (each backend feeds back its own choices), as `generate` does.
    let m = sample_model();
    let (mut p, mut t) = (plain(&m), tp(&m, 3));
    for (id, prompt) in sample_prompts().into_iter().take(3) {
        let a = free_greedy(&mut p, 0, &prompt, prompt.len() + 24, 24);
        let b = free_greedy(&mut t, 0, &prompt, prompt.len() + 24, 24);
        assert_eq!(a, b, "case {id}: free-running greedy differs with 3 ranks");
    }
}

#[test]
fn two_ranks_split_the_experts_of_qwen3_moe() {
    let m = qwen3_moe();
    let (mut p, mut t) = (plain(&m), tp(&m, 2));
    let prompts = [vec![2046u32, 882, 198, 40, 1041, 264], vec![2045, 17, 300, 1200, 45, 9, 77, 512]];
    let prompts: Vec<_> = prompts.into_iter().enumerate().map(|(i, p)| (format!("qwen3_moe prompt {i}"), p)).collect();
    let (worst, compared) = compare_split(&mut p, &mut t, &prompts, 16);
    assert!(compared > 20, "only {compared} choices compared");
    eprintln!("qwen3_moe, N=2: largest |logit difference| {worst:e} over {compared} greedy choices");
}

/// Each hybrid reference model in both of its forms: the GGUF (tiled value heads for qwen3_5*,
/// regrouped qkvz for qwen3_next) and the Hugging Face directory (value heads interleaved).
fn hybrid_models() -> Vec<(String, LoadedModel)> {
    let mut v = Vec::new();
    for arch in ["qwen3_5", "qwen3_5_moe", "qwen3_next"] {
        let dir = shared_testdata().join("arch").join(arch);
        for (form, path) in [("gguf", dir.join(format!("{arch}-f16.gguf"))), ("hf", dir.join("hf"))] {
            let m = load_model(&path).unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
            v.push((format!("{arch} {form}"), m));
        }
    }
    v
}

#[test]
fn two_ranks_split_the_linear_attention_heads_of_hybrid_models() {
    // Each rank holds one of the 2 linear key heads with its value heads (and their recurrent
    // state), one of the 2 KV heads of the gated attention layers, half of every FFN or expert.
    let prompts = [vec![2046u32, 882, 198, 40, 1041, 264], vec![2045, 17, 300, 1200, 45, 9, 77, 512, 33]];
    for (name, m) in hybrid_models() {
        let h = m.config.hybrid.as_ref().expect("a hybrid model");
        assert_eq!((h.n_k_heads, m.config.n_kv_heads), (2, 2), "{name}");
        let (mut p, mut t) = (plain(&m), tp(&m, 2));
        let prompts: Vec<_> =
            prompts.iter().enumerate().map(|(i, p)| (format!("{name} prompt {i}"), p.clone())).collect();
        let (worst, compared) = compare_split(&mut p, &mut t, &prompts, 12);
        assert!(compared > 10, "{name}: only {compared} choices compared");
        // A sequence resumed from a saved recurrent state (prefix reuse) continues as the
        // unbroken one: every rank saved, and restores, its own heads' state (the plan's slot
        // orders, as the engine's state pool gives them).
        let prompt = &prompts[1].1;
        let table: Vec<u32> = (0..4).collect();
        let one = |b: &mut dyn Backend, seq, tokens: &[u32], start_pos, state| {
            let chunk =
                SeqChunk { seq, tokens: tokens.to_vec(), start_pos, block_table: table.clone(), want_logits: true };
            b.step(&StepPlan { chunks: vec![chunk], state }).unwrap().pop().unwrap()
        };
        let on = |slot, before, after| StatePlan { slots: vec![slot], before, after };
        for (b, what) in [(&mut p as &mut dyn Backend, "plain"), (&mut t, "2 ranks")] {
            let cut = 5;
            // Sequence 0 on slot 0; its state after `cut` tokens is saved in slot 1.
            let (zero, save) = (StateOp::Zero { slot: 0 }, StateOp::Copy { from: 0, to: 1 });
            one(b, 0, &prompt[..cut], 0, on(0, vec![zero], vec![save]));
            let unbroken = one(b, 0, &prompt[cut..], cut, on(0, vec![], vec![]));
            // Sequence 1 on slot 2, restored from slot 1 (a step refuses a slot that does not
            // hold exactly `cut` tokens).
            let restore = StateOp::Copy { from: 1, to: 2 };
            let resumed = one(b, 1, &prompt[cut..], cut, on(2, vec![restore], vec![]));
            assert!(max_diff(&unbroken, &resumed) <= LOGIT_TOL, "{name} {what}: resumed state differs");
        }
        eprintln!("{name}, N=2: largest |logit difference| {worst:e} over {compared} greedy choices");
    }
}

#[test]
fn a_batched_step_of_two_sequences_matches() {
    // Two sequences in one step, with their own block tables: each rank's KV cache of its heads
    // is paged like the plain one.
    let m = sample_model();
    let (mut p, mut t) = (plain(&m), tp(&m, 3));
    let prompts = sample_prompts();
    let (a, b) = (&prompts[0].1, &prompts[1].1);
    let chunk = |seq, tokens: &[u32], table: Vec<u32>| SeqChunk {
        seq,
        tokens: tokens.to_vec(),
        start_pos: 0,
        block_table: table,
        want_logits: true,
    };
    let ta: Vec<u32> = (0..a.len().div_ceil(BS) as u32).collect();
    let tb: Vec<u32> = (0..b.len().div_ceil(BS) as u32).map(|i| 40 - i).collect();
    let plan = StepPlan::new(vec![chunk(0, a, ta), chunk(1, b, tb)]);
    let (lp, lt) = (p.step(&plan).unwrap(), t.step(&plan).unwrap());
    assert_eq!(lt.len(), 2);
    for (x, y) in lp.iter().zip(&lt) {
        assert!(max_diff(x, y) <= LOGIT_TOL, "batched step: {}", max_diff(x, y));
        assert_eq!(argmax(x), argmax(y));
    }
}

#[test]
fn splits_that_do_not_fit_are_refused_with_the_reason() {
    let m = sample_model();
    let e = tp_cpu_group(&m.config, &m.weights, 2, BLOCKS, BS).err().expect("2 does not divide 3 KV heads");
    assert!(e.to_string().contains("3 KV heads") && e.to_string().contains("possible: 1, 3"), "{e}");
    let e = tp_cpu_group(&m.config, &m.weights, 0, BLOCKS, BS).err().unwrap();
    assert!(e.to_string().contains("--tensor-parallel 0"), "{e}");
    let hy = load_model(&shared_testdata().join("arch/qwen3_5/qwen3_5-f16.gguf")).unwrap();
    // 2 KV heads and 2 linear key heads: 4 splits neither.
    let e = tp_cpu_group(&hy.config, &hy.weights, 4, BLOCKS, BS).err().expect("4 does not divide 2 key heads");
    assert!(e.to_string().contains("2 key heads") && e.to_string().contains("possible: 1, 2"), "{e}");
    // One rank of a hybrid model is the plain model, recurrent states included.
    let (mut p, mut t) = (plain(&hy), tp_cpu_group(&hy.config, &hy.weights, 1, BLOCKS, BS).unwrap());
    let prompt = [2046u32, 882, 198, 40, 1041, 264, 300];
    assert_eq!(free_greedy(&mut p, 0, &prompt, 40, 12), free_greedy(&mut t, 0, &prompt, 40, 12));
}

fn dustoff_out(args: &[&str]) -> std::process::Output {
    dustoff_cmd(args, &[]).output().expect("start dustoff")
}

#[test]
fn generate_and_run_with_three_cpu_ranks_write_the_plain_output() {
    let p = ["generate", "--device", "cpu", "--prompt", "The capital of France is", "--max-tokens", "24"];
    let plain = dustoff_out(&p);
    let split = dustoff_out(&[&p[..], &["--tensor-parallel", "3"]].concat());
    assert!(plain.status.success() && split.status.success(), "{}", String::from_utf8_lossy(&split.stderr));
    assert!(!plain.stdout.is_empty());
    assert_eq!(plain.stdout, split.stdout, "generate --tensor-parallel 3 printed another text");
    assert!(String::from_utf8_lossy(&split.stderr).contains("3 x tensor parallel"));

    let dir = tmpdir("tp-run");
    let pipeline = short_pipeline(&dir);
    let input = dir.join("in.jsonl");
    let news = std::fs::read_to_string(repo().join("samples/news.jsonl")).unwrap();
    std::fs::write(&input, news.lines().take(4).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let (a, b) = (dir.join("plain.jsonl"), dir.join("tp.jsonl"));
    for (out, extra) in [(&a, &[][..]), (&b, &["--tensor-parallel", "3"][..])] {
        let (pl, i, o) = (pipeline.to_str().unwrap(), input.to_str().unwrap(), out.to_str().unwrap());
        let args = [&["run", pl, "--input", i, "--output", o, "--device", "cpu", "--slots", "2", "--quiet"][..], extra]
            .concat();
        let r = dustoff_out(&args);
        assert!(r.status.success(), "run {extra:?}: {}", String::from_utf8_lossy(&r.stderr));
    }
    let (ta, tb) = (std::fs::read_to_string(&a).unwrap(), std::fs::read_to_string(&b).unwrap());
    assert_eq!(ta.lines().count(), 4);
    assert_eq!(ta, tb, "run --tensor-parallel 3 wrote other rows");
}

#[test]
fn bad_tensor_parallel_flags_are_usage_errors() {
    let base = ["generate", "--device", "cpu", "--prompt", "x", "--max-tokens", "2", "--tensor-parallel"];
    for (n, says) in [("2", "N must divide 3"), ("0", "--tensor-parallel 0")] {
        let r = dustoff_out(&[&base[..], &[n]].concat());
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
    }
    let out = tmpdir("tp-usage").join("never.jsonl");
    let r = dustoff_out(&[
        "run",
        "summarize",
        "--input",
        "samples/news.jsonl",
        "--output",
        out.to_str().unwrap(),
        "--device",
        "cpu",
        "--engines",
        "2",
        "--tensor-parallel",
        "3",
    ]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(err.contains("leave out --engines"), "{err}");
    assert!(!out.exists(), "a refused run writes no output");
}

/// Runs `f` on a thread and fails if it has not finished within `secs` (a hang is a failure,
/// not a stuck test run).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs)).unwrap_or_else(|_| panic!("{what}: hung for {secs} s"))
}

#[test]
fn a_threaded_rank_group_of_cpu_ranks_matches_the_plain_backend() {
    within(240, "rank group", || {
        let m = sample_model();
        let mut p = plain(&m);
        let mut one = tp(&m, 1);
        let prompts = sample_prompts();
        for (id, prompt) in prompts.iter().take(2) {
            for (step, (a, b)) in logits_side_by_side(&mut p, &mut one, prompt, 8).iter().enumerate() {
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{id} step {step}: group of 1");
            }
        }
        drop(one); // the rank threads end
        let mut three = tp(&m, 3);
        assert!(three.describe().starts_with("3 x tensor parallel (host all-reduce)"), "{}", three.describe());
        let (worst, compared) = compare_split(&mut p, &mut three, &prompts[..3], 8);
        assert!(compared > 10, "{compared}");
        // Greedy steps through the group (rank 0 chooses) equal the plain backend's.
        let a = free_greedy(&mut p, 0, &prompts[0].1, prompts[0].1.len() + 12, 12);
        let b = free_greedy(&mut three, 0, &prompts[0].1, prompts[0].1.len() + 12, 12);
        assert_eq!(a, b);
        eprintln!("group of 3 CPU ranks: largest |logit difference| {worst:e}");
    });
}

#[test]
fn a_rank_that_fails_to_load_fails_the_group_without_a_hang() {
    let m = sample_model();
    let cfg = m.config.clone();
    let e = within(60, "failing rank", move || {
        let (c, w) = (cfg.clone(), m.weights.clone());
        let build = move |rank: usize| -> Result<CpuBackend, dustoff::backend::BackendError> {
            match rank {
                1 => Err(dustoff::backend::BackendError::Plan("rank 1 cannot load".into())),
                2 => panic!("rank 2 panics while loading"),
                _ => Ok(CpuBackend::new(c.clone(), w.clone(), 4, BS)),
            }
        };
        RankGroup::start(&cfg, 3, 0, "host", build, |_, _| Ok(())).err().map(|e| e.to_string())
    });
    let e = e.expect("the group must not start");
    assert!(e.contains("rank 1") && e.contains("cannot load") || e.contains("rank 2") && e.contains("panic"), "{e}");
}

/// The GB figure of a `bench --plan` line starting with `label`.
fn plan_gb(out: &str, label: &str) -> f64 {
    let line = out.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no '{label}' line in:\n{out}"));
    line[label.len()..].split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn bench_splits_a_loaded_model_and_plans_one_gpus_share() {
    let base = ["bench", "--plan", "--batch", "64"];
    let (one, three) = (dustoff_out(&base), dustoff_out(&[&base[..], &["--tensor-parallel", "3"]].concat()));
    assert!(one.status.success() && three.status.success(), "{}", String::from_utf8_lossy(&three.stderr));
    let (one, three) = (String::from_utf8_lossy(&one.stdout), String::from_utf8_lossy(&three.stdout));
    assert!(three.contains("tensor parallel 3: the plan of one GPU's rank"), "{three}");
    // 64 sequences of 968 positions: each rank caches a third of the KV heads.
    let (kv1, kv3) = (plan_gb(&one, "KV cache"), plan_gb(&three, "KV cache"));
    assert!(kv1 > 1.0 && (kv1 / 3.0 - kv3).abs() <= 0.011, "KV {kv1} GB on one GPU, {kv3} GB per rank of 3");
    let (w1, w3) = (plan_gb(&one, "weights"), plan_gb(&three, "weights"));
    assert!(w3 < w1, "weights {w1} GB on one GPU, {w3} GB per rank of 3");
    // One stream on three CPU ranks runs and says so.
    let r = dustoff_out(&[
        "bench",
        "--device",
        "cpu",
        "--tensor-parallel",
        "3",
        "--prompt-tokens",
        "16",
        "--gen-tokens",
        "4",
        "--runs",
        "1",
        "--json",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("bench --json");
    assert!(v["device"].as_str().unwrap().starts_with("3 x tensor parallel"), "{v}");
    // A synthetic shape has no host weights to split: a usage error that says what to do.
    let r = dustoff_out(&["bench", "--synthetic", "qwen3-8b", "--tensor-parallel", "2"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("dustoff synth"));
}

/// `bench --plan --shared-prefix R,S,U` plans the job's sequences (S + U + generated positions
/// each), as `--batch` with prompts of S + U does (it planned --prompt-tokens' 768 instead).
#[test]
fn bench_plans_the_shared_prefix_jobs_sequences() {
    let sp = dustoff_out(&["bench", "--plan", "--shared-prefix", "16,1000,200", "--slots", "8"]);
    let batch = dustoff_out(&["bench", "--plan", "--batch", "8", "--prompt-tokens", "1200"]);
    assert!(sp.status.success() && batch.status.success(), "{}", String::from_utf8_lossy(&sp.stderr));
    let (sp, batch) = (String::from_utf8_lossy(&sp.stdout), String::from_utf8_lossy(&batch.stdout));
    let (a, b) = (plan_gb(&sp, "KV cache"), plan_gb(&batch, "KV cache"));
    assert!(a > 0.0 && a == b, "KV {a} GB planned for the shared-prefix job, {b} GB for 8 x 1,400 positions:\n{sp}");
}
