//! The engine on the CPU backend with the sample model: greedy outputs do not depend on the slot
//! count, the prefix cache, chunked prefill, submission order or preemption, with the full KV
//! cache and with the 8-bit one (`--kv-cache q8`); a shared prefix is computed once.
//! Generations are short (8 tokens): CI has 2 cores.

mod common;

use std::collections::BTreeMap;

use common::*;
use dustoff::backend::cpu::CpuBackend;
use dustoff::backend::kv_type::KvType;
use dustoff::engine::batch::{
    Completion, Engine, EngineConfig, EngineError, EngineMetrics, Event, FinishReason, Request,
};
use dustoff::engine::sampler::SamplingParams;
use dustoff::model::loader::LoadedModel;

const BLOCK: usize = 16;
/// `<|im_end|>`: ends a chat turn.
const IM_END: u32 = 2;

struct Run {
    slots: usize,
    max_batch_tokens: usize,
    prefix_cache: bool,
    num_blocks: usize,
    reverse: bool,
    kv: KvType,
}

fn engine(m: &LoadedModel, r: &Run) -> Engine<CpuBackend> {
    let b = CpuBackend::new(m.config.clone(), m.weights.clone(), r.num_blocks, BLOCK).with_kv_type(r.kv).unwrap();
    let cfg = EngineConfig {
        slots: r.slots,
        max_batch_tokens: r.max_batch_tokens,
        prefix_cache: r.prefix_cache,
        model_fingerprint: m.fingerprint,
    };
    Engine::new(b, cfg).unwrap()
}

fn request(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { id, prompt, max_tokens, sampling: SamplingParams::greedy(), stop_ids: vec![IM_END] }
}

fn run(m: &LoadedModel, r: &Run, prompts: &[Vec<u32>]) -> (BTreeMap<u64, Completion>, EngineMetrics) {
    let mut e = engine(m, r);
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    if r.reverse {
        order.reverse();
    }
    for i in order {
        e.add_request(request(i as u64, prompts[i].clone(), 8)).unwrap();
    }
    let done = e.run_to_completion().unwrap();
    assert_eq!(done.len(), prompts.len());
    let metrics = e.metrics();
    (done.into_iter().map(|c| (c.id, c)).collect(), metrics)
}

/// Chat prompts (they share the system prompt), raw prompts, and one prompt twice.
fn prompts() -> Vec<Vec<u32>> {
    let cases = read_cases("greedy_cases.jsonl");
    let pick = [
        "chat_sleep_tips",
        "chat_zh_intro",
        "chat_arithmetic",
        "chat_email_extract",
        "chat_news_summary",
        "raw_qa",
        "raw_capital",
        "raw_counting",
        "chat_sleep_tips",
    ];
    pick.iter()
        .map(|id| ids(cases.iter().find(|c| c["id"] == *id).unwrap_or_else(|| panic!("case {id}")), "prompt_ids"))
        .collect()
}

/// A request's output: tokens, finish reason, prompt length.
type Output = (Vec<u32>, FinishReason, usize);

/// Outputs by request (how much of each prompt came from the cache may differ between runs).
fn strip(m: &BTreeMap<u64, Completion>) -> Vec<(u64, Output)> {
    m.iter().map(|(k, c)| (*k, (c.token_ids.clone(), c.finish_reason, c.prompt_tokens))).collect()
}

#[test]
fn greedy_outputs_are_identical_across_slots_prefix_cache_chunking_order_and_preemption() {
    let m = sample_model();
    let p = prompts();
    let base =
        Run { slots: 1, max_batch_tokens: 512, prefix_cache: false, num_blocks: 128, reverse: false, kv: KvType::F16 };
    let (want, m1) = run(&m, &base, &p);
    assert_eq!(m1.preemptions, 0);
    assert!(want.values().all(|c| !c.token_ids.is_empty()));
    assert!(want.values().any(|c| c.finish_reason == FinishReason::Length));
    assert_eq!(want[&0].token_ids, want[&8].token_ids, "the same prompt twice");

    let variants = [
        ("8 slots", Run { slots: 8, ..base }),
        ("8 slots, prefix cache", Run { slots: 8, prefix_cache: true, ..base }),
        ("8 slots, prefix cache, chunked prefill", Run { slots: 8, prefix_cache: true, max_batch_tokens: 24, ..base }),
        ("8 slots, reversed order", Run { slots: 8, prefix_cache: true, reverse: true, ..base }),
        // The longest request needs 10 blocks: 8 slots in 14 blocks must preempt.
        ("8 slots, 14 blocks", Run { slots: 8, prefix_cache: true, num_blocks: 14, ..base }),
    ];
    for (name, r) in &variants {
        let (got, metrics) = run(&m, r, &p);
        assert_eq!(strip(&got), strip(&want), "{name}: outputs differ from 1 slot");
        if r.prefix_cache {
            assert!(metrics.prompt_tokens_cached > 0, "{name}: no prefix reuse: {metrics:?}");
        }
        if r.num_blocks == 14 {
            assert!(metrics.preemptions > 0, "{name}: expected preemptions: {metrics:?}");
        }
        if r.slots == 8 && r.num_blocks == 128 {
            assert!(metrics.avg_running > 1.5, "{name}: slots barely used: {metrics:?}");
        }
    }
}

/// The 8-bit KV cache (the CPU twin of `--kv-cache q8`): a stored K/V row is what the cache
/// reads back, the same whichever step wrote it, so greedy outputs are again identical across
/// slots, prefix reuse, chunked prefill and preemption (a preempted sequence recomputes its
/// rows into the same values).
#[test]
fn q8_kv_greedy_outputs_are_identical_across_slots_prefix_cache_chunking_and_preemption() {
    let m = sample_model();
    let p = prompts();
    let base =
        Run { slots: 1, max_batch_tokens: 512, prefix_cache: false, num_blocks: 128, reverse: false, kv: KvType::Q8 };
    let (want, _) = run(&m, &base, &p);
    assert!(want.values().all(|c| !c.token_ids.is_empty()));
    assert_eq!(want[&0].token_ids, want[&8].token_ids, "the same prompt twice");
    let variants = [
        ("8 slots, prefix cache, chunked prefill", Run { slots: 8, prefix_cache: true, max_batch_tokens: 24, ..base }),
        ("8 slots, 14 blocks", Run { slots: 8, prefix_cache: true, num_blocks: 14, ..base }),
    ];
    for (name, r) in &variants {
        let (got, metrics) = run(&m, r, &p);
        assert_eq!(strip(&got), strip(&want), "{name}: q8 outputs differ from 1 slot");
        assert!(metrics.prompt_tokens_cached > 0, "{name}: no prefix reuse: {metrics:?}");
        if r.num_blocks == 14 {
            assert!(metrics.preemptions > 0, "{name}: expected preemptions: {metrics:?}");
        }
    }
}

#[test]
fn twenty_prompts_sharing_a_300_token_prefix_compute_it_once() {
    let m = sample_model();
    let cases = read_cases("greedy_cases.jsonl");
    let mut prefix: Vec<u32> = ["chat_zh_news_entities", "chat_email_extract"]
        .iter()
        .flat_map(|id| ids(cases.iter().find(|c| c["id"] == *id).unwrap(), "prompt_ids"))
        .collect();
    prefix.truncate(300);
    let unique = 6;
    let prompts: Vec<Vec<u32>> =
        (0..20u32).map(|i| [prefix.clone(), (0..unique).map(|k| 1000 + 37 * i + k).collect()].concat()).collect();
    let r =
        Run { slots: 8, max_batch_tokens: 512, prefix_cache: true, num_blocks: 256, reverse: false, kv: KvType::F16 };
    let mut e = engine(&m, &r);
    for (i, p) in prompts.iter().enumerate() {
        e.add_request(request(i as u64, p.clone(), 2)).unwrap();
    }
    let done = e.run_to_completion().unwrap();
    assert_eq!(done.len(), 20);
    let mt = e.metrics();
    println!("{}", serde_json::to_string(&mt).unwrap());
    assert_eq!(mt.prompt_tokens, 20 * 306);
    // The first request computes all 306 tokens; the others reuse the 18 full blocks of the
    // prefix (288 tokens) and compute the 12-token tail of the prefix and their own 6 tokens.
    let tail = 300 % BLOCK as u64;
    assert_eq!(mt.prompt_tokens_computed, 300 + 20 * unique as u64 + 19 * tail);
    assert_eq!(mt.prompt_tokens_cached, 19 * 288);
    assert!(mt.prefix_waits > 0);
    assert_eq!(mt.kv_blocks_used, 0);
    assert!(mt.kv_blocks_peak <= 19 + 8 * 2, "shared blocks counted once: peak {}", mt.kv_blocks_peak);
}

#[test]
fn engine_streams_tokens_and_refuses_requests_it_could_never_run() {
    let m = sample_model();
    let r = Run { slots: 2, max_batch_tokens: 64, prefix_cache: true, num_blocks: 8, reverse: false, kv: KvType::F16 };
    let mut e = engine(&m, &r);
    let vocab = m.config.vocab_size as u32;
    let refused = [
        request(1, vec![], 4),
        request(2, vec![vocab], 4),
        request(3, vec![5; 8 * BLOCK], 4), // 131 positions in a cache of 128
    ];
    for req in refused {
        let id = req.id;
        assert!(matches!(e.add_request(req), Err(EngineError::InvalidRequest { id: i, .. }) if i == id));
    }
    e.add_request(request(4, vec![504, 3575, 282, 4649, 314], 3)).unwrap();
    assert!(e.add_request(request(4, vec![1], 3)).is_err(), "duplicate id");
    e.add_request(request(5, vec![504], 0)).unwrap();
    let mut streamed = Vec::new();
    let mut finished = Vec::new();
    while e.has_work() {
        for ev in e.step().unwrap() {
            match ev {
                Event::Token { id, index, token } => {
                    assert_eq!((id, index), (4, streamed.len()));
                    streamed.push(token);
                }
                Event::Finished(c) => finished.push(c),
            }
        }
    }
    assert_eq!(finished.len(), 2);
    let c4 = finished.iter().find(|c| c.id == 4).unwrap();
    assert_eq!((c4.prompt_tokens, &c4.token_ids), (5, &streamed));
    let c5 = finished.iter().find(|c| c.id == 5).unwrap();
    assert_eq!((c5.token_ids.len(), c5.finish_reason), (0, FinishReason::Length));
    let mt = e.metrics();
    assert_eq!((mt.requests_finished, mt.generated_tokens), (2, streamed.len() as u64));
}
