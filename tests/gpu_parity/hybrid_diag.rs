//! Where the GPU's qwen35moe prefill leaves the CPU's: the input of every sparse layer (the
//! FFN-normed hidden state its router and experts read, `[n_tok, dim]`), tapped on both
//! backends for the same prompt, fed as one chunk, as chunks of 16 and token by token. Per
//! layer it prints the relative error by position range, and every position where the GPU's
//! routed experts (its router logits computed here from its tapped input) differ from the
//! CPU's, with the CPU's router gap there (k-th minus (k+1)-th logit). A defect of the
//! multi-token path shows as an error that grows with the position in every layer; a flipped
//! near-tie as an error that jumps at the flip and spreads from there.
//!
//! `gpu_parity --ignored hybrid_diag --nocapture` (`DUSTOFF_DIAG_PROMPTS`: the prompt names,
//! `DUSTOFF_DIAG_ARCH`: the reference model).

use std::sync::Arc;

use dustoff::backend::cpu::CpuBackend;
use dustoff::backend::cuda::CudaTap;
use dustoff::model::loader::{load_model, LoadedModel};

use super::common::{arch_dir, floats, ids};
use super::gpu;
use super::qwen35::{cuda, refs_in};
use super::route_flips::{logits_of, max_abs, rows_of, top_k, Rec, Taps};

/// Feeds `prompt` in pieces of `chunk` tokens; the last piece's logits.
fn feed<B: dustoff::backend::Backend>(b: &mut B, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let pieces: Vec<usize> = prompt.chunks(chunk).map(<[u32]>::len).collect();
    super::route_flips::feed_pieces(b, prompt, &pieces).pop().unwrap()
}

fn report(m: &LoadedModel, what: &str, cpu: &Taps, gpu: &Taps, n: usize) {
    let dim = m.config.dim;
    for (l, lw) in m.weights.layers.iter().enumerate() {
        let Some(moe) = &lw.moe else { continue };
        let name = &moe.router.name;
        let (c, g) = (rows_of(cpu, name), rows_of(gpu, name));
        assert_eq!((c.len(), g.len()), (n * dim, n * dim), "{what}: layer {l} taps");
        let router = moe.router.to_f32_vec();
        let mut bins = String::new();
        for (lo, hi) in [(0, 8), (8, 16), (16, 32), (32, 64), (64, 100), (100, usize::MAX)] {
            let hi = hi.min(n);
            if lo >= hi {
                continue;
            }
            let mut worst = 0f64;
            for t in lo..hi {
                let (cr, gr) = (&c[t * dim..(t + 1) * dim], &g[t * dim..(t + 1) * dim]);
                let scale = cr.iter().map(|v| v.abs() as f64).fold(0.0, f64::max).max(1e-30);
                worst = worst.max(max_abs(cr, gr) / scale);
            }
            bins.push_str(&format!(" [{lo},{hi}) {worst:.1e}"));
        }
        let mut flips = Vec::new();
        for t in 0..n {
            let (cr, gr) = (&c[t * dim..(t + 1) * dim], &g[t * dim..(t + 1) * dim]);
            let (cs, gap) = top_k(&logits_of(&router, cr), moe.n_used);
            let (gs, _) = top_k(&logits_of(&router, gr), moe.n_used);
            if cs != gs {
                flips.push(format!("{t}(gap {gap:.1e}: {cs:?}->{gs:?})"));
            }
        }
        println!("  {what} layer {l}: rel err by position{bins}; routing differs at {} positions: {}", flips.len(), {
            let mut f = flips.iter().take(8).cloned().collect::<Vec<_>>().join(" ");
            if flips.len() > 8 {
                f.push_str(" ...");
            }
            f
        });
    }
}

#[test]
#[ignore = "diagnosis (prints): per-layer GPU vs CPU error and routing differences of a hybrid MoE"]
fn hybrid_diag_moe_prefill_vs_cpu() {
    let Some(_g) = gpu("hybrid diag") else { return };
    // `DUSTOFF_DIAG_ARCH`: qwen3_5_moe (default) or qwen3_next, in its GGUF form.
    let arch = std::env::var("DUSTOFF_DIAG_ARCH").unwrap_or_else(|_| "qwen3_5_moe".into());
    let dir = arch_dir(&arch);
    let file = format!("{arch}-f16.gguf");
    let m = load_model(&dir.join(&file)).unwrap();
    let wanted = std::env::var("DUSTOFF_DIAG_PROMPTS").unwrap_or_else(|_| "short8,chunk64,code100,mixed200".into());
    let mut b = cuda(&m, 64);
    for r in refs_in(&dir).iter().filter(|r| wanted.split(',').any(|w| w == r["name"].as_str().unwrap())) {
        let prompt = ids(r, "prompt_ids");
        let n = prompt.len();
        let want: Vec<f32> = floats(r, "prompt_last_logits").iter().map(|&v| v as f32).collect();
        let cpu_taps: Taps = Arc::default();
        let mut cpu = CpuBackend::new(m.config.clone(), m.weights.clone(), 64, 16);
        cpu.set_tap(Box::new(Rec(cpu_taps.clone())));
        let cpu_last = feed(&mut cpu, &prompt, n);
        println!(
            "{} ({n} tokens, {file}): CPU vs transformers after the prompt {:.2e}",
            r["name"],
            max_abs(&cpu_last, &want)
        );
        for chunk in [n, 16, 1] {
            let gpu_taps: Taps = Arc::default();
            b.set_tap(CudaTap::new(Box::new(Rec(gpu_taps.clone())), &m.weights));
            let last = feed(&mut b, &prompt, chunk);
            b.take_tap();
            let what = format!("chunks of {chunk}");
            println!(
                "  {what}: GPU vs transformers {:.2e}, GPU vs CPU {:.2e}",
                max_abs(&last, &want),
                max_abs(&last, &cpu_last)
            );
            report(&m, &what, &cpu_taps, &gpu_taps, n);
        }
    }
}
