//! Implementations of the CLI subcommands (argument parsing and dispatch live in `crate::cli`).

pub mod backend_setup;
pub mod bench;
pub mod bench_constrained;
pub mod bench_modes;
pub mod bench_plan;
pub mod convert;
pub mod device_choice;
pub mod devices;
pub mod doctor;
pub mod eval;
pub mod generate;
pub mod host_plan;
pub mod job_settings;
pub mod jsonl;
pub mod kernels;
pub mod model_load;
pub mod placement;
pub mod quantize;
pub mod run;
pub mod slots;
pub mod synth;
pub mod tensor_parallel;
pub mod tokenize;
pub mod verify;
