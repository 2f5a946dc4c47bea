//! Qwen3.5 (dense hybrid: Gated DeltaNet + gated attention) on the CPU backend, against the
//! transformers float32 references in `../shared/testdata/arch/qwen3_5/` (tiny random model, HF
//! directory and llama.cpp's F16 GGUF of the same weights).
//!
//! Tolerances follow the data's README: argmax equal wherever the reference margin is >= 0.02
//! (smaller ones are near-ties), logits within 2e-3 absolute (they reach about +-30), all 32
//! greedy tokens equal (smallest greedy margin 0.06). The HF and GGUF forms hold the same
//! values (BF16 -> F16 is exact here; the converter wrote 1 + w for the norms and -exp(A_log),
//! and tiled the value heads), so they must agree far more closely than with the reference.

mod common;
#[path = "hybrid_refs/mod.rs"]
mod hybrid_refs;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::*;
use dustoff::backend::Backend;
use dustoff::engine::batch::{Completion, Engine, EngineConfig, EngineMetrics, Request};
use dustoff::engine::plan::{SeqChunk, StepPlan};
use dustoff::engine::sampler::{argmax, SamplingParams};
use dustoff::engine::single::SingleSeq;
use dustoff::model::config::Arch;
use dustoff::model::hybrid::{HeadGrouping, HybridLayer};
use dustoff::model::loader::{load_model, LoadedModel};
use hybrid_refs::{arch_dir, backend, max_abs_diff, prefill_then_decode, refs as read_refs};

const NEAR_TIE: f64 = 0.02;
const LOGIT_TOL: f64 = 2e-3;

fn data_dir() -> PathBuf {
    arch_dir("qwen3_5")
}

fn hf() -> LoadedModel {
    load_model(&data_dir().join("hf")).expect("load the qwen3_5 HF directory")
}

fn gguf() -> LoadedModel {
    load_model(&data_dir().join("qwen3_5-f16.gguf")).expect("load the qwen35 GGUF")
}

fn refs() -> Vec<serde_json::Value> {
    read_refs(&data_dir())
}

fn check_against_refs(m: &LoadedModel, form: &str) {
    let mut worst = 0f64;
    for r in refs() {
        let name = r["name"].as_str().unwrap().to_string();
        let (prompt, greedy) = (ids(&r, "prompt_ids"), ids(&r, "greedy_ids"));
        let tf_argmax = ids(&r, "argmax_ids");
        let tf_margin = floats(&r, "margins");
        let logits = prefill_then_decode(m, &r);
        let d = max_abs_diff(&logits[0], &floats(&r, "prompt_last_logits"));
        assert!(d < LOGIT_TOL, "{form} {name}: prompt_last_logits differ by {d}");
        let d = max_abs_diff(&logits[32], &floats(&r, "last_logits"));
        assert!(d < LOGIT_TOL, "{form} {name}: last_logits differ by {d}");
        // Greedy from the engine's own state equals the reference at every step (the margins
        // are all >= 0.06, checked here so a regenerated file cannot silently weaken the test).
        for (i, &want) in greedy.iter().enumerate() {
            assert!(floats(&r, "greedy_margins")[i] >= NEAR_TIE, "{name}: near-tie in the greedy reference");
            let n = prompt.len() + i - 1;
            assert_eq!(argmax(&logits[i]), want, "{form} {name}: greedy token {i} (position {n})");
        }
        // Teacher forcing over the prompt, one token per step (the decode path), compared with
        // the reference's cache-free pass; the first 8 positions also by their top-5 logits.
        let mut b = backend(m, 16);
        let mut seq = SingleSeq::new(&b, 0, prompt.len()).unwrap();
        let top5: BTreeMap<u64, &serde_json::Value> =
            r["top5"].as_array().unwrap().iter().map(|e| (e["pos"].as_u64().unwrap(), e)).collect();
        let mut checked = 0;
        for (p, &t) in prompt.iter().enumerate() {
            let l = seq.feed(&mut b, &[t]).unwrap();
            if tf_margin[p] >= NEAR_TIE {
                assert_eq!(argmax(&l), tf_argmax[p], "{form} {name}: teacher-forced argmax at position {p}");
                checked += 1;
            }
            if let Some(e) = top5.get(&(p as u64)) {
                for (id, want) in ids(e, "ids").iter().zip(floats(e, "logits")) {
                    let d = (l[*id as usize] as f64 - want).abs();
                    assert!(d < LOGIT_TOL, "{form} {name}: top-5 logit of {id} at position {p} differs by {d}");
                }
            }
            if p + 1 == prompt.len() {
                // Step-by-step and one-chunk prefill reach the same logits.
                let d = max_abs_diff(&l, &floats(&r, "prompt_last_logits"));
                assert!(d < LOGIT_TOL, "{form} {name}: token-by-token prompt logits differ by {d}");
            }
        }
        assert!(checked + 3 >= prompt.len(), "{form} {name}: only {checked} positions had usable margins");
        worst = worst.max(max_abs_diff(&logits[0], &floats(&r, "prompt_last_logits")));
    }
    println!("{form}: largest |logit - transformers| after the prompts: {worst:.2e}");
}

#[test]
fn hf_directory_loads_as_qwen35_and_matches_transformers() {
    let m = hf();
    let c = &m.config;
    let h = c.hybrid.as_ref().expect("hybrid config");
    assert_eq!(c.arch, Arch::Qwen35);
    assert_eq!(h.recurrent, [true, true, false, true, true, false]);
    assert_eq!((h.n_k_heads, h.n_v_heads, h.d_k, h.d_v, h.conv_kernel), (2, 4, 32, 32, 4));
    assert_eq!((h.rotary_dim, h.attn_output_gate, h.grouping), (16, true, HeadGrouping::Interleaved));
    assert_eq!((c.rope_theta, c.tied_embeddings), (1e7, true));
    assert!(matches!(m.weights.layers[0].hybrid, Some(HybridLayer::Linear(_))));
    assert_eq!(m.weights.layers[2].wq.rows, 2 * c.q_dim(), "q and gate from one projection");
    check_against_refs(&m, "hf");
}

#[test]
fn gguf_loads_as_qwen35_and_matches_transformers() {
    let m = gguf();
    let h = m.config.hybrid.as_ref().expect("hybrid config");
    assert_eq!(m.config.arch, Arch::Qwen35);
    assert_eq!(h.recurrent, [true, true, false, true, true, false]);
    assert_eq!((h.rotary_dim, h.attn_output_gate, h.grouping), (16, true, HeadGrouping::Tiled));
    check_against_refs(&m, "gguf");
}

#[test]
fn hf_and_gguf_forms_agree() {
    let (a, b) = (hf(), gguf());
    assert_eq!(
        a.config.hybrid.as_ref().map(|h| h.state_bytes_per_seq()),
        b.config.hybrid.as_ref().map(|h| h.state_bytes_per_seq())
    );
    for r in refs().iter().take(3) {
        let (la, lb) = (prefill_then_decode(&a, r), prefill_then_decode(&b, r));
        for (x, y) in la.iter().zip(&lb) {
            let y: Vec<f64> = y.iter().map(|&v| v as f64).collect();
            let d = max_abs_diff(x, &y);
            assert!(d < 2e-4, "{}: HF and GGUF logits differ by {d}", r["name"]);
        }
    }
}

struct Run {
    slots: usize,
    max_batch_tokens: usize,
    blocks: usize,
    prefix_cache: bool,
    reverse: bool,
}

/// The six reference prompts, then prompt 1 (the chat prompt) twice more: the second copy
/// finds the first's blocks cached without a state snapshot and computes the shared prefix
/// again, stopping there to snapshot it; the third resumes from that snapshot.
fn engine_run(m: &LoadedModel, r: &Run) -> (BTreeMap<u64, Completion>, EngineMetrics) {
    let cfg = EngineConfig {
        slots: r.slots,
        max_batch_tokens: r.max_batch_tokens,
        prefix_cache: r.prefix_cache,
        model_fingerprint: m.fingerprint,
    };
    let mut e = Engine::new(backend(m, r.blocks), cfg).unwrap();
    let mut prompts: Vec<Vec<u32>> = refs().iter().map(|r| ids(r, "prompt_ids")).collect();
    prompts.push(prompts[1].clone());
    prompts.push(prompts[1].clone());
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    if r.reverse {
        order.reverse();
    }
    for i in order {
        let req = Request {
            id: i as u64,
            prompt: prompts[i].clone(),
            max_tokens: 8,
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
        };
        e.add_request(req).unwrap();
    }
    let done = e.run_to_completion().unwrap();
    (done.into_iter().map(|c| (c.id, c)).collect(), e.metrics())
}

#[test]
fn engine_outputs_match_the_reference_across_slots_prefix_reuse_chunking_order_and_preemption() {
    let m = gguf();
    let r = refs();
    let base = Run { slots: 1, max_batch_tokens: 512, blocks: 64, prefix_cache: false, reverse: false };
    let (want, _) = engine_run(&m, &base);
    assert_eq!(want.len(), r.len() + 2);
    for (&i, c) in &want {
        // The last two requests repeat prompt 1.
        let src = if i as usize >= r.len() { 1 } else { i as usize };
        assert_eq!(c.token_ids, ids(&r[src], "greedy_ids")[..8], "request {i}: 1 slot vs transformers");
    }
    let variants = [
        ("1 slot, prefix cache", Run { prefix_cache: true, ..base }),
        ("8 slots", Run { slots: 8, ..base }),
        ("8 slots, prefix cache", Run { slots: 8, prefix_cache: true, ..base }),
        ("8 slots, prefix cache, chunked prefill", Run { slots: 8, prefix_cache: true, max_batch_tokens: 24, ..base }),
        ("8 slots, prefix cache, reversed order", Run { slots: 8, prefix_cache: true, reverse: true, ..base }),
        // The longest request needs 13 blocks; 7 slots in 16 blocks preempt.
        ("7 slots, 16 blocks", Run { slots: 7, blocks: 16, ..base }),
        ("7 slots, 16 blocks, prefix cache", Run { slots: 7, blocks: 16, prefix_cache: true, ..base }),
    ];
    for (name, run) in &variants {
        let (got, mt) = engine_run(&m, run);
        let strip =
            |x: &BTreeMap<u64, Completion>| x.iter().map(|(k, c)| (*k, c.token_ids.clone())).collect::<Vec<_>>();
        assert_eq!(strip(&got), strip(&want), "{name}: outputs differ from 1 slot: {mt:?}");
        if !run.prefix_cache {
            assert_eq!(mt.prompt_tokens_cached, 0, "{name}");
        } else if run.blocks == 64 {
            // The third copy of the chat prompt resumes after its first 2 blocks. (In 16 blocks
            // the cached ones are evicted before they are asked for.)
            assert!(mt.prompt_tokens_cached >= 32, "{name}: no prefix reuse: {mt:?}");
        }
        if run.blocks == 16 {
            assert!(mt.preemptions > 0, "{name}: expected preemptions: {mt:?}");
        }
    }
}

#[test]
fn twenty_prompts_sharing_a_300_token_prefix_resume_from_one_state_snapshot() {
    let m = gguf();
    let r = refs();
    let mut prefix = ids(&r[5], "prompt_ids");
    prefix.extend(ids(&r[4], "prompt_ids"));
    prefix.truncate(300);
    let unique = 6;
    let cfg = EngineConfig { slots: 8, max_batch_tokens: 512, prefix_cache: true, model_fingerprint: m.fingerprint };
    let mut e = Engine::new(backend(&m, 256), cfg).unwrap();
    let mut want = BTreeMap::new();
    for i in 0..20u32 {
        let prompt = [prefix.clone(), (0..unique).map(|k| 100 + 37 * i + k).collect()].concat();
        // Each output checked against a run of its own on a fresh backend.
        let mut b = backend(&m, 32);
        let mut seq = SingleSeq::new(&b, 0, prompt.len() + 2).unwrap();
        let first = argmax(&seq.feed(&mut b, &prompt).unwrap());
        let second = argmax(&seq.feed(&mut b, &[first]).unwrap());
        want.insert(i as u64, vec![first, second]);
        let req = Request { id: i as u64, prompt, max_tokens: 2, sampling: SamplingParams::greedy(), stop_ids: vec![] };
        e.add_request(req).unwrap();
    }
    let got: BTreeMap<u64, Vec<u32>> =
        e.run_to_completion().unwrap().into_iter().map(|c| (c.id, c.token_ids)).collect();
    assert_eq!(got, want);
    let mt = e.metrics();
    println!("{}", serde_json::to_string(&mt).unwrap());
    // The first request computes its 306 tokens; the second finds the 18 shared blocks (288
    // tokens) cached without a state, computes them again and snapshots the state there; the
    // other 18 restore it with the blocks and compute their last 18 tokens.
    assert_eq!(mt.prompt_tokens, 20 * 306);
    assert_eq!(mt.prompt_tokens_computed, 2 * 306 + 18 * 18);
    assert_eq!(mt.prompt_tokens_cached, 18 * 288);
    assert!((mt.prompt_tokens_computed as f64) < 0.35 * mt.prompt_tokens as f64);
}

/// One slot keeps at most 2 snapshots: the third shared prefix evicts the first, whose next
/// prompts compute it again (and snapshot it again) instead of resuming from a dropped state.
#[test]
fn evicted_state_snapshots_are_never_resumed_from() {
    let m = gguf();
    let text = ids(&refs()[5], "prompt_ids");
    let prefix = |g: usize| text[g * 40..g * 40 + 32].to_vec();
    let groups = [0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 0];
    let prompts: Vec<Vec<u32>> = groups
        .iter()
        .enumerate()
        .map(|(i, &g)| [prefix(g), (0..5).map(|k| 300 + 11 * i as u32 + k).collect()].concat())
        .collect();
    let run = |prefix_cache: bool| {
        let cfg = EngineConfig { slots: 1, max_batch_tokens: 512, prefix_cache, model_fingerprint: m.fingerprint };
        let mut e = Engine::new(backend(&m, 64), cfg).unwrap();
        for (i, p) in prompts.iter().enumerate() {
            let req = Request {
                id: i as u64,
                prompt: p.clone(),
                max_tokens: 3,
                sampling: SamplingParams::greedy(),
                stop_ids: vec![],
            };
            e.add_request(req).unwrap();
        }
        let done: BTreeMap<u64, Vec<u32>> =
            e.run_to_completion().unwrap().into_iter().map(|c| (c.id, c.token_ids)).collect();
        (done, e.metrics())
    };
    let (want, _) = run(false);
    let (got, mt) = run(true);
    assert_eq!(got, want);
    // Reused: the third prompt of each group, and the last one (its group was evicted and
    // snapshotted again by the one before it): 4 x 2 blocks.
    assert_eq!(mt.prompt_tokens_cached, 4 * 32, "{mt:?}");
}

/// A backend whose snapshot pool holds one state (as a GPU's planned pool may): the engine
/// evicts before it saves, so when the first group's prefix comes back after the second's its
/// snapshot is gone and that prompt computes the prefix again (and snapshots it again): same
/// outputs as without the prefix cache, one reuse fewer than with an unbounded pool, no error.
#[test]
fn a_full_state_snapshot_pool_degrades_to_recomputing_the_prefix() {
    let m = gguf();
    let text = ids(&refs()[5], "prompt_ids");
    let prefix = |g: usize| text[g * 40..g * 40 + 32].to_vec();
    let groups = [0, 0, 0, 1, 1, 1, 0, 0, 0];
    let prompts: Vec<Vec<u32>> = groups
        .iter()
        .enumerate()
        .map(|(i, &g)| [prefix(g), (0..5).map(|k| 300 + 11 * i as u32 + k).collect()].concat())
        .collect();
    let run = |prefix_cache: bool, pool: usize| {
        let cfg = EngineConfig { slots: 1, max_batch_tokens: 512, prefix_cache, model_fingerprint: m.fingerprint };
        let mut b = backend(&m, 64);
        b.set_state_snapshot_capacity(pool);
        let mut e = Engine::new(b, cfg).unwrap();
        for (i, p) in prompts.iter().enumerate() {
            let req = Request {
                id: i as u64,
                prompt: p.clone(),
                max_tokens: 3,
                sampling: SamplingParams::greedy(),
                stop_ids: vec![],
            };
            e.add_request(req).unwrap();
        }
        let done: BTreeMap<u64, Vec<u32>> =
            e.run_to_completion().unwrap().into_iter().map(|c| (c.id, c.token_ids)).collect();
        (done, e.metrics())
    };
    let (want, _) = run(false, 1);
    let (got, one) = run(true, 1);
    let (unbounded, two) = run(true, usize::MAX);
    assert_eq!(got, want);
    assert_eq!(unbounded, want);
    // Pool of one: the third prompt of groups 0 and 1, and the last two of the returning group
    // (its first computes the prefix again): 4 x 32 tokens. Two snapshots (the engine's cap of
    // 2 per slot): the returning group resumes at once, 5 x 32.
    assert_eq!(one.prompt_tokens_cached, 4 * 32, "{one:?}");
    assert_eq!(two.prompt_tokens_cached, 5 * 32, "{two:?}");
}

#[test]
fn a_chunk_that_does_not_continue_its_recurrent_state_is_refused() {
    let m = gguf();
    let mut b = backend(&m, 4);
    let chunk = |seq, tokens: Vec<u32>, start_pos| SeqChunk {
        seq,
        tokens,
        start_pos,
        block_table: vec![0, 1],
        want_logits: true,
    };
    // A sequence never seen, starting after position 0 (what a prefix-cache hit would plan).
    let e = b.step(&StepPlan { chunks: vec![chunk(7, vec![5, 6], 16)] }).unwrap_err().to_string();
    assert!(e.contains("sequence 7") && e.contains("recurrent state"), "{e}");
    // A gap: 3 tokens absorbed, the next chunk claims to start at 5.
    b.step(&StepPlan { chunks: vec![chunk(1, vec![5, 6, 7], 0)] }).unwrap();
    let e = b.step(&StepPlan { chunks: vec![chunk(1, vec![8], 5)] }).unwrap_err().to_string();
    assert!(e.contains("holds 3 tokens"), "{e}");
    b.step(&StepPlan { chunks: vec![chunk(1, vec![8], 3)] }).unwrap();
    // Released, the sequence has no state to continue from.
    b.release(1);
    assert!(b.step(&StepPlan { chunks: vec![chunk(1, vec![9], 4)] }).is_err());
}

#[test]
fn generate_cli_runs_both_forms() {
    let dir = tmpdir("qwen35-generate");
    let input = dir.join("in.jsonl");
    let r = &refs()[0];
    let prompt: Vec<u32> = ids(r, "prompt_ids");
    std::fs::write(&input, format!("{}\n", serde_json::json!({"id": "a", "prompt_ids": prompt}))).unwrap();
    for (form, model) in [("hf", data_dir().join("hf")), ("gguf", data_dir().join("qwen3_5-f16.gguf"))] {
        let out = dir.join(format!("{form}.jsonl"));
        let st = std::process::Command::new(bin())
            .args(["generate", "--device", "cpu", "--max-tokens", "8", "--model"])
            .arg(&model)
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(&out)
            .output()
            .unwrap();
        assert!(st.status.success(), "{form}: {}", String::from_utf8_lossy(&st.stderr));
        let line: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
        let want: Vec<u32> = ids(r, "greedy_ids").into_iter().take(8).collect();
        assert_eq!(ids(&line, "token_ids"), want, "{form}: generate output");
    }
}

#[test]
fn both_forms_tokenize_the_reference_texts() {
    for m in [hf(), gguf()] {
        for r in refs() {
            let got = m.tokenizer.encode(r["source_text"].as_str().unwrap(), false, true).unwrap();
            let want = ids(&r, "prompt_ids");
            assert_eq!(&got[..want.len().min(got.len())], &want[..], "{}: {}", m.path.display(), r["name"]);
        }
    }
}

/// The official Qwen3.5 releases are vision-language checkpoints: nested `text_config`,
/// tensors under `model.language_model.`, plus `model.visual.*` and `mtp.*`. The fixture's
/// tensors rewritten in that layout (3 shards) load as the same text model.
#[test]
fn vision_language_layout_loads_its_text_model() {
    use dustoff::model::safetensors::{write_checkpoint, SafetensorsDir, StMeta, StWriteTensor};
    let src = data_dir().join("hf");
    let dir = tmpdir("qwen35-vl");
    let st = SafetensorsDir::open(&src).unwrap();
    let mut tensors = Vec::new();
    for name in st.names() {
        let (_, shape, bytes) = st.read(name).unwrap();
        let (_, info) = st.get(name).unwrap();
        assert_eq!(info.dtype, "BF16");
        let renamed = format!("model.language_model.{}", name.strip_prefix("model.").unwrap());
        let meta = StMeta { name: renamed, dtype: "BF16", shape: shape.to_vec() };
        tensors.push(StWriteTensor { meta, data: bytes.to_vec().into() });
    }
    for extra in ["model.visual.patch_embed.proj.weight", "model.visual.merger.linear_fc1.weight", "mtp.fc.weight"] {
        let meta = StMeta { name: extra.into(), dtype: "BF16", shape: vec![2, 2] };
        tensors.push(StWriteTensor { meta, data: vec![0u8; 8].into() });
    }
    write_checkpoint(&dir, &tensors, 3).unwrap();
    let mut text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let o = text.as_object_mut().unwrap();
    o.remove("architectures");
    let tied = o.remove("tie_word_embeddings").unwrap();
    let vl = serde_json::json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "tie_word_embeddings": tied, "text_config": text, "vision_config": {"depth": 2, "hidden_size": 16},
    });
    std::fs::write(dir.join("config.json"), vl.to_string()).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let (vl, flat) = (load_model(&dir).unwrap(), hf());
    assert_eq!(vl.config, flat.config);
    let r = &refs()[1];
    let (a, b) = (prefill_then_decode(&vl, r), prefill_then_decode(&flat, r));
    assert_eq!(a, b, "the same weights under another layout give the same logits");
}
