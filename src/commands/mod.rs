//! Implementations of the CLI subcommands (argument parsing lives in main.rs).

pub mod bench;
pub mod common;
pub mod generate;
pub mod kernels;
pub mod tokenize;
pub mod convert;
