//! Tensor parallel on GPUs: `group` (N rank engines run as one backend), `rank` (a backend's
//! place in its group and the all-reduce after each block) and `nccl` (the library, loaded at run
//! time).

pub mod group;
pub mod nccl;
pub mod rank;
