//! Batch jobs (`dustoff run`, `dustoff merge`): streaming readers, pipelines, the job loop,
//! checkpoints with resume, sharding, writers, progress and the final report.
//!
//! Exit codes are documented on [`runner::ExitCode`].

pub mod checkpoint;
pub mod dry_run;
pub mod output;
pub mod pipeline;
pub mod progress;
pub mod reader;
pub mod record;
pub mod report;
pub mod runner;
pub mod shard;
mod spans;
pub mod writer;
