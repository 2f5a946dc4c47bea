//! `DUSTOFF_ROUTE_STATS=1`: one stderr line per sparse layer a CPU step runs, saying how its
//! tokens spread over the experts: experts with tokens, the most tokens one expert got, and the
//! share of the router input's energy that all tokens share (the squared mean row over the mean
//! squared row). A trained model spreads a chunk's tokens over nearly every expert; a step whose
//! tokens all pick a few experts reads few expert weights, which makes a synthetic model's MoE
//! timings unlike a real one's (docs/BENCHMARKS.md, Method, "Routing of the synthetic files").

use std::sync::OnceLock;

/// Whether the lines are asked for (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::sys::env::get("DUSTOFF_ROUTE_STATS").is_some_and(|v| v == "1"))
}

/// What [`report`] prints for a step of `n` rows of `x` (`[n, dim]`, the router's input) whose
/// (token, rank) pairs are grouped by expert at `offsets` (`[n_experts + 1]` prefix sums).
#[derive(Clone, Debug, PartialEq)]
pub struct RouteSpread {
    pub tokens: usize,
    pub experts_used: usize,
    pub n_experts: usize,
    pub max_per_expert: usize,
    /// `|mean row|^2 / mean |row|^2`: 0 for rows with nothing in common, 1 for equal rows.
    pub shared_energy: f64,
}

impl RouteSpread {
    pub fn of(x: &[f32], n: usize, dim: usize, offsets: &[usize]) -> RouteSpread {
        let counts = offsets.windows(2).map(|w| w[1] - w[0]);
        let experts_used = counts.clone().filter(|&c| c > 0).count();
        let max_per_expert = counts.max().unwrap_or(0);
        let mut mean = vec![0f64; dim];
        let mut square = 0f64;
        for row in x.chunks_exact(dim).take(n) {
            for (m, &v) in mean.iter_mut().zip(row) {
                *m += v as f64;
                square += v as f64 * v as f64;
            }
        }
        let rows = n.max(1) as f64;
        let mean_sq: f64 = mean.iter().map(|m| (m / rows) * (m / rows)).sum();
        let shared_energy = if square > 0.0 { mean_sq / (square / rows) } else { 0.0 };
        RouteSpread {
            tokens: n,
            experts_used,
            n_experts: offsets.len().saturating_sub(1),
            max_per_expert,
            shared_energy,
        }
    }
}

/// Prints the spread of one sparse layer's step.
pub fn report(s: &RouteSpread) {
    eprintln!(
        "route: {} tokens over {} of {} experts, at most {} to one; shared energy {:.3}",
        s.tokens, s.experts_used, s.n_experts, s.max_per_expert, s.shared_energy
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_counts_experts_and_the_shared_part_of_the_rows() {
        // 4 tokens, top-1 of 4 experts: one each to experts 0 and 3, two to expert 2.
        let g = [0, 1, 1, 3, 4];
        let equal = [1.0f32, 2.0].repeat(4);
        let s = RouteSpread::of(&equal, 4, 2, &g);
        assert_eq!((s.tokens, s.experts_used, s.n_experts, s.max_per_expert), (4, 3, 4, 2));
        assert!((s.shared_energy - 1.0).abs() < 1e-12, "equal rows share everything: {s:?}");
        let opposite = [1.0f32, 0.0, -1.0, 0.0, 0.0, 3.0, 0.0, -3.0];
        assert!(RouteSpread::of(&opposite, 4, 2, &g).shared_energy.abs() < 1e-12, "rows cancelling share nothing");
    }
}
