//! dustoff: batch LLM text processing on old GPU servers.
//!
//! Data flows one way: job reader -> pipeline render -> tokenizer -> engine scheduler (plans)
//! -> backend (cpu | cuda) -> sampler -> detokenize -> job writer + checkpoint.

pub mod backend;
pub mod cli;
pub mod commands;
pub mod engine;
pub mod job;
pub mod model;
pub mod quantize;
pub mod sys;
pub mod tokenizer;
