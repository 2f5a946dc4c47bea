//! The launchers: one module per kernel file (`kernels/<file>.cu` -> `ops/<file>.rs`: the
//! `#[repr(C)]` params mirror, shape checks, grid choice), what they share (`launch`: `Dev`,
//! shape checks, the one `launch` call;
//! `paged_attn`, `moe_slab`), and the plain (F16 and f32) launchers re-exported under one name,
//! so that step code and the parity tests write `l::Gemv`, `l::RmsNorm`, ... (`use
//! super::ops as l`).

pub mod add;
pub mod argmax;
pub mod attention;
pub mod attention_merge;
pub mod cublas_gemm;
pub mod deltanet;
pub mod embedding;
pub mod fused_norm;
pub mod gemm_tc;
pub mod gemv_f16;
pub mod hybrid_attn;
pub mod kv_cache;
pub mod launch;
pub mod moe_gemm;
pub mod moe_q8;
pub mod moe_slab;
pub mod paged_attn;
pub mod prefill;
pub mod q8x;
pub mod qlaunch;
pub mod rmsnorm;
pub mod rope;
pub mod shared_expert;
pub mod silu_mul;

pub use self::add::{BiasAdd, CastF16};
pub use self::argmax::{ArgmaxRows, MaskedArgmaxRows};
pub use self::attention::{attn_split_len, attn_splits, decode_split_len, Attention, DecodeKernel, SharedPrefix};
pub use self::attention_merge::Merge;
pub use self::cublas_gemm::Gemm;
pub use self::embedding::{Embedding, FillUniform};
pub use self::gemv_f16::{Gemv, GemvSwiglu};
pub use self::kv_cache::{KvStore, QkvPost};
pub use self::launch::GEMV_MAX_TOKENS;
pub use self::paged_attn::PagedAttn;
pub use self::rmsnorm::RmsNorm;
pub use self::rope::Rope;
pub use self::silu_mul::SiluMul;
