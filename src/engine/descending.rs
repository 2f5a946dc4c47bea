//! A sampler's candidate tokens in descending order of logit (ties: the lower id first), sorted
//! only as far as a reader walks. Top-p and the draw stop after the few tokens that hold most of
//! the probability, so sorting all of a 152k vocabulary (~6 ms a row on one core, 64 rows a
//! batched step) is mostly wasted. Each extension selects the next block of the unsorted rest
//! (`select_nth_unstable_by`, linear) and sorts only that block; blocks double, so a walk to the
//! end costs O(n log n), as one sort would.

use std::cmp::Ordering;

/// Descending logit, then ascending id: a total order (ids are distinct), so the walk is the
/// same whatever the selection's internal permutations.
fn before(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Candidates `(id, logit)`; `c[..sorted]` are the first ones in order, the rest unsorted (each
/// after all of the sorted ones).
pub struct Descending {
    c: Vec<(u32, f32)>,
    sorted: usize,
}

impl Descending {
    /// The first block sorted: the tokens a peaked distribution needs.
    const FIRST: usize = 64;

    pub fn new(candidates: Vec<(u32, f32)>) -> Self {
        Descending { c: candidates, sorted: 0 }
    }

    pub fn len(&self) -> usize {
        self.c.len()
    }

    pub fn is_empty(&self) -> bool {
        self.c.is_empty()
    }

    /// Every candidate, in no particular order (for sums that need no order).
    pub fn unordered(&self) -> &[(u32, f32)] {
        &self.c
    }

    /// Keeps the first `k` in order (top-k); `k >= len` keeps all.
    pub fn keep_first(&mut self, k: usize) {
        if k >= self.c.len() {
            return;
        }
        if k > self.sorted {
            // The k-th of the unsorted rest, with everything before it ahead of everything after.
            self.c[self.sorted..].select_nth_unstable_by(k - self.sorted - 1, before);
        } else {
            self.sorted = k;
        }
        self.c.truncate(k);
    }

    /// The `i`-th candidate in order; `i < len`.
    pub fn get(&mut self, i: usize) -> (u32, f32) {
        if i >= self.sorted {
            self.sort_through(i + 1);
        }
        self.c[i]
    }

    /// Sorts every candidate whose logit passes `ahead`, which must hold for a prefix of the
    /// order (true for every logit above any logit it holds for): one pass that moves them in
    /// front of the unsorted rest, then a sort of only those. A reader that knows how far it will
    /// walk (from the mass of bands of logits) sorts that far in one step.
    pub fn sort_where(&mut self, ahead: impl Fn(f32) -> bool) {
        let rest = &mut self.c[self.sorted..];
        let mut n = 0;
        for i in 0..rest.len() {
            if ahead(rest[i].1) {
                rest.swap(i, n);
                n += 1;
            }
        }
        rest[..n].sort_unstable_by(before);
        self.sorted += n;
    }

    /// Sorts at least the first `n` (at least double what was sorted).
    fn sort_through(&mut self, n: usize) {
        let n = n.max(2 * self.sorted).max(Self::FIRST).min(self.c.len());
        let take = n - self.sorted;
        let rest = &mut self.c[self.sorted..];
        if take < rest.len() {
            rest.select_nth_unstable_by(take - 1, before);
        }
        rest[..take].sort_unstable_by(before);
        self.sorted = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn walks_in_the_order_of_a_full_sort() {
        let mut rng = StdRng::seed_from_u64(11);
        for n in [1usize, 2, 63, 64, 65, 200, 5_000] {
            // Few distinct values: many ties, which the ids must break.
            let c: Vec<(u32, f32)> = (0..n as u32).map(|i| (i, rng.random_range(0..40) as f32 * 0.25)).collect();
            let mut want = c.clone();
            want.sort_by(before);
            for k in [n, n / 2 + 1, 1] {
                let mut d = Descending::new(c.clone());
                d.keep_first(k);
                assert_eq!(d.len(), k.min(n));
                // Read out of order too: a later index first, then from the start.
                let _ = d.get(d.len() - 1);
                let got: Vec<(u32, f32)> = (0..d.len()).map(|i| d.get(i)).collect();
                assert_eq!(got, want[..k.min(n)], "n = {n}, k = {k}");
            }
            // sort_where sorts exactly the candidates that pass, then the walk goes on.
            let mut d = Descending::new(c.clone());
            let cut = want[n / 4].1;
            d.sort_where(|l| l >= cut);
            assert_eq!(d.sorted, want.iter().filter(|x| x.1 >= cut).count());
            let got: Vec<(u32, f32)> = (0..n).map(|i| d.get(i)).collect();
            assert_eq!(got, want);
            // keep_first after a partial walk keeps the walked prefix.
            let mut d = Descending::new(c.clone());
            let first = d.get(0);
            d.keep_first((n / 3).max(1));
            assert_eq!(d.get(0), first);
            let got: Vec<(u32, f32)> = (0..d.len()).map(|i| d.get(i)).collect();
            assert_eq!(got, want[..(n / 3).max(1)]);
        }
    }
}
