//! The launchers of the plain (F16 and f32) kernel families under one name, so that step code
//! and the parity tests write `l::Gemv`, `l::RmsNorm`, ... (`use super::ops as l`). Only
//! re-exports: each launcher lives in the module of its kernel file.

pub use super::add::{BiasAdd, CastF16};
pub use super::argmax::{ArgmaxRows, MaskedArgmaxRows};
pub use super::attention::{attn_split_len, attn_splits, decode_split_len, Attention, SharedPrefix};
pub use super::attention_merge::Merge;
pub use super::cublas_gemm::Gemm;
pub use super::embedding::{Embedding, FillUniform};
pub use super::gemv_f16::{Gemv, GemvSwiglu};
pub use super::kv_cache::{KvStore, QkvPost};
pub use super::launch::GEMV_MAX_TOKENS;
pub use super::paged_attn::PagedAttn;
pub use super::rmsnorm::RmsNorm;
pub use super::rope::Rope;
pub use super::silu_mul::SiluMul;
