//! Run by hand on the GPU machine (`--ignored moe_bench`): what `dustoff bench --synthetic
//! qwen3-30b-a3b --dtype q4_k_m` (one stream, 768-token prompt, 200 out, medians of 3) and
//! `--batch 8,32,64` measure, through the same functions (`commands::bench`), on one synthetic
//! backend; the batched rows are run three times each and their medians printed.
//! `DUSTOFF_MOE_BENCH_BATCH=0` skips the batched rows, `DUSTOFF_MOE_BENCH_ONE=0` the one-stream
//! run, `DUSTOFF_MOE_BENCH_SHAPE` picks another
//! shape, `DUSTOFF_MOE_BENCH_PROMPT` the batched prompt length (default 128, 64 out).

use dustoff::backend::Backend;
use dustoff::commands::bench::{bench, bench_batched};
use dustoff::commands::common::{make_synthetic_backend, Device};

use super::gpu;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[test]
#[ignore]
fn moe_bench() {
    let g = gpu("moe bench").unwrap();
    drop(g);
    let shape = std::env::var("DUSTOFF_MOE_BENCH_SHAPE").unwrap_or_else(|_| "qwen3-30b-a3b".into());
    let batched = std::env::var("DUSTOFF_MOE_BENCH_BATCH").map_or(true, |v| v != "0");
    let one = std::env::var("DUSTOFF_MOE_BENCH_ONE").map_or(true, |v| v != "0");
    let prompt: usize = std::env::var("DUSTOFF_MOE_BENCH_PROMPT").ok().and_then(|v| v.parse().ok()).unwrap_or(128);
    let sizes = [8usize, 32, 64];
    let tokens = (768 + 200 + 16).max(64 * (prompt + 64 + 16));
    let mut b = make_synthetic_backend(&shape, "q4_k_m", &Device::Cuda(0), tokens, None).unwrap();
    eprintln!("{}", b.describe());
    let name = format!("synthetic {shape} q4_k_m");
    if one {
        let r = bench(b.as_mut(), &name, 768, 200, 3).unwrap();
        r.print_human();
        println!("ONE-STREAM {}", serde_json::to_string(&r).unwrap());
    }
    if !batched {
        return;
    }
    let all: Vec<usize> = sizes.iter().cycle().take(3 * sizes.len()).copied().collect();
    let rows = bench_batched(b, [0; 32], prompt, 64, &all, 2048).unwrap();
    println!("| sequences | decode tok/s (median of 3) | runs | prefill s (median) | share of bandwidth bound |");
    println!("|---|---|---|---|---|");
    for &n in &sizes {
        let rs: Vec<_> = rows.iter().filter(|r| r.sequences == n).collect();
        let tok: Vec<f64> = rs.iter().map(|r| r.decode_tok_s).collect();
        let pre = median(rs.iter().map(|r| r.prefill_s).collect());
        let share = median(rs.iter().map(|r| r.bandwidth_share.unwrap_or(0.0)).collect());
        let runs: Vec<String> = tok.iter().map(|t| format!("{t:.1}")).collect();
        println!("| {n} | {:.1} | {} | {pre:.3} | {:.1}% |", median(tok.clone()), runs.join(" / "), share * 100.0);
    }
}
