//! One forward step on the device. Below `model` (which holds their values): `flat` (the shape
//! of a flattened step), `attn` (its attention inputs and outputs), `cascade` (shared-prefix
//! groups of a decode step), `workspace` (the step's buffers), `graph` (captured CUDA graphs),
//! `norm` (layer norms folded into the products that read them). Above `model` (`impl
//! CudaBackend` blocks; `model` never names them): `inputs` (the plan flattened and uploaded),
//! `run` (the layers' launches, graph replay, logits back), `masked` (the grammar-masked greedy
//! step), `weights_read` (the weights a step read, for the step bound).

pub(super) mod attn;
pub mod cascade;
pub(super) mod flat;
pub(super) mod graph;
pub(super) mod inputs;
pub mod masked;
pub(super) mod norm;
pub(super) mod run;
pub(super) mod weights_read;
pub(super) mod workspace;
