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

use common::*;
use dustoff::backend::Backend;
use dustoff::engine::batch::{Completion, Engine, EngineConfig, EngineMetrics, Request};
use dustoff::engine::plan::{SeqChunk, StateOp, StatePlan, StepPlan};
use dustoff::engine::sampler::{argmax, SamplingParams};
use dustoff::engine::single::SingleSeq;
use dustoff::model::config::Arch;
use dustoff::model::hybrid::{HeadGrouping, HybridLayer};
use dustoff::model::loader::LoadedModel;
use hybrid_refs::{
    backend, check_against_refs_with, engine_run, forms_agree, vision_language_layout_matches, Fixture, Run,
};

const FIXTURE: Fixture = Fixture { dir: "qwen3_5", gguf: "qwen3_5-f16.gguf" };

/// The shared reference checks, with this file's bound on near-ties: all but three prompt
/// positions have a usable margin.
fn check_against_refs(m: &LoadedModel, form: &str) {
    check_against_refs_with(m, &FIXTURE.refs(), form, |checked, len| checked + 3 >= len);
}

#[test]
fn hf_directory_loads_as_qwen35_and_matches_transformers() {
    let m = FIXTURE.hf();
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
    let m = FIXTURE.gguf();
    let h = m.config.hybrid.as_ref().expect("hybrid config");
    assert_eq!(m.config.arch, Arch::Qwen35);
    assert_eq!(h.recurrent, [true, true, false, true, true, false]);
    assert_eq!((h.rotary_dim, h.attn_output_gate, h.grouping), (16, true, HeadGrouping::Tiled));
    check_against_refs(&m, "gguf");
}

#[test]
fn hf_and_gguf_forms_agree() {
    forms_agree(&FIXTURE.hf(), &FIXTURE.gguf(), &FIXTURE.refs());
}

#[test]
fn engine_outputs_match_the_reference_across_slots_prefix_reuse_chunking_order_and_preemption() {
    let m = FIXTURE.gguf();
    let r = FIXTURE.refs();
    let base = Run { slots: 1, max_batch_tokens: 512, blocks: 64, prefix_cache: false, reverse: false };
    let (want, _) = engine_run(&m, &r, &base);
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
        let (got, mt) = engine_run(&m, &r, run);
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
    let m = FIXTURE.gguf();
    let r = FIXTURE.refs();
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

/// Prompt `i` of prefix group `groups[i]`: 32 tokens of reference prompt 5 (from `40 g` on)
/// and 5 of its own, run in one slot, 3 tokens each, on a backend whose snapshot pool holds
/// `pool` states. The outputs by request id and the engine's metrics.
fn grouped_prefix_run(
    m: &LoadedModel,
    groups: &[usize],
    prefix_cache: bool,
    pool: usize,
) -> (BTreeMap<u64, Vec<u32>>, EngineMetrics) {
    let text = ids(&FIXTURE.refs()[5], "prompt_ids");
    let prefix = |g: usize| text[g * 40..g * 40 + 32].to_vec();
    let cfg = EngineConfig { slots: 1, max_batch_tokens: 512, prefix_cache, model_fingerprint: m.fingerprint };
    let mut b = backend(m, 64);
    b.set_state_snapshot_capacity(pool);
    let mut e = Engine::new(b, cfg).unwrap();
    for (i, &g) in groups.iter().enumerate() {
        let prompt = [prefix(g), (0..5).map(|k| 300 + 11 * i as u32 + k).collect()].concat();
        let req = Request { id: i as u64, prompt, max_tokens: 3, sampling: SamplingParams::greedy(), stop_ids: vec![] };
        e.add_request(req).unwrap();
    }
    let done = e.run_to_completion().unwrap().into_iter().map(|c| (c.id, c.token_ids)).collect();
    (done, e.metrics())
}

/// One slot keeps at most 2 snapshots: the third shared prefix evicts the first, whose next
/// prompts compute it again (and snapshot it again) instead of resuming from a dropped state.
#[test]
fn evicted_state_snapshots_are_never_resumed_from() {
    let m = FIXTURE.gguf();
    let groups = [0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 0];
    let run = |prefix_cache: bool| grouped_prefix_run(&m, &groups, prefix_cache, usize::MAX);
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
    let m = FIXTURE.gguf();
    let groups = [0, 0, 0, 1, 1, 1, 0, 0, 0];
    let run = |prefix_cache: bool, pool: usize| grouped_prefix_run(&m, &groups, prefix_cache, pool);
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

/// Steps that run out of device memory (injected from step `at` on, for steps of 2 or more
/// sequences, with 2 or 3 slots) while sequences resume from state snapshots and others snapshot
/// a prefix: the
/// engine retries with fewer sequences, and every output equals the run without faults (a
/// restore is sent again after a failed step, a failed step's snapshot does not count; a lost
/// restore would make the backend refuse the sequence's next chunk).
#[test]
fn out_of_memory_steps_neither_lose_a_restore_nor_keep_a_failed_snapshot() {
    let m = FIXTURE.gguf();
    let r = FIXTURE.refs();
    let mut text = ids(&r[5], "prompt_ids");
    text.extend(ids(&r[4], "prompt_ids"));
    assert!(text.len() >= 128, "{} reference tokens", text.len());
    // 3 groups of 4 prompts: 48 shared tokens (3 blocks), 5 of their own.
    let prompts: Vec<Vec<u32>> = (0..12u32)
        .map(|i| {
            let g = i as usize / 4;
            [text[g * 40..g * 40 + 48].to_vec(), (0..5).map(|k| 300 + 11 * i + k).collect()].concat()
        })
        .collect();
    let run = |slots: usize, inject: Option<u64>| {
        let cfg = EngineConfig { slots, max_batch_tokens: 512, prefix_cache: true, model_fingerprint: m.fingerprint };
        let b = backend(&m, 64);
        let b: Box<dyn Backend> = match inject {
            Some(at) => Box::new(dustoff::backend::fault::FaultInjector::new(b, at, 2)),
            None => Box::new(b),
        };
        let mut e = Engine::new(b, cfg).unwrap();
        for (i, prompt) in prompts.iter().enumerate() {
            let prompt = prompt.clone();
            let req =
                Request { id: i as u64, prompt, max_tokens: 3, sampling: SamplingParams::greedy(), stop_ids: vec![] };
            e.add_request(req).unwrap();
        }
        let done: BTreeMap<u64, Vec<u32>> =
            e.run_to_completion().unwrap().into_iter().map(|c| (c.id, c.token_ids)).collect();
        (done, e.metrics())
    };
    let (want, clean) = run(4, None);
    assert!(clean.prompt_tokens_cached > 0, "no prefix reuse: {clean:?}");
    let mut cached = 0;
    for (slots, at) in [2, 3].into_iter().flat_map(|s| (1..=12).map(move |at| (s, at))) {
        let (got, mt) = run(slots, Some(at));
        assert_eq!(got, want, "{slots} slots, out of memory from step {at}");
        assert!(mt.oom_recoveries > 0, "{slots} slots, step {at}: {mt:?}");
        cached += mt.prompt_tokens_cached;
    }
    assert!(cached > 0, "no run with faults reused a prefix");
}

#[test]
fn a_chunk_that_does_not_continue_its_recurrent_state_is_refused() {
    let m = FIXTURE.gguf();
    let mut b = backend(&m, 4);
    // Every chunk on state slot 0; `zero`: the slot is zeroed first (a sequence's start).
    let step = |b: &mut dustoff::backend::cpu::CpuBackend, seq, tokens: Vec<u32>, start_pos, zero: bool| {
        let chunk = SeqChunk { seq, tokens, start_pos, block_table: vec![0, 1], want_logits: true };
        let before = if zero { vec![StateOp::Zero { slot: 0 }] } else { vec![] };
        b.step(&StepPlan { chunks: vec![chunk], state: StatePlan { slots: vec![0], before, after: vec![] } })
    };
    // A sequence never seen, starting after position 0 (what a prefix-cache hit would plan).
    let e = step(&mut b, 7, vec![5, 6], 16, false).unwrap_err().to_string();
    assert!(e.contains("sequence 7") && e.contains("recurrent state"), "{e}");
    // A gap: 3 tokens absorbed, the next chunk claims to start at 5.
    step(&mut b, 1, vec![5, 6, 7], 0, true).unwrap();
    let e = step(&mut b, 1, vec![8], 5, false).unwrap_err().to_string();
    assert!(e.contains("holds 3 tokens"), "{e}");
    step(&mut b, 1, vec![8], 3, false).unwrap();
    // Released (its slot zeroed for another sequence), the sequence has no state to continue from.
    step(&mut b, 2, vec![5], 0, true).unwrap();
    assert!(step(&mut b, 1, vec![9], 4, false).is_err());
}

#[test]
fn generate_cli_runs_both_forms() {
    FIXTURE.generate_cli_both_forms("qwen35-generate");
}

#[test]
fn both_forms_tokenize_the_reference_texts() {
    FIXTURE.both_forms_tokenize_refs();
}

/// The official Qwen3.5 releases are vision-language checkpoints: nested `text_config`,
/// tensors under `model.language_model.`, plus `model.visual.*` and `mtp.*`. The fixture's
/// tensors rewritten in that layout (3 shards) load as the same text model.
#[test]
fn vision_language_layout_loads_its_text_model() {
    let extras = ["model.visual.patch_embed.proj.weight", "model.visual.merger.linear_fc1.weight", "mtp.fc.weight"];
    let (class, model_type) = ("Qwen3_5ForConditionalGeneration", "qwen3_5");
    vision_language_layout_matches(&FIXTURE, &tmpdir("qwen35-vl"), &extras, 3, class, model_type);
}
