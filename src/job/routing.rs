//! Which engine runs a request when a job runs several engines (`--devices`, `--engines`):
//! requests go to the engine that was given the longest prefix of their prompt before (so its
//! prefix cache most likely holds those KV blocks), and an engine whose queue runs dry steals
//! queued requests from the others. Pure bookkeeping, no threads: [`super::parallel`] keeps one
//! router under its lock.
//!
//! A prompt is cut into full blocks of `block` tokens (the KV block size) and each block is named
//! by a chain hash (`blake3(parent || tokens)`, as the KV cache names blocks, truncated to 64
//! bits). Each engine remembers the block hashes of the requests it was given, a bounded mirror of
//! what its cache holds: past `max_blocks` entries the least recently used half is forgotten.

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use super::runner::GenRequest;

/// Blocks of a prompt that take part in routing: prompts that agree on their first 4,096 tokens
/// (at a block size of 16) go to the same engine anyway.
pub const MAX_ROUTE_BLOCKS: usize = 256;

/// Block hashes each engine remembers by default (~3 MB an engine).
pub const DEFAULT_MAX_BLOCKS: usize = 1 << 16;

/// Per-engine routing counts, for the job report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RouteStats {
    /// Requests routed to this engine's queue.
    pub routed: u64,
    /// ...of which because the engine had been given a prefix of the prompt (at least one block).
    pub routed_by_prefix: u64,
    /// Requests this engine took from another engine's queue when its own ran dry.
    pub stolen: u64,
    /// Requests other engines took from this engine's queue.
    pub stolen_from: u64,
    /// Requests this engine finished.
    pub finished: u64,
}

/// A queued request with its prefix block hashes.
struct Routed {
    req: GenRequest,
    /// Chain hashes of the prompt's full blocks, shortest prefix first (at most
    /// [`MAX_ROUTE_BLOCKS`]).
    blocks: Vec<u64>,
}

struct EngineRoutes {
    /// Prefix block hash -> the router tick of its last use.
    seen: HashMap<u64, u64>,
    queue: VecDeque<Routed>,
    /// Requests this engine took (from its queue or by stealing) and has not finished.
    running: usize,
    stats: RouteStats,
}

impl EngineRoutes {
    /// Leading blocks of `blocks` this engine was given (the chain stops at the first miss).
    fn depth(&self, blocks: &[u64]) -> usize {
        blocks.iter().take_while(|h| self.seen.contains_key(h)).count()
    }

    /// Queued plus running requests: the work this engine has ahead of it.
    fn load(&self) -> usize {
        self.queue.len() + self.running
    }
}

pub struct PrefixRouter {
    block: usize,
    max_blocks: usize,
    engines: Vec<EngineRoutes>,
    tick: u64,
}

/// The chain hashes of the full blocks of `prompt` that the KV cache could reuse (a prompt hit is
/// capped at `len - 1` tokens, so the last token never counts), at most [`MAX_ROUTE_BLOCKS`].
pub fn prefix_blocks(prompt: &[u32], block: usize) -> Vec<u64> {
    let usable = prompt.len().saturating_sub(1);
    let mut parent = [0u8; 32];
    let mut out = Vec::new();
    for chunk in prompt[..usable].chunks_exact(block.max(1)).take(MAX_ROUTE_BLOCKS) {
        let mut h = blake3::Hasher::new();
        h.update(&parent);
        for t in chunk {
            h.update(&t.to_le_bytes());
        }
        parent = *h.finalize().as_bytes();
        out.push(u64::from_le_bytes(parent[..8].try_into().unwrap_or_default()));
    }
    out
}

impl PrefixRouter {
    /// A router over `engines` engines (at least one) for KV blocks of `block` tokens; each
    /// engine remembers at most `max_blocks` block hashes.
    pub fn new(engines: usize, block: usize, max_blocks: usize) -> Self {
        let engines = (0..engines.max(1))
            .map(|_| EngineRoutes {
                seen: HashMap::new(),
                queue: VecDeque::new(),
                running: 0,
                stats: RouteStats::default(),
            })
            .collect();
        PrefixRouter { block: block.max(1), max_blocks: max_blocks.max(2), engines, tick: 0 }
    }

    pub fn engines(&self) -> usize {
        self.engines.len()
    }

    /// Queues `req` on the engine that was given the longest prefix of its prompt; among equals
    /// (and when none was) the one with the least work ahead, then the lowest index. Returns it.
    pub fn route(&mut self, req: GenRequest) -> usize {
        let blocks = prefix_blocks(&req.prompt, self.block);
        let (best, depth) = self
            .engines
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.depth(&blocks), e.load()))
            .min_by_key(|&(i, depth, load)| (std::cmp::Reverse(depth), load, i))
            .map(|(i, depth, _)| (i, depth))
            .unwrap_or((0, 0));
        self.remember(best, &blocks);
        let e = &mut self.engines[best];
        e.stats.routed += 1;
        e.stats.routed_by_prefix += u64::from(depth > 0);
        e.queue.push_back(Routed { req, blocks });
        best
    }

    /// Requests for `engine` to start: from its own queue up to `room`; when its own queue is
    /// empty, stolen from the others up to `steal_room` (the running slots it would leave idle).
    /// A thief takes the queued request it was given the longest prefix of, from the longest
    /// queue among equals, the newest among those (the victim keeps its oldest work).
    pub fn take(&mut self, engine: usize, room: usize, steal_room: usize) -> Vec<GenRequest> {
        let mut out = Vec::new();
        let Some(e) = self.engines.get_mut(engine) else { return out };
        while out.len() < room {
            let Some(r) = e.queue.pop_front() else { break };
            out.push(r.req);
        }
        let own_empty = e.queue.is_empty();
        e.running += out.len();
        if !own_empty {
            return out;
        }
        while out.len() < room.min(steal_room) {
            let Some((victim, pos)) = self.steal_candidate(engine) else { break };
            let Some(r) = self.engines[victim].queue.remove(pos) else { break };
            self.engines[victim].stats.stolen_from += 1;
            self.remember(engine, &r.blocks);
            let thief = &mut self.engines[engine];
            thief.stats.stolen += 1;
            thief.running += 1;
            out.push(r.req);
        }
        out
    }

    /// `(victim, position)` of the request `thief` should steal: the most blocks it holds, then
    /// the longest queue, then the newest.
    fn steal_candidate(&self, thief: usize) -> Option<(usize, usize)> {
        let t = &self.engines[thief];
        self.engines
            .iter()
            .enumerate()
            .filter(|(v, _)| *v != thief)
            .flat_map(|(v, e)| e.queue.iter().enumerate().map(move |(pos, r)| (v, pos, e.queue.len(), r)))
            .max_by_key(|&(v, pos, len, r)| (t.depth(&r.blocks), len, pos, std::cmp::Reverse(v)))
            .map(|(v, pos, _, _)| (v, pos))
    }

    /// `engine` finished `n` of the requests it took.
    pub fn finished(&mut self, engine: usize, n: usize) {
        if let Some(e) = self.engines.get_mut(engine) {
            e.running = e.running.saturating_sub(n);
            e.stats.finished += n as u64;
        }
    }

    /// Requests queued (routed, not yet taken) on any engine.
    pub fn queued(&self) -> usize {
        self.engines.iter().map(|e| e.queue.len()).sum()
    }

    pub fn stats(&self, engine: usize) -> RouteStats {
        self.engines.get(engine).map(|e| e.stats.clone()).unwrap_or_default()
    }

    /// Records that `engine` was given `blocks`; past `max_blocks` it forgets the least recently
    /// used half (amortized O(1) a block).
    fn remember(&mut self, engine: usize, blocks: &[u64]) {
        self.tick += 1;
        let tick = self.tick;
        let max = self.max_blocks;
        let seen = &mut self.engines[engine].seen;
        for &h in blocks {
            seen.insert(h, tick);
        }
        if seen.len() > max {
            let mut ticks: Vec<u64> = seen.values().copied().collect();
            let mid = ticks.len() / 2;
            let (_, &mut cut, _) = ticks.select_nth_unstable(mid);
            seen.retain(|_, t| *t > cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::SamplingParams;

    /// A prompt of `shared` tokens of prefix `group` followed by `unique` tokens of `key`.
    fn req(key: u64, group: u32, shared: usize, unique: usize) -> GenRequest {
        let mut prompt: Vec<u32> = (0..shared as u32).map(|t| 1000 * group + t).collect();
        prompt.extend((0..unique as u32).map(|t| 1_000_000 + 1000 * key as u32 + t));
        GenRequest { key, prompt, max_tokens: 4, sampling: SamplingParams::default() }
    }

    fn keys(v: &[GenRequest]) -> Vec<u64> {
        v.iter().map(|r| r.key).collect()
    }

    #[test]
    fn block_hashes_are_a_chain_over_full_blocks_short_of_the_last_token() {
        let a: Vec<u32> = (0..33).collect();
        // 32 usable tokens: two blocks of 16.
        assert_eq!(prefix_blocks(&a, 16).len(), 2);
        assert_eq!(prefix_blocks(&a[..32], 16).len(), 1);
        let mut b = a.clone();
        b[20] = 7;
        let (ha, hb) = (prefix_blocks(&a, 16), prefix_blocks(&b, 16));
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        // The same tokens after a different first block hash differently.
        let mut c = a.clone();
        c[0] = 9;
        assert_ne!(prefix_blocks(&c, 16)[1], ha[1]);
        assert!(prefix_blocks(&[], 16).is_empty());
    }

    #[test]
    fn shared_prefixes_stay_on_one_engine_and_new_ones_go_to_the_least_loaded() {
        let mut r = PrefixRouter::new(3, 16, DEFAULT_MAX_BLOCKS);
        // Two groups with 48 shared tokens, interleaved: group 1 first lands on engine 0 (all
        // equal), group 2 on engine 1 (engine 0 has work), then each group follows its prefix.
        let mut placed = Vec::new();
        for k in 0..8 {
            placed.push(r.route(req(k, 1 + (k % 2) as u32, 48, 20)));
        }
        assert_eq!(placed, vec![0, 1, 0, 1, 0, 1, 0, 1]);
        // A third group goes to the idle engine 2.
        assert_eq!(r.route(req(8, 3, 48, 20)), 2);
        assert_eq!(r.stats(0), RouteStats { routed: 4, routed_by_prefix: 3, ..Default::default() });
        assert_eq!(r.stats(2).routed_by_prefix, 0);
        // A prompt sharing only the first block of group 1 still follows it.
        let mut p = req(9, 1, 16, 40);
        p.prompt[17] = 5;
        assert_eq!(r.route(p), 0);
    }

    #[test]
    fn own_queue_first_then_steal_the_best_matching_newest_request() {
        let mut r = PrefixRouter::new(2, 16, DEFAULT_MAX_BLOCKS);
        for k in 0..6 {
            assert_eq!(r.route(req(k, 1, 32, 20)), 0, "one shared prefix: all on engine 0");
        }
        // Engine 0 takes up to its room; engine 1, dry, steals at most its idle slots.
        assert_eq!(keys(&r.take(0, 2, 2)), vec![0, 1]);
        assert_eq!(keys(&r.take(1, 8, 2)), vec![5, 4]);
        assert_eq!((r.stats(1).stolen, r.stats(0).stolen_from), (2, 2));
        // Engine 1 now holds the prefix: new requests of the group go to the less loaded engine.
        assert_eq!(r.route(req(6, 1, 32, 20)), 1);
        // Engine 1's own queue is served before stealing.
        assert_eq!(keys(&r.take(1, 8, 8)), vec![6, 3, 2]);
        assert_eq!(r.queued(), 0);
        r.finished(1, 5);
        assert_eq!(r.stats(1).finished, 5);
        // A thief with room but no idle slots steals nothing.
        r.route(req(7, 2, 32, 20));
        assert_eq!(r.route(req(8, 2, 32, 20)), 1);
        assert!(r.take(0, 8, 0).is_empty());
    }

    #[test]
    fn a_thief_prefers_requests_whose_prefix_it_holds() {
        let mut r = PrefixRouter::new(2, 16, DEFAULT_MAX_BLOCKS);
        assert_eq!(r.route(req(0, 1, 32, 20)), 0);
        assert_eq!(keys(&r.take(0, 1, 1)), vec![0]);
        assert_eq!(r.route(req(1, 2, 32, 20)), 1);
        assert_eq!(keys(&r.take(1, 1, 1)), vec![1]);
        // Group 3 is new: the tie on load goes to engine 0, and its next request follows it.
        assert_eq!([r.route(req(2, 3, 32, 20)), r.route(req(3, 1, 32, 20)), r.route(req(4, 3, 32, 20))], [0, 0, 0]);
        r.finished(1, 1);
        // Engine 1 holds neither queued prefix: it takes the newest request (key 4, group 3).
        assert_eq!(keys(&r.take(1, 1, 1)), vec![4]);
        assert_eq!(r.route(req(5, 1, 32, 20)), 0);
        // Now it holds group 3: it takes key 2 (group 3) over the newer key 5 (group 1).
        assert_eq!(keys(&r.take(1, 1, 2)), vec![2]);
        assert!(r.take(0, 0, 0).is_empty(), "no room, nothing taken");
        assert_eq!(keys(&r.take(0, 4, 4)), vec![3, 5]);
        assert_eq!((r.stats(1).stolen, r.stats(0).stolen_from, r.stats(0).routed_by_prefix), (2, 2, 3));
    }

    #[test]
    fn remembered_blocks_are_bounded() {
        let mut r = PrefixRouter::new(1, 16, 64);
        for k in 0..200 {
            r.route(req(k, k as u32 + 1, 64, 0));
            assert!(r.engines[0].seen.len() <= 64);
        }
        // The most recent prompt's blocks survive the trimming.
        let last = prefix_blocks(&req(199, 200, 64, 0).prompt, 16);
        assert_eq!(r.engines[0].depth(&last), last.len());
    }
}
