//! The engine core without a model: the KV block pool (hand-computed block ids, in the style of a
//! block-manager test suite, and random operation sequences under proptest) and the scheduler
//! (token budget, contiguous chunked prefill, preemption, shared-prefix waits).

use std::collections::HashMap;

use dustoff::engine::kv::{chain_hash, KvCache, KvError};
use dustoff::engine::plan::SeqId;
use dustoff::engine::scheduler::{Scheduler, SchedulerConfig};
use proptest::prelude::*;

const FP: [u8; 32] = [7; 32];

fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
    r.collect()
}

fn ok(kv: &KvCache) {
    assert_eq!(kv.check_invariants(), Ok(()));
}

// ---------------------------------------------------------------- block pool, hand-computed

#[test]
fn allocate_takes_blocks_from_the_free_list_front() {
    let mut kv = KvCache::new(8, 4, FP, true);
    assert_eq!(kv.allocate(1, &toks(0..10)), Ok(0));
    assert_eq!(kv.block_table(1), Some(&[0, 1, 2][..]));
    assert_eq!(kv.allocate(2, &toks(100..104)), Ok(0));
    assert_eq!(kv.block_table(2), Some(&[3][..]));
    assert_eq!((kv.num_free(), kv.num_used(), kv.peak_used()), (4, 4, 4));
    assert_eq!(kv.allocate(2, &toks(0..1)), Err(KvError::SeqExists(2)));
    ok(&kv);
}

#[test]
fn freed_prefix_is_reused_and_the_partial_block_is_reused_first() {
    let mut kv = KvCache::new(8, 4, FP, true);
    let a = toks(0..10);
    kv.allocate(1, &a).unwrap(); // [0, 1, 2]
    kv.mark_computed(1, &a, 10).unwrap(); // blocks 0, 1 full and named; 2 holds 2 tokens
    assert!(kv.is_cached(0) && kv.is_cached(1) && !kv.is_cached(2));
    kv.free(1).unwrap();
    // Free list: unnamed 2 at the front, then 3..7, then the named chain tail first: 1, 0.
    assert_eq!(kv.num_cached_free(), 2);
    let mut b = toks(0..8);
    b.extend([50, 51, 52]);
    let m = kv.lookup_prefix(&b);
    assert_eq!((m.blocks.clone(), m.cached_tokens, m.pending_on), (vec![0, 1], 8, None));
    assert_eq!(kv.allocate(2, &b), Ok(8));
    assert_eq!(kv.block_table(2), Some(&[0, 1, 2][..]));
    assert_eq!(kv.num_free(), 5);
    assert_eq!(kv.evictions(), 0);
    ok(&kv);
}

#[test]
fn hit_is_capped_one_token_short_of_the_prompt() {
    let mut kv = KvCache::new(8, 4, FP, true);
    let a = toks(0..8);
    kv.allocate(1, &a).unwrap(); // [0, 1]
    kv.mark_computed(1, &a, 8).unwrap();
    kv.free(1).unwrap(); // free list: 2..7, 1, 0
                         // The same 8 tokens: only block 0 may be reused, block 1 is recomputed for the logits.
    assert_eq!(kv.allocate(2, &a), Ok(4));
    assert_eq!(kv.block_table(2), Some(&[0, 2][..]));
    // 9 tokens: both full blocks are reusable.
    let mut c = a.clone();
    c.push(9);
    assert_eq!(kv.allocate(3, &c), Ok(8));
    assert_eq!(kv.block_table(3), Some(&[0, 1, 3][..]));
    assert_eq!(kv.ref_count(0), 2);
    ok(&kv);
}

#[test]
fn eviction_takes_chain_tails_first() {
    let mut kv = KvCache::new(6, 4, FP, true);
    let a = toks(0..12);
    kv.allocate(1, &a).unwrap(); // [0, 1, 2]
    kv.mark_computed(1, &a, 12).unwrap();
    kv.free(1).unwrap(); // free list: 3, 4, 5, 2, 1, 0
    kv.allocate(2, &toks(100..116)).unwrap(); // takes 3, 4, 5 and evicts 2, the chain tail
    assert_eq!(kv.block_table(2), Some(&[3, 4, 5, 2][..]));
    assert_eq!(kv.evictions(), 1);
    assert!(kv.is_cached(0) && kv.is_cached(1) && !kv.is_cached(2));
    let mut b = toks(0..8);
    b.push(99);
    assert_eq!(kv.lookup_prefix(&b).blocks, vec![0, 1]);
    ok(&kv);
}

#[test]
fn shared_blocks_are_ref_counted() {
    let mut kv = KvCache::new(8, 4, FP, true);
    let a = toks(0..9);
    kv.allocate(1, &a).unwrap(); // [0, 1, 2]
    kv.mark_computed(1, &a, 9).unwrap();
    assert_eq!(kv.allocate(2, &a), Ok(8));
    assert_eq!(kv.block_table(2), Some(&[0, 1, 3][..]));
    assert_eq!((kv.ref_count(0), kv.ref_count(1), kv.ref_count(2), kv.ref_count(3)), (2, 2, 1, 1));
    kv.free(1).unwrap();
    assert_eq!((kv.ref_count(0), kv.ref_count(2)), (1, 0));
    assert_eq!(kv.num_free(), 5);
    kv.free(2).unwrap();
    assert_eq!(kv.num_free(), 8);
    assert_eq!(kv.num_cached_free(), 2);
    assert_eq!(kv.free(2), Err(KvError::UnknownSeq(2)));
    ok(&kv);
}

#[test]
fn prefix_being_computed_is_pending_until_its_blocks_are_named() {
    let mut kv = KvCache::new(8, 4, FP, true);
    let a = toks(0..12);
    kv.allocate(1, &a).unwrap();
    let mut b = toks(0..12);
    b.push(77);
    let m = kv.lookup_prefix(&b);
    assert_eq!((m.cached_tokens, m.pending_on), (0, Some(1)));
    kv.mark_computed(1, &a, 6).unwrap(); // block 0 done, block 1 half
    let m = kv.lookup_prefix(&b);
    assert_eq!((m.blocks.clone(), m.pending_on), (vec![0], Some(1)));
    kv.mark_computed(1, &a, 12).unwrap();
    let m = kv.lookup_prefix(&b);
    assert_eq!((m.blocks.clone(), m.pending_on), (vec![0, 1, 2], None));
    // A sequence that is freed before computing drops its promises.
    kv.allocate(2, &toks(200..208)).unwrap();
    assert_eq!(kv.lookup_prefix(&toks(200..209)).pending_on, Some(2));
    kv.free(2).unwrap();
    assert_eq!(kv.lookup_prefix(&toks(200..209)).pending_on, None);
    ok(&kv);
}

#[test]
fn a_block_computed_twice_stays_unnamed_and_is_reused_first() {
    let mut kv = KvCache::new(8, 4, FP, true);
    let a = toks(0..5);
    kv.allocate(1, &a).unwrap(); // [0, 1]
    kv.allocate(2, &a).unwrap(); // [2, 3]: nothing computed yet, no hit
    kv.mark_computed(1, &a, 5).unwrap();
    kv.mark_computed(2, &a, 5).unwrap();
    assert!(kv.is_cached(0) && !kv.is_cached(2));
    kv.free(2).unwrap(); // 3 and 2 unnamed: to the front
    kv.free(1).unwrap();
    assert_eq!(kv.num_cached_free(), 1);
    kv.allocate(3, &toks(90..95)).unwrap();
    assert_eq!(kv.block_table(3), Some(&[1, 2][..]));
    ok(&kv);
}

#[test]
fn prefix_cache_off_never_names_blocks() {
    let mut kv = KvCache::new(8, 4, FP, false);
    let a = toks(0..9);
    kv.allocate(1, &a).unwrap();
    kv.mark_computed(1, &a, 9).unwrap();
    kv.free(1).unwrap();
    assert_eq!(kv.allocate(2, &a), Ok(0));
    assert_eq!(kv.num_cached_free(), 0);
    ok(&kv);
}

#[test]
fn with_state_points_a_hit_ends_where_a_recurrent_state_was_saved() {
    // Hybrid models: the K/V of 2 blocks are cached, but only the state after block 0 is known.
    let mut kv = KvCache::new(8, 4, FP, true);
    kv.require_state_points();
    let a = toks(0..10);
    kv.allocate(1, &a).unwrap(); // [0, 1, 2]
    kv.mark_computed(1, &a, 10).unwrap();
    let m = kv.lookup_prefix(&a);
    assert_eq!((m.shared_tokens, m.cached_tokens), (8, 0), "no state point: nothing reusable");
    kv.add_state_point(kv.block_hash(1, 0).unwrap());
    let m = kv.lookup_prefix(&a);
    assert_eq!((m.shared_tokens, m.cached_tokens, m.blocks), (8, 4, vec![0]));
    kv.add_state_point(kv.block_hash(1, 1).unwrap());
    assert_eq!(kv.lookup_prefix(&a).cached_tokens, 8);
    kv.remove_state_point(&kv.block_hash(1, 0).unwrap());
    kv.remove_state_point(&kv.block_hash(1, 1).unwrap());
    // The second sequence computes blocks 0 and 1 again into fresh blocks (they stay unnamed).
    assert_eq!(kv.allocate(2, &a), Ok(0));
    assert_eq!(kv.block_table(2), Some(&[3, 4, 5][..]));
    ok(&kv);
}

#[test]
fn append_position_takes_a_block_at_block_boundaries() {
    let mut kv = KvCache::new(3, 4, FP, true);
    kv.allocate(1, &toks(0..4)).unwrap(); // [0], full
    kv.allocate(2, &toks(10..17)).unwrap(); // [1, 2], one position left
    assert!(kv.may_append(2));
    kv.append_position(2).unwrap();
    assert_eq!(kv.num_positions(2), Some(8));
    assert!(!kv.may_append(2), "block 2 is full and none is free");
    assert!(!kv.may_append(1));
    assert_eq!(kv.append_position(1), Err(KvError::OutOfBlocks { seq: 1, needed: 1, free: 0 }));
    kv.free(2).unwrap();
    assert!(kv.may_append(1));
    kv.append_position(1).unwrap(); // 2 and 1 went back to the front (unnamed), 1 first
    assert_eq!(kv.block_table(1), Some(&[0, 1][..]));
    assert!(!kv.can_allocate(&toks(0..9), 0));
    ok(&kv);
}

#[test]
fn chain_hash_depends_on_parent_fingerprint_and_tokens() {
    let h = chain_hash(&[0; 32], &FP, &[1, 2, 3, 4]);
    assert_ne!(h, chain_hash(&[1; 32], &FP, &[1, 2, 3, 4]));
    assert_ne!(h, chain_hash(&[0; 32], &[8; 32], &[1, 2, 3, 4]));
    assert_ne!(h, chain_hash(&[0; 32], &FP, &[1, 2, 4, 3]));
    // A different model never hits another model's blocks.
    let mut kv = KvCache::new(4, 4, FP, true);
    let a = toks(0..5);
    kv.allocate(1, &a).unwrap();
    kv.mark_computed(1, &a, 5).unwrap();
    assert_eq!(kv.lookup_prefix(&a).cached_tokens, 4);
    let other = KvCache::new(4, 4, [8; 32], true);
    assert_eq!(other.lookup_prefix(&a).cached_tokens, 0);
}

// ---------------------------------------------------------------- block pool, random operations

#[derive(Clone, Debug)]
enum Op {
    /// Allocate sequence `seq % 6` with prompt variant `prompt`, of `len` tokens.
    Allocate {
        seq: u8,
        prompt: u8,
        len: u8,
    },
    AppendPosition {
        seq: u8,
    },
    /// Compute up to `n` more positions of the sequence.
    Compute {
        seq: u8,
        n: u8,
    },
    Free {
        seq: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..6, 0u8..4, 1u8..20).prop_map(|(seq, prompt, len)| Op::Allocate { seq, prompt, len }),
        (0u8..6).prop_map(|seq| Op::AppendPosition { seq }),
        (0u8..6, 1u8..12).prop_map(|(seq, n)| Op::Compute { seq, n }),
        (0u8..6).prop_map(|seq| Op::Free { seq }),
    ]
}

/// Prompt variants share prefixes (tokens from a tiny alphabet) so that hits, partial hits and
/// duplicates all happen.
fn prompt(variant: u8, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| if i < 5 { i % 3 } else { (i * (variant as u32 + 1)) % 3 }).collect()
}

struct Shadow {
    /// What the simulated backend wrote: per block, per offset, the token whose K/V is there.
    content: Vec<Vec<Option<u32>>>,
    /// Per live sequence: its tokens (positions beyond the prompt get token 9) and computed count.
    seqs: HashMap<SeqId, (Vec<u32>, usize)>,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_invariants_and_hits_hold_the_right_tokens(
        num_blocks in 1usize..16,
        block_size in 1usize..5,
        prefix_cache in any::<bool>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut kv = KvCache::new(num_blocks, block_size, FP, prefix_cache);
        let mut sh = Shadow { content: vec![vec![None; block_size]; num_blocks], seqs: HashMap::new() };
        for op in ops {
            match op {
                Op::Allocate { seq, prompt: v, len } => {
                    let seq = seq as SeqId;
                    let p = prompt(v, len as usize);
                    let can = kv.can_allocate(&p, 0);
                    let m = kv.lookup_prefix(&p);
                    match kv.allocate(seq, &p) {
                        Ok(cached) => {
                            prop_assert!(can && !sh.seqs.contains_key(&seq));
                            prop_assert_eq!(cached, m.cached_tokens);
                            prop_assert!(cached < p.len() && cached.is_multiple_of(block_size));
                            prop_assert!(prefix_cache || cached == 0);
                            let table = kv.block_table(seq).unwrap();
                            prop_assert_eq!(table.len(), p.len().div_ceil(block_size));
                            // Every reused position holds this prompt's token.
                            for (pos, &t) in p.iter().enumerate().take(cached) {
                                let b = table[pos / block_size] as usize;
                                prop_assert_eq!(sh.content[b][pos % block_size], Some(t), "pos {}", pos);
                            }
                            sh.seqs.insert(seq, (p, cached));
                        }
                        Err(KvError::SeqExists(_)) => prop_assert!(sh.seqs.contains_key(&seq)),
                        Err(KvError::OutOfBlocks { .. }) => prop_assert!(!can),
                        Err(e) => prop_assert!(false, "unexpected {}", e),
                    }
                }
                Op::AppendPosition { seq } => {
                    let seq = seq as SeqId;
                    let may = kv.may_append(seq);
                    match kv.append_position(seq) {
                        Ok(()) => {
                            prop_assert!(may);
                            sh.seqs.get_mut(&seq).unwrap().0.push(9);
                        }
                        Err(_) => prop_assert!(!may),
                    }
                }
                Op::Compute { seq, n } => {
                    let seq = seq as SeqId;
                    if let Some((t, done)) = sh.seqs.get_mut(&seq) {
                        let end = (*done + n as usize).min(t.len());
                        let table = kv.block_table(seq).unwrap();
                        for (pos, &tok) in t.iter().enumerate().take(end).skip(*done) {
                            sh.content[table[pos / block_size] as usize][pos % block_size] = Some(tok);
                        }
                        *done = end;
                        kv.mark_computed(seq, t, end).unwrap();
                    } else {
                        prop_assert!(kv.mark_computed(seq, &[], 0).is_err());
                    }
                }
                Op::Free { seq } => {
                    let seq = seq as SeqId;
                    prop_assert_eq!(kv.free(seq).is_ok(), sh.seqs.remove(&seq).is_some());
                }
            }
            prop_assert_eq!(kv.check_invariants(), Ok(()));
            for (seq, (t, _)) in &sh.seqs {
                prop_assert_eq!(kv.num_positions(*seq), Some(t.len()));
            }
        }
    }
}

// ---------------------------------------------------------------- scheduler

/// The stand-in for sampling: a deterministic function of the sequence and its length, so a
/// recomputed sequence must produce exactly the tokens an unbroken one would.
fn fake_token(id: SeqId, len: usize) -> u32 {
    ((id as usize * 31 + len * 7) % 11) as u32
}

struct SimResult {
    outputs: HashMap<SeqId, Vec<u32>>,
    preemptions: u64,
    prompt_tokens_computed: u64,
    prefix_waits: u64,
    steps: u64,
}

/// Runs requests to completion through the scheduler, checking every plan.
fn simulate(cfg: SchedulerConfig, num_blocks: usize, bs: usize, prefix: bool, reqs: &[(Vec<u32>, usize)]) -> SimResult {
    simulate_forced(cfg, num_blocks, bs, prefix, reqs, 0)
}

/// `simulate`, with `forced` more tokens appended after each sampled one (as a grammar's forced
/// tokens are): they must run as part of the next chunks, in KV positions reserved for them.
fn simulate_forced(
    cfg: SchedulerConfig,
    num_blocks: usize,
    bs: usize,
    prefix: bool,
    reqs: &[(Vec<u32>, usize)],
    forced: usize,
) -> SimResult {
    let mut s = Scheduler::new(cfg, KvCache::new(num_blocks, bs, FP, prefix));
    for (i, (p, _)) in reqs.iter().enumerate() {
        s.add(i as SeqId, p.clone()).unwrap();
    }
    let mut outputs: HashMap<SeqId, Vec<u32>> = HashMap::new();
    // Next position each sequence must start at: contiguous chunks, restarting only after a
    // preemption (then at a cached prefix, a multiple of the block size).
    let mut next: HashMap<SeqId, usize> = HashMap::new();
    // What the simulated backend wrote: per block, per offset, the token whose K/V is there.
    let mut content = vec![vec![None; bs]; num_blocks];
    let mut guard = 0;
    while s.has_work() {
        guard += 1;
        assert!(guard < 100_000, "no progress");
        // Sequences admitted by this step (new, or back after a preemption, possibly in this very
        // step) may start at any cached block boundary: another sequence may have computed more
        // of the same prompt than they had.
        let admitted: std::collections::HashSet<SeqId> = s.waiting().map(|q| q.id).collect();
        let preemptions = s.stats().preemptions;
        let plan = s.schedule().unwrap();
        let preempted_now = s.stats().preemptions > preemptions;
        assert!(!plan.chunks.is_empty(), "work left but nothing scheduled");
        assert!(plan.n_tokens() <= cfg.max_batch_tokens, "budget exceeded");
        assert!(plan.chunks.len() <= cfg.slots, "slots exceeded");
        let mut seen = std::collections::HashSet::new();
        for c in &plan.chunks {
            assert!(seen.insert(c.seq), "sequence twice in a step");
            assert!(!c.tokens.is_empty());
            let seq = s.get(c.seq).unwrap();
            // A new or re-admitted sequence starts at its cached prefix (whole blocks).
            let expect = next.get(&c.seq).copied().unwrap_or(0);
            let restart =
                c.start_pos.is_multiple_of(bs) && (admitted.contains(&c.seq) || preempted_now || c.start_pos < expect);
            assert!(c.start_pos == expect || restart, "seq {} chunk at {} after {expect}", c.seq, c.start_pos);
            assert_eq!(c.start_pos, seq.num_computed);
            // Everything before the chunk is in the cache, holding this sequence's tokens.
            for p in 0..c.start_pos {
                let b = c.block_table[p / bs] as usize;
                assert_eq!(content[b][p % bs], Some(seq.tokens[p]), "seq {} position {p}", c.seq);
            }
            assert_eq!(&seq.tokens[c.start_pos..c.start_pos + c.tokens.len()], &c.tokens[..]);
            assert!(c.block_table.len() * bs >= c.start_pos + c.tokens.len());
            assert_eq!(c.want_logits, c.start_pos + c.tokens.len() == seq.tokens.len());
            next.insert(c.seq, c.start_pos + c.tokens.len());
        }
        for c in &plan.chunks {
            for (i, &t) in c.tokens.iter().enumerate() {
                let p = c.start_pos + i;
                content[c.block_table[p / bs] as usize][p % bs] = Some(t);
            }
        }
        assert_eq!(s.kv().check_invariants(), Ok(()));
        s.on_step_done(&plan).unwrap();
        for c in plan.chunks.iter().filter(|c| c.want_logits) {
            let seq = s.get(c.seq).unwrap();
            let (id, len) = (seq.id, seq.tokens.len());
            let want = reqs[id as usize].1;
            let out = outputs.entry(id).or_default();
            let new: Vec<u32> = (0..=forced).map(|j| fake_token(id, len + j)).take(want - out.len()).collect();
            out.extend(&new);
            if out.len() == want {
                s.finish(id).unwrap();
            } else {
                for t in new {
                    s.append_token(id, t).unwrap();
                }
            }
        }
        assert_eq!(s.kv().check_invariants(), Ok(()));
    }
    assert_eq!(s.kv().num_used(), 0);
    let st = s.stats();
    SimResult {
        outputs,
        preemptions: st.preemptions,
        prompt_tokens_computed: st.prompt_tokens_computed,
        prefix_waits: st.prefix_waits,
        steps: st.steps,
    }
}

fn expected_output(id: SeqId, prompt_len: usize, n: usize) -> Vec<u32> {
    (0..n).map(|k| fake_token(id, prompt_len + k)).collect()
}

#[test]
fn token_budget_and_slots_are_respected_with_chunked_prefill() {
    let reqs: Vec<(Vec<u32>, usize)> = (0..10).map(|i| (toks(i * 100..i * 100 + 37 + i), 5)).collect();
    let cfg = SchedulerConfig { slots: 3, max_batch_tokens: 16, watermark_blocks: 0 };
    let r = simulate(cfg, 64, 4, true, &reqs);
    for (i, (p, n)) in reqs.iter().enumerate() {
        assert_eq!(r.outputs[&(i as SeqId)], expected_output(i as SeqId, p.len(), *n));
    }
    assert_eq!(r.preemptions, 0);
    let prompt_total: u64 = reqs.iter().map(|(p, _)| p.len() as u64).sum();
    assert_eq!(r.prompt_tokens_computed, prompt_total);
    // 415 prompt tokens at 16 per step take at least 26 steps.
    assert!(r.steps >= prompt_total.div_ceil(16));
}

#[test]
fn preemption_requeues_the_newest_sequence_with_its_generated_tokens() {
    // 4 blocks of 4: two sequences of 6 prompt tokens (2 blocks each) fill the pool; the first
    // decode that crosses a block boundary preempts the newest one.
    let cfg = SchedulerConfig { slots: 2, max_batch_tokens: 64, watermark_blocks: 0 };
    let mut s = Scheduler::new(cfg, KvCache::new(4, 4, FP, false));
    s.add(1, toks(0..6)).unwrap();
    s.add(2, toks(10..16)).unwrap();
    let plan = s.schedule().unwrap();
    assert_eq!(plan.chunks.len(), 2);
    s.on_step_done(&plan).unwrap();
    for id in [1, 2] {
        s.append_token(id, 100 + id as u32).unwrap();
    }
    // Position 6 fits in the second blocks.
    let plan = s.schedule().unwrap();
    assert_eq!(plan.n_tokens(), 2);
    s.on_step_done(&plan).unwrap();
    for id in [1, 2] {
        s.append_token(id, 200 + id as u32).unwrap();
    }
    // Position 7 still fits.
    let plan = s.schedule().unwrap();
    assert_eq!(plan.n_tokens(), 2);
    s.on_step_done(&plan).unwrap();
    for id in [1, 2] {
        s.append_token(id, 300 + id as u32).unwrap();
    }
    // Position 8 needs a fifth block: sequence 2 is preempted, sequence 1 decodes.
    let plan = s.schedule().unwrap();
    assert_eq!(plan.chunks.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![1]);
    assert_eq!(s.stats().preemptions, 1);
    let victim = s.waiting().next().unwrap();
    assert_eq!(victim.id, 2);
    assert_eq!(victim.tokens, [toks(10..16), vec![102, 202, 302]].concat());
    assert_eq!((victim.prompt_len, victim.num_computed), (6, 0));
    assert_eq!(s.kv().check_invariants(), Ok(()));
}

#[test]
fn requests_sharing_a_prefix_wait_for_it_instead_of_computing_it_twice() {
    // 12 requests share a 32-token prefix. With a budget of 20, request 0 prefills 0..20, then
    // 20..37 with 3 tokens of budget left: request 1 could be admitted then, with 20 cached
    // tokens, and would compute 20..32 again; it waits a step instead.
    let shared = toks(1000..1032);
    let reqs: Vec<(Vec<u32>, usize)> =
        (0..12u32).map(|i| ([shared.clone(), toks(i * 10..i * 10 + 5)].concat(), 3)).collect();
    let cfg = SchedulerConfig { slots: 4, max_batch_tokens: 20, watermark_blocks: 0 };
    let with = simulate(cfg, 128, 4, true, &reqs);
    let without = simulate(cfg, 128, 4, false, &reqs);
    assert_eq!(with.outputs, without.outputs);
    assert_eq!(without.prompt_tokens_computed, 12 * 37);
    // The prefix once, then 5 unique tokens each (the shared blocks are whole: 32 = 8 x 4).
    assert_eq!(with.prompt_tokens_computed, 32 + 12 * 5);
    assert!(with.prefix_waits > 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    #[test]
    fn any_schedule_finishes_every_request_with_the_unbroken_output(
        slots in 1usize..6,
        extra_budget in 0usize..24,
        bs in 1usize..5,
        spare_blocks in 0usize..12,
        prefix in any::<bool>(),
        watermark in 0usize..3,
        reqs in prop::collection::vec((0u8..3, 1usize..14, 1usize..8), 1..10),
    ) {
        let reqs: Vec<(Vec<u32>, usize)> = reqs
            .into_iter()
            .map(|(v, len, n)| ((0..len as u32).map(|i| if i < 6 { i } else { i * (v as u32 + 1) % 5 }).collect(), n))
            .collect();
        // The pool holds at least the largest request, so everything can finish.
        let need = reqs.iter().map(|(p, n)| (p.len() + n).div_ceil(bs)).max().unwrap();
        let cfg = SchedulerConfig { slots, max_batch_tokens: slots + extra_budget, watermark_blocks: watermark };
        let r = simulate(cfg, need + spare_blocks, bs, prefix, &reqs);
        for (i, (p, n)) in reqs.iter().enumerate() {
            prop_assert_eq!(&r.outputs[&(i as SeqId)], &expected_output(i as SeqId, p.len(), *n));
        }
    }

    /// Tokens appended several at a time (a grammar's forced tokens) run as one chunk, with KV
    /// positions reserved past block boundaries, through preemption and prefix reuse.
    #[test]
    fn forced_tokens_appended_between_steps_run_in_reserved_slots(
        slots in 1usize..5,
        extra_budget in 0usize..16,
        bs in 1usize..5,
        spare_blocks in 0usize..8,
        prefix in any::<bool>(),
        forced in 1usize..5,
        reqs in prop::collection::vec((0u8..3, 1usize..12, 1usize..14), 1..8),
    ) {
        let reqs: Vec<(Vec<u32>, usize)> = reqs
            .into_iter()
            .map(|(v, len, n)| ((0..len as u32).map(|i| if i < 6 { i } else { i * (v as u32 + 1) % 5 }).collect(), n))
            .collect();
        let need = reqs.iter().map(|(p, n)| (p.len() + n).div_ceil(bs)).max().unwrap();
        let cfg = SchedulerConfig { slots, max_batch_tokens: slots + extra_budget, watermark_blocks: 0 };
        let r = simulate_forced(cfg, need + spare_blocks, bs, prefix, &reqs, forced);
        for (i, (p, n)) in reqs.iter().enumerate() {
            prop_assert_eq!(&r.outputs[&(i as SeqId)], &expected_output(i as SeqId, p.len(), *n));
        }
    }
}
