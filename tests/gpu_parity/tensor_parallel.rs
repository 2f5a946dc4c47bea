//! Tensor parallel on one GPU (`--tensor-parallel N`, `backend::cuda::tp::group`), real
//! models only:
//! - one rank, with the NCCL all-reduce (a real ncclAllReduce over one rank) and with the
//!   host-staged one: logits bit-identical to the plain CUDA backend (prompts long enough for
//!   the cuBLAS prefill path, then GEMV decode steps);
//! - three ranks of the sample model (9 heads / 3 KV heads) sharing cuda:0 through the
//!   host-staged all-reduce: each rank holds a third of the heads, KV cache and FFN columns, and
//!   the logits agree with the plain backend within `TP_TOL` (sums in another order), greedy
//!   choices equal away from near-ties;
//! - without libnccl the NCCL path is a clear error, never a panic;
//! - the tiny MoE and hybrid reference models on two ranks: every layer kind splits.

use dustoff::backend::cuda::tp::group::TpCudaBackend;
use dustoff::backend::cuda::tp::nccl::nccl_version;
use dustoff::backend::cuda::CudaBackend;
use dustoff::backend::Backend;
use dustoff::engine::plan::{SeqChunk, StepPlan};
use dustoff::engine::sampler::argmax;
use dustoff::model::loader::load_model;

use super::{common, gpu, opts, run_greedy, run_steps};

/// Largest |logit difference| allowed between 3 GPU ranks and the plain GPU backend: F16
/// rounding of each rank's partial products (cuBLAS prefill writes F16 tiles, summed after)
/// in place of one rounding of the full product; logits of the sample model span ~20-40.
const TP_TOL: f32 = 0.1;
/// Plain-backend top-2 margin below which a greedy choice counts as a near-tie.
const TAU: f32 = 0.1;

/// Runs `f` on a thread; a test that has not finished within `secs` fails (a hang in a rank
/// group must not stall the GPU suite).
fn within(secs: u64, what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        // The thread ended without finishing: it panicked; rethrow its message.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => std::panic::resume_unwind(h.join().unwrap_err()),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung for {secs} s"),
    }
}

fn prompts() -> Vec<(String, Vec<u32>)> {
    common::read_cases("greedy_cases.jsonl")
        .iter()
        .map(|c| (c["id"].as_str().unwrap().to_string(), common::ids(c, "prompt_ids")))
        .collect()
}

fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn margin(l: &[f32]) -> f32 {
    let best = argmax(l) as usize;
    l[best] - l.iter().enumerate().filter(|(i, _)| *i != best).map(|(_, v)| *v).fold(f32::MIN, f32::max)
}

#[test]
fn one_rank_equals_the_plain_path_with_nccl_and_host_all_reduce() {
    within(120, "one_rank_equals_the_plain_path_with_nccl_and_host_all_reduce", || {
        let Some(g) = gpu("tensor parallel, one rank") else { return };
        drop(g);
        let m = common::sample_model();
        let o = opts(64);
        let mut plain = CudaBackend::new(m.config.clone(), &m.weights, &o).expect("plain backend");
        let cases: Vec<_> = prompts().into_iter().filter(|(_, p)| p.len() > 16).take(3).collect();
        let want: Vec<_> = cases.iter().map(|(_, p)| run_greedy(&mut plain, p, 12)).collect();
        drop(plain);
        for reduction in ["nccl", "host"] {
            let tp = TpCudaBackend::with_reduction(&m.config, &m.weights, &[0], &o, Some(reduction));
            let mut tp = match (tp, nccl_version()) {
                (Ok(b), _) => b,
                (Err(e), Err(missing)) if reduction == "nccl" => {
                    // A machine without NCCL: the NCCL path says so (no panic), the host path runs.
                    assert!(e.to_string().contains("libnccl"), "{e}");
                    eprintln!("NCCL not loadable here ({missing}): the one-rank NCCL run is skipped");
                    continue;
                }
                (Err(e), _) => panic!("{reduction}: {e}"),
            };
            eprintln!("{reduction}: {}", tp.describe());
            if reduction == "nccl" {
                eprintln!("NCCL {}", nccl_version().unwrap());
            }
            for ((id, p), w) in cases.iter().zip(&want) {
                let got = run_greedy(&mut tp, p, 12);
                assert!(same_bits(&got, w), "{reduction}, case {id}: one rank's logits differ from the plain path");
            }
        }
    });
}

#[test]
fn three_ranks_sharing_one_gpu_match_the_plain_path() {
    within(150, "three_ranks_sharing_one_gpu_match_the_plain_path", || {
        let Some(g) = gpu("tensor parallel, three ranks on one GPU") else { return };
        drop(g);
        let m = common::sample_model();
        let o = opts(64);
        let mut plain = CudaBackend::new(m.config.clone(), &m.weights, &o).expect("plain backend");
        let mut tp = TpCudaBackend::new(&m.config, &m.weights, &[0, 0, 0], &o).expect("3 ranks on cuda:0");
        assert!(tp.describe().contains("host-staged all-reduce"), "{}", tp.describe());
        eprintln!("{}", tp.describe());
        let (mut worst, mut compared) = (0f32, 0);
        for (id, p) in prompts().into_iter().take(10) {
            let want = run_greedy(&mut plain, p.as_slice(), 16);
            let got = run_steps(&mut tp, &p, 16, |i, _| argmax(&want[i]));
            for (step, (w, g)) in want.iter().zip(&got).enumerate() {
                let d = max_diff(w, g);
                worst = worst.max(d);
                assert!(d <= TP_TOL, "case {id} step {step}: 3 ranks differ by {d} > {TP_TOL}");
                if margin(w) >= TAU {
                    assert_eq!(argmax(w), argmax(g), "case {id} step {step}: 3 ranks chose another token");
                    compared += 1;
                }
            }
        }
        assert!(compared > 60, "only {compared} greedy choices compared");
        eprintln!("3 ranks on one GPU: largest |logit difference| {worst:e}, {compared} greedy choices equal");

        // Two sequences in one step (the batched attention over each rank's own KV heads).
        let ps = prompts();
        let table = |n: usize, base: u32| (0..n.div_ceil(16) as u32).map(|i| base + i).collect::<Vec<u32>>();
        let chunk = |seq, t: &Vec<u32>, base| SeqChunk {
            seq,
            tokens: t.clone(),
            start_pos: 0,
            block_table: table(t.len(), base),
            want_logits: true,
        };
        let plan = StepPlan::new(vec![chunk(0, &ps[0].1, 0), chunk(1, &ps[1].1, 30)]);
        let (a, b) = (plain.step(&plan).unwrap(), tp.step(&plan).unwrap());
        for (x, y) in a.iter().zip(&b) {
            assert!(max_diff(x, y) <= TP_TOL, "batched step: {}", max_diff(x, y));
            assert_eq!(argmax(x), argmax(y), "batched step: another token");
        }
        let ids = tp.step_greedy(&plan).unwrap();
        assert_eq!(ids.len(), 2, "one greedy id per chunk, from rank 0");
    });
}

/// Every layer kind splits on the GPU (the all-reduce is a hook of the layer walker after every
/// block): the tiny reference models with expert layers (qwen3_moe), Gated DeltaNet and gated
/// attention layers (qwen3_5), and both with shared experts (qwen3_5_moe, qwen3_next), on two
/// ranks sharing cuda:0 (host-staged all-reduce), fed the plain backend's greedy tokens: logits
/// within `TP_TOL`, greedy choices equal away from near-ties; one rank is bit-identical to the
/// plain backend. A 12-token prompt keeps the prefill on the tensor-core GEMM (f32 partial
/// outputs; cuBLAS's F16 tiles would move the sparse layers' inputs by the F16 level, enough to
/// flip a near-tied expert choice, route_flips.rs).
#[test]
fn moe_and_hybrid_models_split_on_one_gpu() {
    within(240, "moe_and_hybrid_models_split_on_one_gpu", || {
        let Some(g) = gpu("tensor parallel, MoE and hybrid") else { return };
        drop(g);
        let prompt = [2046u32, 882, 198, 40, 1041, 264, 300, 17, 45, 9, 77, 512];
        for arch in ["qwen3_moe", "qwen3_5", "qwen3_5_moe", "qwen3_next"] {
            let m = load_model(&common::shared_testdata().join(format!("arch/{arch}/{arch}-f16.gguf"))).unwrap();
            let o = opts(16);
            let mut plain = CudaBackend::new(m.config.clone(), &m.weights, &o).unwrap();
            let want = run_greedy(&mut plain, &prompt, 10);
            drop(plain);
            let mut one = TpCudaBackend::with_reduction(&m.config, &m.weights, &[0], &o, Some("host")).unwrap();
            assert!(
                same_bits(&run_greedy(&mut one, &prompt, 10), &want),
                "{arch}: one rank differs from the plain path"
            );
            drop(one);
            let mut two = TpCudaBackend::new(&m.config, &m.weights, &[0, 0], &o).expect("2 ranks on cuda:0");
            let got = run_steps(&mut two, &prompt, 10, |i, _| argmax(&want[i]));
            let (mut worst, mut compared) = (0f32, 0);
            for (step, (w, g)) in want.iter().zip(&got).enumerate() {
                let d = max_diff(w, g);
                worst = worst.max(d);
                assert!(d <= TP_TOL, "{arch} step {step}: 2 ranks differ by {d} > {TP_TOL}");
                if margin(w) >= TAU {
                    assert_eq!(argmax(w), argmax(g), "{arch} step {step}: 2 ranks chose another token");
                    compared += 1;
                }
            }
            assert!(compared > 0, "{arch}: no greedy choice away from a near-tie");
            eprintln!(
                "{arch}, 2 ranks on one GPU: largest |logit difference| {worst:e}, {compared} greedy choices equal"
            );
        }
    });
}
