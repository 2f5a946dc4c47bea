//! The all-reduce of tensor-parallel ranks in host memory: each rank hands in its `[n_tok, dim]`
//! partial residual, and every rank gets back the same sum, added in rank order
//! (`rank 0 + rank 1 + ...`), so the result is deterministic and identical on all ranks.
//!
//! The CPU tensor-parallel backend reduces its threads' buffers through it; the CUDA one uses it
//! for ranks that share one GPU (download, sum, upload), where NCCL cannot run (it refuses two
//! ranks on one device).
//!
//! A rank that fails (a panic, a device error) aborts the reduction, so the others return an
//! error instead of waiting at the barrier forever.

use std::sync::{Condvar, Mutex, MutexGuard};

/// A rank left the reduction (failed or gave up): the step cannot complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("tensor parallel: another rank failed during the all-reduce")]
pub struct Aborted;

struct Gate {
    arrived: usize,
    generation: u64,
    aborted: bool,
}

pub struct HostAllReduce {
    n: usize,
    /// Per rank: its latest partial, `[len]`.
    slots: Vec<Mutex<Vec<f32>>>,
    gate: Mutex<Gate>,
    turn: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A rank that panicked while holding a slot aborted the reduction after (its rank group
    // calls `RankEngine::abort_collective`);
    // the data is still whole (plain floats), so a poisoned lock is not a second failure.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl HostAllReduce {
    /// A reduction among `n >= 1` ranks.
    pub fn new(n: usize) -> Self {
        assert!(n >= 1, "an all-reduce needs at least one rank");
        HostAllReduce {
            n,
            slots: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            gate: Mutex::new(Gate { arrived: 0, generation: 0, aborted: false }),
            turn: Condvar::new(),
        }
    }

    pub fn ranks(&self) -> usize {
        self.n
    }

    /// Waits until all `n` ranks have arrived (or one aborted).
    fn barrier(&self) -> Result<(), Aborted> {
        let mut g = lock(&self.gate);
        if g.aborted {
            return Err(Aborted);
        }
        g.arrived += 1;
        if g.arrived == self.n {
            g.arrived = 0;
            g.generation += 1;
            self.turn.notify_all();
            return Ok(());
        }
        let gen = g.generation;
        while g.generation == gen && !g.aborted {
            g = self.turn.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        if g.aborted {
            Err(Aborted)
        } else {
            Ok(())
        }
    }

    /// Rank `rank`'s part of the reduction: `x` (the same length on every rank) becomes the sum
    /// of all ranks' `x`, in rank order. Blocks until every rank has called it.
    pub fn reduce(&self, rank: usize, x: &mut [f32]) -> Result<(), Aborted> {
        {
            let mut s = lock(&self.slots[rank]);
            s.clear();
            s.extend_from_slice(x);
        }
        self.barrier()?;
        x.copy_from_slice(&lock(&self.slots[0])[..x.len()]);
        for slot in &self.slots[1..] {
            let s = lock(slot);
            x.iter_mut().zip(s.iter()).for_each(|(a, b)| *a += b);
        }
        // No rank overwrites its slot (the next reduction) before all have read this one.
        self.barrier()
    }

    /// Ends the reduction for every rank: those waiting (and all later calls) get [`Aborted`].
    pub fn abort(&self) {
        lock(&self.gate).aborted = true;
        self.turn.notify_all();
    }

    /// Whether a rank aborted.
    pub fn is_aborted(&self) -> bool {
        lock(&self.gate).aborted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_gets_the_sum_in_rank_order() {
        let ar = HostAllReduce::new(3);
        // Values whose float sum depends on the order: (1e8 + 1) - 1e8 != 1 + (1e8 - 1e8).
        let parts = [vec![1e8f32, 1.0], vec![1.0, 2.0], vec![-1e8, 3.0]];
        let got: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = parts
                .iter()
                .enumerate()
                .map(|(r, p)| {
                    let ar = &ar;
                    s.spawn(move || {
                        let mut x = p.clone();
                        for _ in 0..50 {
                            // Many rounds: no rank overwrites a slot another is still reading.
                            let mut y = p.clone();
                            ar.reduce(r, &mut y).unwrap();
                            x = y;
                        }
                        x
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want = vec![(1e8f32 + 1.0) + -1e8, 6.0];
        assert_eq!(want, vec![0.0, 6.0], "f32 loses the 1 in rank order");
        for g in &got {
            assert_eq!(g, &want);
        }
    }

    #[test]
    fn one_rank_is_the_identity() {
        let ar = HostAllReduce::new(1);
        let mut x = vec![0.1f32, -3.5, f32::MIN_POSITIVE];
        let before = x.clone();
        ar.reduce(0, &mut x).unwrap();
        assert_eq!(x, before);
    }

    #[test]
    fn a_failed_rank_releases_the_others() {
        let ar = HostAllReduce::new(2);
        let r = std::thread::scope(|s| {
            let waiting = s.spawn(|| ar.reduce(0, &mut [1.0]));
            let failing = s.spawn(|| {
                // What a rank group does for a rank whose step failed or panicked.
                ar.abort();
                panic!("rank 1 fails before its all-reduce");
            });
            assert!(failing.join().is_err());
            waiting.join().unwrap()
        });
        assert_eq!(r, Err(Aborted));
        assert!(ar.is_aborted());
        assert_eq!(ar.reduce(0, &mut [1.0]), Err(Aborted));
    }
}
