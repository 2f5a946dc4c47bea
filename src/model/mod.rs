//! Model files and formats: GGUF, block quantization formats, configuration, weights.

pub mod arch;
pub mod config;
pub mod convert;
pub mod gguf;
pub mod gguf_bind;
pub mod gguf_config;
pub mod gguf_writer;
pub mod hf;
pub mod hf_bind;
pub mod hf_hybrid;
pub mod hf_synth;
pub mod hybrid;
pub mod layer;
pub mod loader;
pub mod moe;
pub mod quant;
pub mod rope;
pub mod rules;
pub mod safetensors;
pub mod shapes;
pub mod synth;
pub mod synth_gguf;
pub mod synth_scale;
pub mod tensor;
pub mod tensor_parallel;
pub mod weights;
