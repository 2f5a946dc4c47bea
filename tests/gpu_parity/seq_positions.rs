//! A CUDA backend sized for sequences of at most `max_positions` (the commands set it from the
//! job's longest sequence, `Placement::max_seq_positions`, so the RoPE tables and attention
//! partials do not grow with the KV pool): the engine runs a request that fits and refuses one
//! that needs more positions, naming both numbers, before any step.

use dustoff::backend::cuda::CudaBackend;
use dustoff::backend::Backend;
use dustoff::engine::batch::{Engine, EngineConfig, Request};
use dustoff::engine::sampler::SamplingParams;
use dustoff::model::loader::load_model;

use super::common::arch_dir;
use super::{gpu, opts};

#[test]
fn engine_refuses_a_request_longer_than_the_backend_was_sized_for() {
    let Some(_g) = gpu("sequence positions") else { return };
    let m = load_model(&arch_dir("qwen3_moe").join("qwen3_moe-f16.gguf")).unwrap();
    // A pool of 32 blocks (512 positions), sequences of at most 64.
    let o = dustoff::backend::cuda::CudaOptions { max_positions: 64, ..opts(32) };
    let b = CudaBackend::new(m.config.clone(), &m.weights, &o).unwrap();
    assert_eq!((b.max_seq_positions(), b.num_blocks() * b.block_size()), (64, 512));
    let mut e = Engine::new(b, EngineConfig::new(4, 256, false, m.fingerprint)).unwrap();
    let req = |id, prompt: usize, max_tokens| Request {
        id,
        prompt: (0..prompt as u32).map(|t| 100 + t).collect(),
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop_ids: Vec::new(),
    };
    // 60 + 5 - 1 = 64 positions: runs to its end.
    e.add_request(req(1, 60, 5)).unwrap();
    let done = e.run_to_completion().unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].token_ids.len(), 5);
    // 60 + 6 - 1 = 65: refused, with both numbers.
    let err = e.add_request(req(2, 60, 6)).unwrap_err().to_string();
    assert!(err.contains("needs 65 positions") && err.contains("at most 64"), "{err}");
}
