//! Implementations of the CLI subcommands (argument parsing lives in main.rs).

pub mod bench;
pub mod bench_constrained;
pub mod bench_plan;
pub mod common;
pub mod convert;
pub mod devices;
pub mod doctor;
pub mod engine_gen;
pub mod eval;
pub mod generate;
pub mod kernels;
pub mod quantize;
pub mod run;
pub mod tokenize;
