//! Random-weight models made on the GPU (`bench --synthetic`): `mix` (a weight mix's formats and
//! every matrix's shape and bytes) and `hybrid` (the Qwen3.5 / Qwen3.5-MoE layers).

pub(super) mod hybrid;
pub mod mix;
