//! What a backend may allocate, decided before anything is loaded: `seqs` (the sequences it is
//! planned for), `memory` (weights + KV cache + recurrent states + workspace against the device's
//! free memory) and `budget` (`--max-gpu-memory`: the cap a plan is checked against).

pub mod budget;
pub mod memory;
pub mod seqs;
