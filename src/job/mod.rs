//! Batch jobs (`dustoff run`, `dustoff merge`): streaming readers, pipelines, the job loop,
//! checkpoints with resume, sharding, writers, progress and the final report.
//!
//! Exit codes are documented in [`exit`]; [`lock`] keeps a second run off a running job;
//! [`outputs`] refuses outputs that would overwrite an input; [`parallel`] runs several engines
//! (data parallel) behind the one job loop, routing requests by prompt prefix ([`routing`]).

pub mod adapters;
pub mod checkpoint;
pub mod decompress;
pub mod dry_run;
pub mod errors_file;
pub mod exit;
pub mod fingerprint;
pub mod identity;
pub mod incremental;
pub mod input_kind;
pub mod lock;
pub mod log;
pub mod merge_guard;
pub mod output;
pub mod output_spec;
pub mod outputs;
pub mod parallel;
pub mod pipeline;
pub mod progress;
pub mod reader;
pub mod record;
pub mod report;
pub mod routing;
pub mod row_stats;
pub mod runner;
pub mod search_path;
pub mod shard;
mod spans;
pub mod thinking;
pub mod tolerance;
pub mod usage;
pub mod writer;
