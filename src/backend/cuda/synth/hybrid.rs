//! Random-weight hybrid models made on the GPU (`bench --synthetic qwen3.5-9b`,
//! `qwen3.6-35b-a3b`): the layers of `CudaBackend::synthetic_mix` for Qwen3.5 and Qwen3.5-MoE,
//! with the matrices of each Gated DeltaNet layer (stacked q|k|v, z, b, a projection; output
//! projection) and the gated attention layers (q with its gate, k, v) in the formats of a
//! weight mix, and plausible small vectors (conv weights uniform in +-0.5, decay rates
//! `-exp(A_log)` with `A_log` in [0, 2.7], dt bias in +-0.5, norms 1). Sparse layers get
//! `MoeLayerW::synthetic` experts and a shared expert of the experts' width (both 512 in the
//! released Qwen3.5/3.6-35B-A3B), in the formats llama.cpp's mix gives `ffn_*_exps` and
//! `ffn_*_shexp` (`moe_formats`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::mix::{hybrid_shapes, synthetic_experts, synthetic_matrix_bytes, WeightMix};
use crate::backend::cuda::compile;
use crate::backend::cuda::device::up;
use crate::backend::cuda::dmat::{DevMat, Linear};
use crate::backend::cuda::hybrid::{LinearW, RecurrentCuda};
use crate::backend::cuda::layer::{AttnW, FfnW, LayerW, MixerW};
use crate::backend::cuda::model::{open, CudaBackend, CudaOptions, Parts};
use crate::backend::cuda::CudaError;
use crate::model::config::ModelConfig;
use crate::model::synth_scale::Scale;
use crate::quantize::mix::more_bits;

/// `mat(kernels, parts, scale, what)`: the next `parts` shapes of the model as one random
/// matrix of `scale`.
type MakeLinear<'a> = dyn FnMut(&mut compile::kernels::Kernels, usize, Scale, &str) -> Result<Linear, CudaError> + 'a;

impl CudaBackend {
    /// [`CudaBackend::synthetic_mix`] for a hybrid (Qwen3.5) shape.
    pub(in crate::backend::cuda) fn synthetic_hybrid(
        cfg: ModelConfig,
        mix: WeightMix,
        seed: u64,
        opts: &CudaOptions,
    ) -> Result<Self, CudaError> {
        let Some(h) = cfg.hybrid.clone() else {
            return Err(CudaError::Weights(format!("{} is not a hybrid shape", cfg.arch.name())));
        };
        let (base, more) = mix.formats();
        let c = &cfg;
        let shapes = hybrid_shapes(c, base, more);
        let matrix_bytes = synthetic_matrix_bytes(c, mix);
        let (dev, mut kernels, blas) = open(c, opts, matrix_bytes)?;
        let s = &dev.stream;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut n_mat = 0u64;
        let mut next = shapes.into_iter();
        let mut mat = |kernels: &mut compile::kernels::Kernels,
                       parts: usize,
                       scale: Scale,
                       what: &str|
         -> Result<Linear, CudaError> {
            let mut out = Vec::with_capacity(parts);
            for _ in 0..parts {
                let (t, rows, cols) = next.next().ok_or_else(|| CudaError::Weights(format!("no shape for {what}")))?;
                n_mat += 1;
                let seed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(n_mat);
                out.push(DevMat::synthetic(s, kernels, t, rows, cols, (scale, seed), what)?);
            }
            Ok(Linear { parts: out })
        };
        let ones = |n: usize, what: &str| up(s, &vec![1.0f32; n], what);
        // f16 elements of one layer's K (and of its V) cache: [num_blocks, block_size, kv_dim].
        let cache_len = opts.num_blocks * opts.block_size * c.kv_dim();
        let mut layers = Vec::with_capacity(c.n_layers);
        let mut index = 0;
        for i in 0..c.n_layers {
            let name = |x: &str| format!("layer {i} {x}");
            // The FFN after the mixer: experts and a shared expert, or dense gate/up and down.
            let ffn = |kernels: &mut compile::kernels::Kernels, mat: &mut MakeLinear| match synthetic_experts(
                s, kernels, c, mix, i, seed,
            )? {
                Some(m) => Ok::<_, CudaError>(FfnW::Moe(Box::new(m))),
                None => Ok(FfnW::Dense {
                    wgu: mat(kernels, 1, Scale::Matrix, &name("gate/up"))?,
                    wdown: mat(kernels, 1, Scale::Matrix, &name("w_down"))?,
                }),
            };
            if h.recurrent[i] {
                let (proj, out) = (
                    mat(&mut kernels, 1, Scale::Matrix, &name("linear in"))?,
                    mat(&mut kernels, 1, Scale::Matrix, &name("linear out"))?,
                );
                let (ch, nv, kk) = (h.conv_channels(), h.n_v_heads, h.conv_kernel);
                let conv: Vec<f32> = (0..ch * kk).map(|_| rng.random_range(-0.5..0.5)).collect();
                let neg_a: Vec<f32> = (0..nv).map(|_| -rng.random_range(0.0f32..2.7).exp()).collect();
                let dt_bias: Vec<f32> = (0..nv).map(|_| rng.random_range(-0.5..0.5)).collect();
                let d = LinearW {
                    proj,
                    conv: up(s, &conv, &name("conv1d"))?,
                    neg_a: up(s, &neg_a, &name("ssm_a"))?,
                    dt_bias: up(s, &dt_bias, &name("dt_bias"))?,
                    norm: ones(h.d_v, &name("ssm_norm"))?,
                    out,
                    index,
                };
                index += 1;
                let ffn = ffn(&mut kernels, &mut mat)?;
                layers.push(LayerW::synthetic(s, c.dim, i, MixerW::DeltaNet(d), ffn)?);
            } else {
                let wqkv = mat(
                    &mut kernels,
                    if more_bits(i, c.n_layers) && more != base { 2 } else { 1 },
                    Scale::Matrix,
                    &name("wqkv"),
                )?;
                let wo = mat(&mut kernels, 1, Scale::Residual(c.n_layers as u32), &name("wo"))?;
                let attn = AttnW::synthetic(s, c.head_dim, i, (cache_len, opts.kv_type), (wqkv, None, wo), true)?;
                let ffn = ffn(&mut kernels, &mut mat)?;
                layers.push(LayerW::synthetic(s, c.dim, i, MixerW::Attention(attn), ffn)?);
            }
        }
        let embd = mat(&mut kernels, 1, Scale::Unit, "token_embd")?;
        let output = if c.tied_embeddings { None } else { Some(mat(&mut kernels, 1, Scale::Matrix, "output")?) };
        let output_norm = ones(c.dim, "output_norm")?;
        let recurrent = RecurrentCuda::new(s, &h, index, opts.seqs())?;
        dev.synchronize()?;
        let parts = Parts {
            layers,
            embd,
            output,
            output_norm,
            rope_freq_factors: None,
            clamped: 0,
            recurrent: Some(recurrent),
        };
        Self::assemble(cfg, dev, kernels, blas, parts, opts)
    }
}
