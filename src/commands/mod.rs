//! Implementations of the CLI subcommands (argument parsing and dispatch live in `crate::cli`).

pub mod bench;
pub mod bench_constrained;
pub mod bench_modes;
pub mod bench_plan;
pub mod common;
pub mod convert;
pub mod devices;
pub mod doctor;
pub mod eval;
pub mod generate;
pub mod kernels;
pub mod quantize;
pub mod run;
pub mod synth;
pub mod tensor_parallel;
pub mod tokenize;
pub mod verify;
