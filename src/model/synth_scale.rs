//! The scale of each random weight tensor of a synthetic model (`synth::random_weights`, the
//! `dustoff synth` files, the GPU's in-memory `bench --synthetic` models): one rule for all three,
//! so that their tokens spread over the experts as a trained model's do.

/// The values a random weight tensor is drawn from (uniform in +- `amplitude`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scale {
    /// Uniform in +-sqrt(3 / cols): a matrix with unit-variance outputs for unit-variance inputs.
    Matrix,
    /// Uniform in +-sqrt(3): unit-variance elements, for the token embedding: at the matrices'
    /// scale an embedding row (RMS 1 / sqrt(dim)) would be far smaller than what the first layer
    /// adds to it, and the token's own part of the residual stream would be lost at once.
    Unit,
    /// The matrices' scale over sqrt(layers), for the attention output projection. With random
    /// Q and K the softmax is nearly flat, so an attention output is about the mean V of its
    /// context: one vector for every token of it. At the matrices' scale each layer adds that
    /// shared vector at the stream's own size, the shared part grows layer by layer and the
    /// router sends every token to the same experts (measured on the Qwen3-30B-A3B shape with the
    /// matrices' scale everywhere: one expert got 405-510 tokens of a 512-token chunk, and by the
    /// 12th layer 41 of 128 experts had any). Scaled so, all layers together add about what one
    /// did, and a chunk's tokens spread over the experts as a trained model's do
    /// (`DUSTOFF_ROUTE_STATS=1`; docs/BENCHMARKS.md, Method, "Routing of the synthetic files").
    Residual(u32),
}

impl Scale {
    /// The amplitude of the uniform values of a tensor with rows of `cols` elements.
    pub fn amplitude(self, cols: usize) -> f32 {
        match self {
            Scale::Matrix => (3.0 / cols as f32).sqrt(),
            Scale::Unit => 3f32.sqrt(),
            Scale::Residual(layers) => (3.0 / cols as f32).sqrt() / (layers.max(1) as f32).sqrt(),
        }
    }
}

/// The scale of a weight tensor's values by its GGUF name (`layers`: the model's): unit-variance elements for
/// the token embedding, the residual scale for the attention output projection, the matrices'
/// scale for every other.
pub fn scale_of(name: &str, layers: usize) -> Scale {
    if name == "token_embd.weight" {
        Scale::Unit
    } else if name.ends_with("attn_output.weight") {
        Scale::Residual(layers as u32)
    } else {
        Scale::Matrix
    }
}
