//! Every environment variable the binary reads, in one registry: name, default and meaning
//! (dustoff's own `DUSTOFF_*` knobs, and the host's variables it looks at, [`Scope::Host`]).
//! docs/ENVIRONMENT.md is this table rendered ([`markdown`]); a test greps `src/` and `tests/`
//! for `DUSTOFF_` names and fails on one missing here or on a stale document, so the list
//! cannot drift. The binary's readers call [`get`] / [`get_os`]; tests read theirs directly.
//!
//! A new switch is one line in [`VARS`], e.g.
//! `var(Scope::Tuning, "DUSTOFF_FOO", "off", "1: the foo kernel (for A/B runs)"),`
//! read as `crate::sys::env::get("DUSTOFF_FOO")`; then run `cargo test --release --lib
//! sys::env` and paste the table it prints into docs/ENVIRONMENT.md.

use std::ffi::OsString;

/// Who the variable is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Operators: changes what a command does or where it finds things.
    Run,
    /// A/B switches of kernel choices (benchmarks; the defaults are the measured best).
    Tuning,
    /// Fault injection and knobs for the test suite and benchmark tests.
    Test,
    /// Set by the host, a scheduler or the user's shell for other programs too; read, never
    /// defined, by dustoff.
    Host,
}

impl Scope {
    fn title(self) -> &'static str {
        match self {
            Scope::Run => "Running jobs",
            Scope::Tuning => "Kernel choice (A/B switches, read once per process)",
            Scope::Test => "Tests, fault injection and benchmark tests",
            Scope::Host => "Read from the host (not dustoff's own)",
        }
    }
}

/// One environment variable.
#[derive(Clone, Copy, Debug)]
pub struct EnvVar {
    pub scope: Scope,
    pub name: &'static str,
    /// What holds when it is unset.
    pub default: &'static str,
    pub meaning: &'static str,
}

const fn var(scope: Scope, name: &'static str, default: &'static str, meaning: &'static str) -> EnvVar {
    EnvVar { scope, name, default, meaning }
}

/// The registry, grouped by scope.
pub const VARS: &[EnvVar] = &[
    var(Scope::Host, "HOME", "-", "the NVRTC kernel cache's folder `~/.cache/dustoff` without `XDG_CACHE_HOME`; NVRTC is looked for in `~/.cache/nvrtc*` and `~/.local/lib/python3*` (pip wheels)"),
    var(Scope::Host, "XDG_CACHE_HOME", "unset: `~/.cache`", "an absolute path: the NVRTC kernel cache is `$XDG_CACHE_HOME/dustoff`"),
    var(Scope::Host, "LD_LIBRARY_PATH", "-", "the first folders searched for NVRTC libraries"),
    var(Scope::Host, "NVRTC12_DIR", "unset: `~/.cache/nvrtc12`", "where scripts/nvrtc12.sh unpacked NVRTC 12 (searched for NVRTC)"),
    var(Scope::Host, "VIRTUAL_ENV", "unset", "a Python virtual environment: its pip wheels' NVRTC (`lib/python3*/site-packages/nvidia/cuda_nvrtc/lib`) is searched"),
    var(Scope::Host, "CUDA_VISIBLE_DEVICES", "unset", "reported by `doctor` (the driver applies it)"),
    var(Scope::Host, "CUBLAS_WORKSPACE_CONFIG", "unset: the binary sets `:4096:1`", "cuBLAS's workspace pool (`:KiB:count`); unset, `dustoff` asks for one 4 MiB buffer (cuBLAS's pre-Hopper default; its Hopper default, 2 x 32 MiB, is 63 MB more)"),
    var(Scope::Host, "SLURM_ARRAY_TASK_ID", "unset", "`run` without `--shard`: this task's shard (a Slurm job array)"),
    var(Scope::Host, "SLURM_ARRAY_TASK_MIN", "0", "the array's first task id, subtracted from `SLURM_ARRAY_TASK_ID`"),
    var(Scope::Host, "SLURM_ARRAY_TASK_COUNT", "unset", "the shard count of a Slurm job array when `--shard-count` is not given"),
    var(Scope::Host, "JOB_COMPLETION_INDEX", "unset", "`run` without `--shard`: this pod's shard (a Kubernetes Indexed Job)"),
    var(Scope::Run, "DUSTOFF_MODEL", "unset: `samples/models/SmolLM2-135M-Instruct.Q4_1.gguf` (relative to the current folder)", "the model of `run` and `generate` when `--model` is not given (set it for cron, whose current folder is `$HOME`)"),
    var(Scope::Run, "DUSTOFF_PIPELINES", "unset", "folders (separated by `:`) where `run` looks up pipeline names, after `--pipelines DIR` and before `pipelines/` beside the binary and in the current folder"),
    var(Scope::Run, "DUSTOFF_PROGRESS_SECONDS", "10", "seconds between `run`'s progress lines when stderr is not a terminal (records, percent, ETA, rates); `0`: after every engine step"),
    var(Scope::Run, "DUSTOFF_NVRTC", "unset: the newest suitable NVRTC found", "an NVRTC library file (e.g. `libnvrtc.so.11.2`) to compile kernels with instead of searching (docs/COMPATIBILITY.md)"),
    var(Scope::Run, "DUSTOFF_PTX_DIR", "unset: `ptx/` beside the binary if that folder exists, else NVRTC compiles the kernels", "folder of precompiled PTX (`dustoff kernels --out DIR`); `--ptx-dir` wins over it"),
    var(Scope::Run, "DUSTOFF_LOAD_THREADS", "the cores", "threads that compile the kernel files with NVRTC at start (the driver loads the modules one at a time); `1`: one file at a time"),
    var(Scope::Run, "DUSTOFF_CPU_PATH", "the best the CPU has", "cap on the CPU backend's kernel path: `scalar`, `avx2` or `avx512` (a bad value is a usage error)"),
    var(Scope::Run, "DUSTOFF_SHARD_COUNT", "unset", "shard count with a Kubernetes Indexed Job's `JOB_COMPLETION_INDEX` when `--shard-count` is not given"),
    var(Scope::Run, "DUSTOFF_COMMIT_ROWS", "64", "rows per checkpoint commit of `run` and `generate --input` (lower: commits after a few records)"),
    var(Scope::Run, "DUSTOFF_CUBLAS", "1 when libcublas loads", "`0`: leave cuBLAS unloaded; prefill products run on dustoff's tensor-core GEMM in 64-token slices (what a server without the CUDA libraries gets)"),
    var(Scope::Run, "DUSTOFF_CUDA_GRAPHS", "1", "`0`: no CUDA-graph replay of decode steps"),
    var(Scope::Run, "DUSTOFF_TP_ALLREDUCE", "auto", "`--tensor-parallel` on GPUs: `nccl` or `host` (download, sum in rank order, upload); auto: NCCL for ranks on distinct GPUs, host-staged for ranks sharing one and for one rank"),
    var(Scope::Run, "DUSTOFF_MEMORY_LOG", "0", "`1`: each CUDA step-buffer allocation and the device memory in use after it, on stderr"),
    var(Scope::Run, "DUSTOFF_PROFILE", "0", "`1`: GPU time per kernel class of the forward pass, printed at exit (graphs off)"),
    var(Scope::Tuning, "DUSTOFF_TC_MIN_TOKENS", "2", "fewest tokens of a step for the tensor-core GEMM"),
    var(Scope::Tuning, "DUSTOFF_TC_MAX_TOKENS", "16", "most tokens of a step for the tensor-core GEMM; larger steps use cuBLAS"),
    var(Scope::Tuning, "DUSTOFF_TC_ROWS", "128 where it fits", "`64`: 64-row blocks of the wide-tile GEMM"),
    var(Scope::Tuning, "DUSTOFF_QGEMV_MAX_TOKENS", "4", "most tokens (1..=8) of a step for the GEMV on packed quantized blocks; larger steps widen to F16"),
    var(Scope::Tuning, "DUSTOFF_QGEMV_F32", "0", "`1`: the f32-input GEMV on packed blocks instead of the int8-activation dp4a GEMV"),
    var(Scope::Tuning, "DUSTOFF_QGEMV_ROWS", "4", "`2`: the 1-token int8 GEMV reads 2 weight rows per warp"),
    var(Scope::Tuning, "DUSTOFF_QGEMM_MAX_TOKENS", "64", "most tokens of a step for the tensor-core GEMM on packed blocks (`0`: always widen to F16)"),
    var(Scope::Tuning, "DUSTOFF_ATTN_ONEPASS", "1", "`0`: the two-pass decode attention for every step"),
    var(Scope::Tuning, "DUSTOFF_ATTN_TC", "1", "`0`: decode attention on CUDA cores (the one-pass kernel) instead of the tensor cores for head sizes 64 and 128"),
    var(Scope::Tuning, "DUSTOFF_ATTN_TC_MIN_TOKENS", "8", "fewest tokens of a decode step on the tensor-core attention kernel (fewer were faster on the one-pass kernel)"),
    var(Scope::Tuning, "DUSTOFF_ATTN_WARPS", "4", "warps (1..=16) of a one-pass decode attention block"),
    var(Scope::Tuning, "DUSTOFF_ATTN_SPLIT", "chosen per shape", "positions (a multiple of 16) per decode attention split"),
    var(Scope::Tuning, "DUSTOFF_CASCADE", "1", "`0`: no shared-prefix (cascade) attention in decode steps"),
    var(Scope::Tuning, "DUSTOFF_WIDE_MB", "32", "MB of the F16 scratch quantized matrices are widened into for large steps (larger matrices go in row chunks)"),
    var(Scope::Tuning, "DUSTOFF_QGEMM_Z64", "0", "`1`: steps above 64 tokens on the packed GEMM take 64-token tiles instead of the 128-token tile"),
    var(Scope::Tuning, "DUSTOFF_QGEMM_R128", "0 (off)", "`N`: steps of N or more tokens on the packed GEMM take the 128-row tile of 8 warps (rows a multiple of 128)"),
    var(Scope::Tuning, "DUSTOFF_QGEMM_BLOCKS", "chosen per shape", "blocks the packed GEMM of 9..=64 tokens aims for through its split-K"),
    var(Scope::Tuning, "DUSTOFF_QGEMM_SPLIT_COST", "2", "a block's start-up, in 128-column chunks, when the packed GEMM picks its split-K by whole waves of resident blocks (0: by the block target alone)"),
    var(Scope::Tuning, "DUSTOFF_FUSE_NORM", "1", "`0`: the layer norms as launches of their own instead of folded into the products that read them"),
    var(Scope::Tuning, "DUSTOFF_GEMV_ROWS", "4", "rows (2, 4 or 8) a block of the one-token F16 GEMVs"),
    var(Scope::Tuning, "DUSTOFF_PREFILL_QS", "0", "`1`: the prefill attention keeps its Q tile in shared memory for head sizes 64 and 128 too"),
    var(Scope::Tuning, "DUSTOFF_PREFILL_ACC", "1", "`0`: the prefill attention's softmax through shared memory also from compute capability 8.0 on (else on the accumulators there)"),
    var(Scope::Tuning, "DUSTOFF_ATTN_FAST_EXP", "1", "`0`: the one-pass decode attention's exponentials as `expf` instead of one multiply and the SFU's 2^x"),
    var(Scope::Tuning, "DUSTOFF_DN_FUSED", "1", "`0`: a Gated DeltaNet layer runs conv1d and the L2 norms + gates as two kernels instead of one"),
    var(Scope::Tuning, "DUSTOFF_DN_RECUR_NORM", "1", "`0`: the step form of the delta rule and the gated RMSNorm of its output as two kernels instead of one"),
    var(Scope::Tuning, "DUSTOFF_SHEXP_PAIRS", "1", "`0`: a one-stream step runs the shared expert in launches of its own instead of as one more pair of the routed experts' launches"),
    var(Scope::Tuning, "DUSTOFF_SHEXP_FUSED", "1", "`0`: the shared expert's gate as a launch of its own after the down product instead of folded into the down GEMV's int8 input"),
    var(Scope::Tuning, "DUSTOFF_DN_CHUNK_MIN", "32", "fewest tokens of a prompt chunk for the chunked (WY) delta rule; shorter chunks run the step form (`0`: never chunked)"),
    var(Scope::Run, "DUSTOFF_GRAPH_NODES", "0", "`1`: print the node count of every captured decode graph"),
    var(Scope::Run, "DUSTOFF_STEP_TIMES", "0", "`1`: per step size, the median GPU time of a step against its period, printed at exit"),
    var(Scope::Run, "DUSTOFF_STATE_SNAPSHOTS", "8", "hybrid models on a GPU: prefix-reuse state snapshots kept at once (in the memory plan; the least recently used is evicted and its prefix computed again)"),
    var(Scope::Run, "DUSTOFF_ROUTE_STATS", "unset", "`1`: the CPU backend prints a line per sparse layer of each step: the experts its tokens chose, the most tokens one expert got, and the share of the router input that all tokens share (how a model's routing spreads; a synthetic file's should spread like a real one's)"),
    var(Scope::Tuning, "DUSTOFF_MOE_GEMM", "1", "`0`: MoE steps grouped by expert run the grouped GEMV instead of the tensor-core grouped GEMM"),
    var(Scope::Tuning, "DUSTOFF_MOE_GEMM_SKIP", "1", "`0`: the grouped MoE GEMM computes every 16-token fragment of a tile, also those past its expert's tokens"),
    var(Scope::Tuning, "DUSTOFF_MOE_T8", "2", "`N`: the grouped MoE GEMM's 8-token tile while a step's mean expert holds at most N tokens (batched decode; 32 sequences of top-8 over 128 experts: 2); `0`: never"),
    var(Scope::Tuning, "DUSTOFF_MOE_MMA", "0", "`1`: the grouped MoE GEMM's 8- and 16-token tiles dequantize the weights straight into mma.m8n8k4 fragments in registers instead of staging them as F16 in shared memory (m8n8k4 is a V100's native form; an H100 runs these tiles 3-4x slower, docs/BENCHMARKS.md row M11)"),
    var(Scope::Tuning, "DUSTOFF_MOE_T128", "96", "`N`: the grouped MoE GEMM's 128-token tile (64 weight rows x 128 tokens, 8 warps) for the gate/up product of prefill steps whose mean expert holds at least N tokens (a 2,048-token step of top-8 over 128 experts: 128); `0`: never"),
    var(Scope::Tuning, "DUSTOFF_MOE_WIDE_TILE", "1", "`0`: the grouped MoE GEMM's down product of prefill steps keeps 64 x 64 tiles instead of 128 rows x 48 tokens"),
    var(Scope::Tuning, "DUSTOFF_ROUTER_TILED", "0", "`1`: the MoE router logits of steps above 8 tokens in 32 x 32 tiles instead of a warp per (expert, token) (measured slower below 768 tokens)"),
    var(Scope::Tuning, "DUSTOFF_MOE_FUSED", "1", "`0`: the MoE router, top-k, down and weighted sum as separate launches instead of two fused ones"),
    var(Scope::Tuning, "DUSTOFF_MOE_Q8", "0", "`1`: MoE steps of up to `DUSTOFF_MOE_PAIR_MAX_TOKENS` tokens on int8 activations (dp4a) instead of f32"),
    var(Scope::Tuning, "DUSTOFF_MOE_PAIR_MAX_TOKENS", "8", "most tokens of a step for the per-(token, expert) MoE kernels; larger steps group by expert"),
    var(Scope::Test, "DUSTOFF_INJECT_OOM", "unset", "`STEP[,SEQS]`: the first step from STEP on with at least SEQS sequences, and every later one as large, fails out of memory"),
    var(Scope::Test, "DUSTOFF_INJECT_WRITE_ERROR", "unset", "`commit:N`: the N-th checkpoint commit fails like a full disk; `output`: the final output does"),
    var(Scope::Test, "DUSTOFF_INJECT_KILL", "unset", "`finish-after-output`, `finish-after-discard-rename` or `finish-during-removal`: the process kills itself (SIGKILL) at that instant of a job's last step"),
    var(Scope::Test, "DUSTOFF_REQUIRE_GPU", "unset", "`1`: GPU tests fail instead of skipping when no CUDA device is usable"),
    var(Scope::Test, "DUSTOFF_FLIPS_ARCH", "qwen3_moe,qwen3_5,qwen3_5_moe,qwen3_next", "families (comma-separated) of the ignored route-flips diagnosis (gpu_parity `route_flips_diag`)"),
    var(Scope::Test, "DUSTOFF_FLIPS_PIECE", "unset: the whole prompt", "prompt pieces (tokens) of the route-flips diagnosis"),
    var(Scope::Test, "DUSTOFF_FLIPS_CPU_F16_CACHE", "unset", "`1`: the route-flips diagnosis rounds the CPU's cached K/V to F16 as the GPU stores them"),
    var(Scope::Test, "DUSTOFF_FLIPS_TAPS", "unset", "`1`: the route-flips tests print the error at every tapped matrix input"),
    var(Scope::Test, "DUSTOFF_PARITY_SEED", "random (printed)", "replays the random inputs of a GPU parity test"),
    var(Scope::Test, "DUSTOFF_CRASH_SEED", "random (printed)", "replays the kill delays of the random crash test"),
    var(Scope::Test, "DUSTOFF_HF_SAMPLES_DIR", "unset: skipped", "where the ignored `hf_models` test writes its sample HF directories"),
    var(Scope::Test, "DUSTOFF_BENCH_PROMPT", "256", "context length of the CPU backend's batched bench test"),
    var(Scope::Test, "DUSTOFF_BENCH_SHAPE", "qwen3-8b", "synthetic shape of the GPU bench test"),
    var(Scope::Test, "DUSTOFF_BENCH_DTYPE", "unset: F16 and the kernel table", "weight mix of the GPU bench test (`q4_k_m`, `q8_0`, ...): one stream (768 in) with graphs, no kernel table"),
    var(Scope::Test, "DUSTOFF_BENCH_RUNS", "3", "timed runs of the GPU bench test with DUSTOFF_BENCH_DTYPE"),
    var(Scope::Test, "DUSTOFF_BENCH_GEN", "200", "generated tokens of the GPU bench test with DUSTOFF_BENCH_DTYPE"),
    var(Scope::Test, "DUSTOFF_BENCH_SEQS", "0", "with DUSTOFF_BENCH_DTYPE: batched decode of this many sequences instead of one stream (prints the peak memory)"),
    var(Scope::Test, "DUSTOFF_BENCH_PROMPT_TOKENS", "768", "prompt tokens of each sequence of DUSTOFF_BENCH_SEQS"),
    var(Scope::Test, "DUSTOFF_BENCH_DTYPES", "f16,q4_k_m", "weight types of the Qwen3.5 GPU bench test"),
    var(Scope::Test, "DUSTOFF_LONG_PROMPTS", "8192,16384", "prompt lengths of the GPU long-context bench test (comma-separated)"),
    var(Scope::Test, "DUSTOFF_SP_REQUESTS", "256", "requests of the GPU shared-prefix job bench test"),
    var(Scope::Test, "DUSTOFF_SP_CACHE", "unset: on, then off", "`on`: the GPU shared-prefix job bench test runs only its prefix-cache-on half"),
    var(Scope::Test, "DUSTOFF_BREAKDOWN_FORMATS", "q4_0,q8_0,q4_k,q6_k", "formats of the quantized-kernel breakdown bench test"),
    var(Scope::Test, "DUSTOFF_BREAKDOWN_GEMM_ONLY", "unset", "1: the quantized-kernel breakdown times the packed GEMM only (no GEMV rows)"),
    var(Scope::Test, "DUSTOFF_BENCH_STEP_TOKENS", "2048", "engine step budget (`--max-batch-tokens`) of the GPU bench test's batched rows"),
    var(Scope::Test, "DUSTOFF_PREFILL_DTYPES", "q4_k_m,f16", "weight mixes of the prefill-profile bench test"),
    var(Scope::Test, "DUSTOFF_MOE_BENCH_SHAPE", "qwen3-30b-a3b", "synthetic shape of the MoE GPU bench test"),
    var(Scope::Test, "DUSTOFF_MOE_BENCH_PROMPT", "128", "prompt length of the MoE bench test's batched rows"),
    var(Scope::Test, "DUSTOFF_LONG_RUNS", "3", "runs (medians) of each prompt of the long-context GPU bench test"),
    var(Scope::Test, "DUSTOFF_BENCH_9B", "0", "`1`: the hybrid fusion bench test also runs the Qwen3.5-9B shape one stream"),
    var(Scope::Test, "DUSTOFF_BENCH_BATCH", "1", "`0`: the Qwen3.6-35B-A3B GPU bench test skips its batched rows"),
    var(Scope::Test, "DUSTOFF_MOE_BENCH_SIZES", "8,32,64", "sequence counts of the MoE bench test's batched rows"),
    var(Scope::Test, "DUSTOFF_MOE_BENCH_BATCH", "1", "`0`: the MoE bench test skips its batched rows"),
    var(Scope::Test, "DUSTOFF_MOE_BENCH_ONE", "1", "`0`: the MoE bench test skips its one-stream row"),
    var(Scope::Test, "DUSTOFF_DIAG_ARCH", "qwen3_5_moe", "reference model (GGUF form) of the hybrid diagnosis test (`hybrid_diag`)"),
    var(Scope::Test, "DUSTOFF_DIAG_PROMPTS", "short8,chunk64,code100,mixed200", "reference prompts the hybrid diagnosis test runs"),
];

/// The registry entry of `name`.
pub fn lookup(name: &str) -> Option<&'static EnvVar> {
    VARS.iter().find(|v| v.name == name)
}

/// The value of a registered variable (`None`: unset or not UTF-8). A name missing from
/// [`VARS`] is a programming error, caught in debug builds and by this module's test.
pub fn get(name: &str) -> Option<String> {
    debug_assert!(lookup(name).is_some(), "{name} is not in sys::env::VARS");
    std::env::var(name).ok()
}

/// As [`get`], for paths (any bytes).
pub fn get_os(name: &str) -> Option<OsString> {
    debug_assert!(lookup(name).is_some(), "{name} is not in sys::env::VARS");
    std::env::var_os(name)
}

/// docs/ENVIRONMENT.md: the registry as tables, one per scope.
pub fn markdown() -> String {
    let mut s = String::from(
        "# Environment variables\n\nEvery `DUSTOFF_*` variable dustoff and its tests read, and the host's \
         variables dustoff looks at. Generated from `src/sys/env.rs` (the registry); a test keeps the two \
         equal.\n",
    );
    for scope in [Scope::Run, Scope::Tuning, Scope::Test, Scope::Host] {
        s.push_str(&format!("\n## {}\n\n| variable | default | meaning |\n|---|---|---|\n", scope.title()));
        for v in VARS.iter().filter(|v| v.scope == scope) {
            s.push_str(&format!("| `{}` | {} | {} |\n", v.name, v.default, v.meaning));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    /// Every `DUSTOFF_[A-Z0-9_]+` word in the `.rs` files below `dir` (but this one, which
    /// holds the registry).
    fn names_in(dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                names_in(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("src/sys/env.rs") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                for (i, _) in text.match_indices("DUSTOFF_") {
                    let rest = &text[i..];
                    let end = rest.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'));
                    let name = &rest[..end.unwrap_or(rest.len())];
                    // `DUSTOFF_` alone (a prefix in prose) or a name ending in `_` (a prefix
                    // being built) is not a variable.
                    if name.len() > "DUSTOFF_".len() && !name.ends_with('_') {
                        out.insert(name.to_string());
                    }
                }
            }
        }
    }

    #[test]
    fn registry_lists_every_variable_the_source_reads_and_the_docs_match() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut used = BTreeSet::new();
        names_in(&root.join("src"), &mut used);
        names_in(&root.join("tests"), &mut used);
        let all: BTreeSet<&str> = VARS.iter().map(|v| v.name).collect();
        assert_eq!(all.len(), VARS.len(), "a name is listed twice in sys::env::VARS");
        // The host's variables are not greppable by a prefix; dustoff's own all start DUSTOFF_.
        let own = VARS.iter().filter(|v| v.scope != Scope::Host);
        assert!(VARS.iter().all(|v| (v.scope == Scope::Host) != v.name.starts_with("DUSTOFF_")), "scope of a name");
        let listed: BTreeSet<String> = own.map(|v| v.name.to_string()).collect();
        let missing: Vec<_> = used.difference(&listed).collect();
        assert!(missing.is_empty(), "add these to sys::env::VARS (name, default, meaning): {missing:?}");
        let stale: Vec<_> = listed.difference(&used).collect();
        assert!(stale.is_empty(), "in sys::env::VARS but read nowhere: {stale:?}");
        let doc = std::fs::read_to_string(root.join("docs/ENVIRONMENT.md")).unwrap_or_default();
        let want = markdown();
        if doc != want {
            println!("{want}");
        }
        assert!(
            doc == want,
            "docs/ENVIRONMENT.md differs from sys::env::markdown(): replace it with the text printed above"
        );
    }
}
