//! The engine: scheduling, the paged KV block pool, hybrid models' recurrent-state pool, sampling. Pure Rust, no tensor types.

pub mod batch;
pub mod constraint;
pub mod descending;
pub mod finish;
pub mod kv;
pub mod plan;
pub mod sampler;
pub mod scheduler;
pub mod single;
pub mod state_pool;
pub mod step_cost;
