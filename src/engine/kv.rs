//! Paged KV cache bookkeeping: a pool of fixed-size blocks, per-sequence block tables, ref counts
//! and the prefix cache. No tensors here: the backend owns the memory
//! (`[num_blocks, block_size, n_kv_heads, head_dim]` per layer); this module decides which block
//! holds which positions of which sequence.
//!
//! Prefix cache: a full, computed block is named by the chain hash
//! `blake3(parent_hash || model_fingerprint || token_ids)`. When its last user frees it, the block
//! keeps its contents and its name and waits in the free list; a later prompt with the same
//! prefix takes it back instead of recomputing it. Free blocks are reused front first:
//! unnamed blocks sit at the front, named ones are appended at the back in LRU order, each
//! sequence's blocks tail first, so a block outlives the cached blocks that continue its chain.
//!
//! Promises: a fresh block that will hold a full block of a prompt is "promised" under its hash
//! until it is computed, so the scheduler can hold back a request whose prefix is being
//! computed right now by another sequence instead of computing it twice.

use std::collections::{HashMap, HashSet};

use super::plan::SeqId;

pub type BlockId = u32;
pub type BlockHash = [u8; 32];

/// Parent hash of every sequence's first block.
const ROOT_HASH: BlockHash = [0; 32];
/// "No block" in the free list's links.
const NIL: u32 = u32::MAX;

/// The chain hash that names a full block.
pub fn chain_hash(parent: &BlockHash, fingerprint: &[u8; 32], tokens: &[u32]) -> BlockHash {
    let mut h = blake3::Hasher::new();
    h.update(parent);
    h.update(fingerprint);
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("sequence {0} has no KV blocks")]
    UnknownSeq(SeqId),
    #[error("sequence {0} already has KV blocks")]
    SeqExists(SeqId),
    #[error("sequence {seq}: needs {needed} free KV blocks, {free} are free")]
    OutOfBlocks { seq: SeqId, needed: usize, free: usize },
}

/// Free blocks as a doubly linked list threaded through block indices: O(1) push, pop and
/// removal from the middle (a cached block taken back by a prefix hit).
#[derive(Clone, Debug)]
struct FreeList {
    prev: Vec<u32>,
    next: Vec<u32>,
    in_list: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeList {
    /// All of `0..n`, in order.
    fn full(n: usize) -> Self {
        let mut l =
            FreeList { prev: vec![NIL; n], next: vec![NIL; n], in_list: vec![false; n], head: NIL, tail: NIL, len: 0 };
        for id in 0..n as u32 {
            l.push_back(id);
        }
        l
    }

    fn contains(&self, id: u32) -> bool {
        self.in_list[id as usize]
    }

    fn push_back(&mut self, id: u32) {
        debug_assert!(!self.contains(id));
        let i = id as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        match self.tail {
            NIL => self.head = id,
            t => self.next[t as usize] = id,
        }
        self.tail = id;
        self.in_list[i] = true;
        self.len += 1;
    }

    fn push_front(&mut self, id: u32) {
        debug_assert!(!self.contains(id));
        let i = id as usize;
        self.prev[i] = NIL;
        self.next[i] = self.head;
        match self.head {
            NIL => self.tail = id,
            h => self.prev[h as usize] = id,
        }
        self.head = id;
        self.in_list[i] = true;
        self.len += 1;
    }

    fn remove(&mut self, id: u32) {
        debug_assert!(self.contains(id));
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        match p {
            NIL => self.head = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.prev[n as usize] = p,
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.in_list[i] = false;
        self.len -= 1;
    }

    fn pop_front(&mut self) -> Option<u32> {
        let h = self.head;
        if h == NIL {
            return None;
        }
        self.remove(h);
        Some(h)
    }

    /// Front (reused first) to back.
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let id = cur;
            cur = self.next[id as usize];
            Some(id)
        })
    }
}

/// A block's name in the prefix cache, with what it names (to confirm a hit).
#[derive(Clone, Debug)]
struct CachedName {
    hash: BlockHash,
    parent: BlockHash,
    tokens: Vec<u32>,
}

#[derive(Clone, Debug, Default)]
struct SeqBlocks {
    /// The block table: position p lives in `blocks[p / block_size]`.
    blocks: Vec<BlockId>,
    /// Positions reserved in `blocks`: `0..num_positions` (always within `blocks`).
    num_positions: usize,
    /// Chain hashes of the leading full blocks known so far (the prompt's, at allocation).
    hashes: Vec<BlockHash>,
    /// Leading blocks that are named in the cache or were found computed elsewhere.
    num_registered: usize,
}

/// The result of looking a prompt up in the prefix cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Cached blocks holding the prompt's first `cached_tokens` tokens.
    pub blocks: Vec<BlockId>,
    pub cached_tokens: usize,
    /// Leading tokens whose K/V are cached, before a hit is cut back to a state point (see
    /// [`KvCache::require_state_points`]); equals `cached_tokens` otherwise.
    pub shared_tokens: usize,
    /// The next block of this prefix is being computed by this running sequence.
    pub pending_on: Option<SeqId>,
    /// Chain hashes of all full blocks of the prompt (empty without a prefix cache).
    hashes: Vec<BlockHash>,
}

impl PrefixMatch {
    /// The chain hash of the prompt's full block `j`.
    pub fn hash_at(&self, j: usize) -> Option<BlockHash> {
        self.hashes.get(j).copied()
    }
}

/// The block pool with per-sequence block tables and the prefix cache.
#[derive(Clone, Debug)]
pub struct KvCache {
    block_size: usize,
    fingerprint: [u8; 32],
    prefix_cache: bool,
    ref_count: Vec<u32>,
    names: Vec<Option<CachedName>>,
    free: FreeList,
    cached: HashMap<BlockHash, BlockId>,
    promised: HashMap<BlockHash, SeqId>,
    seqs: HashMap<SeqId, SeqBlocks>,
    peak_used: usize,
    evictions: u64,
    /// Models with recurrent layers: the chain hashes after which the backend holds a state
    /// snapshot. A hit must end at one of them (or it would resume with a wrong state).
    state_points: Option<HashSet<BlockHash>>,
}

impl KvCache {
    /// `fingerprint` names the model (and anything else that changes K/V), so cached blocks are
    /// never shared between models.
    pub fn new(num_blocks: usize, block_size: usize, fingerprint: [u8; 32], prefix_cache: bool) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        assert!(num_blocks < NIL as usize, "too many blocks for u32 ids");
        let kv = KvCache {
            block_size,
            fingerprint,
            prefix_cache,
            ref_count: vec![0; num_blocks],
            names: vec![None; num_blocks],
            free: FreeList::full(num_blocks),
            cached: HashMap::new(),
            promised: HashMap::new(),
            seqs: HashMap::new(),
            peak_used: 0,
            evictions: 0,
            state_points: None,
        };
        kv.debug_check();
        kv
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn num_blocks(&self) -> usize {
        self.ref_count.len()
    }
    /// Blocks not referenced by any sequence (cached ones included: they can be evicted).
    pub fn num_free(&self) -> usize {
        self.free.len
    }
    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.free.len
    }
    pub fn peak_used(&self) -> usize {
        self.peak_used
    }
    /// Free blocks that still hold a named, reusable prefix.
    pub fn num_cached_free(&self) -> usize {
        self.cached.values().filter(|&&b| self.free.contains(b)).count()
    }
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
    pub fn prefix_cache_enabled(&self) -> bool {
        self.prefix_cache
    }

    /// For models whose layers keep a recurrent state beside the K/V: a prefix hit is cut back
    /// to the longest prefix that ends at a state point ([`KvCache::add_state_point`]).
    pub fn require_state_points(&mut self) {
        self.state_points.get_or_insert_with(HashSet::new);
    }
    pub fn state_points_required(&self) -> bool {
        self.state_points.is_some()
    }
    /// The backend now holds the state after the prefix named `hash`.
    pub fn add_state_point(&mut self, hash: BlockHash) {
        if let Some(s) = &mut self.state_points {
            s.insert(hash);
        }
    }
    /// The backend dropped the state after the prefix named `hash`.
    pub fn remove_state_point(&mut self, hash: &BlockHash) {
        if let Some(s) = &mut self.state_points {
            s.remove(hash);
        }
    }
    /// The chain hash of full block `j` of `seq`'s prompt (known from allocation on).
    pub fn block_hash(&self, seq: SeqId, j: usize) -> Option<BlockHash> {
        self.seqs.get(&seq).and_then(|s| s.hashes.get(j).copied())
    }

    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.seqs.get(&seq).map(|s| s.blocks.as_slice())
    }
    /// Positions of `seq` that have room in its KV blocks.
    pub fn num_positions(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.num_positions)
    }
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_count[block as usize]
    }
    /// Whether `block` is named in the prefix cache.
    pub fn is_cached(&self, block: BlockId) -> bool {
        self.names[block as usize].is_some()
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// The longest cached prefix of `tokens`, in whole blocks.
    pub fn lookup_prefix(&self, tokens: &[u32]) -> PrefixMatch {
        let mut m = PrefixMatch {
            blocks: Vec::new(),
            cached_tokens: 0,
            shared_tokens: 0,
            pending_on: None,
            hashes: Vec::new(),
        };
        if !self.prefix_cache {
            return m;
        }
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(self.block_size) {
            parent = chain_hash(&parent, &self.fingerprint, chunk);
            m.hashes.push(parent);
        }
        // NOTE: a hit stops one token short of the prompt: the backend must run at least the
        // last prompt token to produce the logits of the first generated token. Hits are whole
        // blocks, so a prompt of exactly k blocks can reuse at most k - 1 of them.
        let max_hit_blocks = tokens.len().saturating_sub(1) / self.block_size;
        let mut parent = ROOT_HASH;
        for (j, h) in m.hashes.iter().take(max_hit_blocks).enumerate() {
            let chunk = &tokens[j * self.block_size..(j + 1) * self.block_size];
            let hit = self.cached.get(h).copied().filter(|&b| {
                // Confirm the hit: the hash names these very tokens after this very parent.
                self.names[b as usize].as_ref().is_some_and(|n| n.parent == parent && n.tokens == chunk)
            });
            match hit {
                Some(b) => m.blocks.push(b),
                None => {
                    m.pending_on = self.promised.get(h).copied();
                    break;
                }
            }
            parent = *h;
        }
        m.shared_tokens = m.blocks.len() * self.block_size;
        if let Some(points) = &self.state_points {
            let keep = (1..=m.blocks.len()).rev().find(|&j| points.contains(&m.hashes[j - 1])).unwrap_or(0);
            m.blocks.truncate(keep);
        }
        m.cached_tokens = m.blocks.len() * self.block_size;
        m
    }

    /// Free-list blocks an allocation of `tokens` with prefix match `m` takes: fresh blocks
    /// plus the matched blocks that are free (cached) today.
    fn blocks_taken(&self, num_tokens: usize, m: &PrefixMatch) -> usize {
        let fresh = self.blocks_for(num_tokens) - m.blocks.len();
        fresh + m.blocks.iter().filter(|&&b| self.ref_count[b as usize] == 0).count()
    }

    /// Whether `tokens` fit, leaving at least `reserve` blocks free.
    pub fn can_allocate(&self, tokens: &[u32], reserve: usize) -> bool {
        let m = self.lookup_prefix(tokens);
        self.blocks_taken(tokens.len(), &m) + reserve <= self.num_free()
    }

    /// Gives `seq` KV positions for `tokens` (its prompt), reusing the cached prefix. Returns the
    /// number of leading tokens whose K/V are already in the cache.
    pub fn allocate(&mut self, seq: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SeqExists(seq));
        }
        let m = self.lookup_prefix(tokens);
        let needed = self.blocks_taken(tokens.len(), &m);
        if needed > self.num_free() {
            return Err(KvError::OutOfBlocks { seq, needed, free: self.num_free() });
        }
        let mut s = SeqBlocks { num_positions: tokens.len(), num_registered: m.blocks.len(), ..Default::default() };
        for &b in &m.blocks {
            self.take_ref(b);
            s.blocks.push(b);
        }
        while s.blocks.len() < self.blocks_for(tokens.len()) {
            let b = self.take_fresh().ok_or(KvError::OutOfBlocks { seq, needed, free: 0 })?;
            s.blocks.push(b);
        }
        for h in &m.hashes[m.blocks.len()..] {
            if !self.cached.contains_key(h) {
                self.promised.entry(*h).or_insert(seq);
            }
        }
        s.hashes = m.hashes;
        self.seqs.insert(seq, s);
        self.note_usage();
        self.debug_check();
        Ok(m.cached_tokens)
    }

    /// Whether `seq` can grow by one position (room is left in its last block, or a block is free).
    pub fn may_append(&self, seq: SeqId) -> bool {
        self.seqs.get(&seq).is_some_and(|s| s.num_positions < s.blocks.len() * self.block_size || self.num_free() > 0)
    }

    /// Grows `seq` by one position, taking a block when the last one is full.
    pub fn append_position(&mut self, seq: SeqId) -> Result<(), KvError> {
        let bs = self.block_size;
        let s = self.seqs.get(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if s.num_positions == s.blocks.len() * bs {
            let b = self.take_fresh().ok_or(KvError::OutOfBlocks { seq, needed: 1, free: 0 })?;
            self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?.blocks.push(b);
        }
        self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?.num_positions += 1;
        self.note_usage();
        self.debug_check();
        Ok(())
    }

    /// Records that positions `0..num_computed` of `seq` (holding `tokens[..num_computed]`) are
    /// in the cache: newly completed full blocks get their names, so later prompts can reuse them.
    pub fn mark_computed(&mut self, seq: SeqId, tokens: &[u32], num_computed: usize) -> Result<(), KvError> {
        if !self.seqs.contains_key(&seq) {
            return Err(KvError::UnknownSeq(seq));
        }
        if !self.prefix_cache {
            return Ok(());
        }
        let bs = self.block_size;
        let mut s = self.seqs.remove(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let full = (num_computed.min(tokens.len()).min(s.num_positions)) / bs;
        for j in s.num_registered..full {
            let parent = if j == 0 { ROOT_HASH } else { s.hashes[j - 1] };
            let chunk = &tokens[j * bs..(j + 1) * bs];
            if j == s.hashes.len() {
                s.hashes.push(chain_hash(&parent, &self.fingerprint, chunk));
            }
            let h = s.hashes[j];
            self.promised.remove(&h);
            let b = s.blocks[j];
            // Another sequence may have computed the same block meanwhile; then this copy
            // stays unnamed (duplicates are rare: the scheduler holds back shared prefixes).
            if !self.cached.contains_key(&h) && self.names[b as usize].is_none() {
                self.names[b as usize] = Some(CachedName { hash: h, parent, tokens: chunk.to_vec() });
                self.cached.insert(h, b);
            }
        }
        s.num_registered = s.num_registered.max(full);
        self.seqs.insert(seq, s);
        self.debug_check();
        Ok(())
    }

    /// Releases all blocks of `seq`. Named blocks stay cached, tail first in eviction order.
    pub fn free(&mut self, seq: SeqId) -> Result<(), KvError> {
        let s = self.seqs.remove(&seq).ok_or(KvError::UnknownSeq(seq))?;
        for h in &s.hashes[s.num_registered.min(s.hashes.len())..] {
            if self.promised.get(h) == Some(&seq) {
                self.promised.remove(h);
            }
        }
        for &b in s.blocks.iter().rev() {
            let i = b as usize;
            self.ref_count[i] -= 1;
            if self.ref_count[i] == 0 {
                if self.names[i].is_some() {
                    self.free.push_back(b);
                } else {
                    self.free.push_front(b);
                }
            }
        }
        self.debug_check();
        Ok(())
    }

    /// Takes a reference on a block found in the cache (off the free list if nobody held it).
    fn take_ref(&mut self, b: BlockId) {
        if self.ref_count[b as usize] == 0 {
            self.free.remove(b);
        }
        self.ref_count[b as usize] += 1;
    }

    /// Pops the front of the free list, evicting its cached name if it has one.
    fn take_fresh(&mut self) -> Option<BlockId> {
        let b = self.free.pop_front()?;
        if let Some(name) = self.names[b as usize].take() {
            if self.cached.get(&name.hash) == Some(&b) {
                self.cached.remove(&name.hash);
            }
            self.evictions += 1;
        }
        self.ref_count[b as usize] = 1;
        Some(b)
    }

    fn note_usage(&mut self) {
        self.peak_used = self.peak_used.max(self.num_used());
    }

    fn debug_check(&self) {
        debug_assert_eq!(self.check_invariants(), Ok(()));
    }

    /// Checks every invariant of the pool; `Err` names the first broken one. O(blocks + tables).
    pub fn check_invariants(&self) -> Result<(), String> {
        let n = self.num_blocks();
        let bs = self.block_size;
        // Ref counts equal the references from block tables.
        let mut refs = vec![0u32; n];
        for (seq, s) in &self.seqs {
            if s.blocks.len() != self.blocks_for(s.num_positions) {
                return Err(format!("seq {seq}: {} blocks for {} positions", s.blocks.len(), s.num_positions));
            }
            if s.num_registered > s.blocks.len() || (self.prefix_cache && s.num_registered > s.hashes.len()) {
                return Err(format!("seq {seq}: {} registered blocks", s.num_registered));
            }
            for &b in &s.blocks {
                if b as usize >= n {
                    return Err(format!("seq {seq}: block {b} out of range"));
                }
                refs[b as usize] += 1;
            }
        }
        if refs != self.ref_count {
            let b = (0..n).find(|&b| refs[b] != self.ref_count[b]).unwrap_or(0);
            return Err(format!("block {b}: ref count {} but {} table references", self.ref_count[b], refs[b]));
        }
        // The free list holds exactly the unreferenced blocks: free + used == total.
        let listed: Vec<u32> = self.free.iter().collect();
        if listed.len() != self.free.len || self.free.len > n {
            return Err(format!("free list walks {} blocks, says {}", listed.len(), self.free.len));
        }
        for (i, &b) in listed.iter().enumerate() {
            let back = if i == 0 { NIL } else { listed[i - 1] };
            if self.free.prev[b as usize] != back {
                return Err(format!("free list: block {b} has a wrong back link"));
            }
        }
        if self.free.tail != listed.last().copied().unwrap_or(NIL) {
            return Err("free list: wrong tail".into());
        }
        for b in 0..n {
            if self.free.contains(b as u32) != (self.ref_count[b] == 0) {
                return Err(format!(
                    "block {b}: ref count {} but in free list: {}",
                    self.ref_count[b],
                    self.free.contains(b as u32)
                ));
            }
        }
        let used = (0..n).filter(|&b| self.ref_count[b] > 0).count();
        if used + self.free.len != n {
            return Err(format!("{used} used + {} free != {n} blocks", self.free.len));
        }
        // The hash map and the blocks' names agree.
        for (h, &b) in &self.cached {
            match &self.names[b as usize] {
                Some(name) if name.hash == *h && name.tokens.len() == bs => {}
                _ => return Err(format!("cached hash of block {b} does not match its name")),
            }
        }
        for (b, name) in self.names.iter().enumerate() {
            if let Some(name) = name {
                if self.cached.get(&name.hash) != Some(&(b as u32)) {
                    return Err(format!("named block {b} is not in the hash map"));
                }
            }
        }
        if !self.prefix_cache && (!self.cached.is_empty() || !self.promised.is_empty()) {
            return Err("prefix cache off but blocks are named".into());
        }
        // Promises come from live sequences and name blocks not computed yet.
        for (h, seq) in &self.promised {
            let Some(s) = self.seqs.get(seq) else {
                return Err(format!("promise by seq {seq}, which has no blocks"));
            };
            if self.cached.contains_key(h) || !s.hashes[s.num_registered.min(s.hashes.len())..].contains(h) {
                return Err(format!("stale promise by seq {seq}"));
            }
        }
        if self.peak_used < used {
            return Err(format!("peak {} below current use {used}", self.peak_used));
        }
        Ok(())
    }
}
