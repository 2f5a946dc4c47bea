//! Binds the tensors of a Hugging Face checkpoint (safetensors, one file or shards) as model
//! weights: plain-attention families (with a shared expert for Qwen2-MoE) through the tensor
//! plan of `hf` (every tensor named, shape- and dtype-checked), hybrid ones (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) layer by layer;
//! experts one tensor each or fused. Matrices stay in the memory map in their stored type (BF16,
//! F16 or F32: the CPU backend widens rows as it computes); norms and biases are widened to f32.
//! See `model::hybrid` for how a hybrid checkpoint's tensors differ from its GGUF form.

use std::collections::HashMap;
use std::path::Path;

use super::config::ModelConfig;
use super::hf::{read_config, tensor_plan, HfError, HfExtras};
use super::hybrid::{fused_ba_rows, fused_qkvz_rows, DeltaNetWeights, HybridConfig, HybridLayer};
use super::moe::{Expert, MoeConfig, MoeWeights, SharedExpert};
use super::quant::dequantize_row;
use super::safetensors::{SafetensorsDir, SafetensorsError};
use super::tensor::Tensor;
use super::weights::{LayerWeights, ModelWeights};

/// Reads the tensors of `plan` (shape- and dtype-checked) and binds them as model weights.
/// Matrices keep their dtype (BF16, F16 or F32: the CPU backend widens rows as it computes);
/// norms and biases are widened to f32.
pub fn load_weights(st: &SafetensorsDir, c: &ModelConfig, x: &HfExtras) -> Result<ModelWeights, HfError> {
    if let Some(h) = &c.hybrid {
        return load_hybrid(st, c, h);
    }
    let plan = tensor_plan(c, x);
    let mut mats: HashMap<&str, Tensor> = HashMap::new();
    // Expert matrices by (stacked GGUF name, expert).
    let mut expert_mats: HashMap<(String, usize), Tensor> = HashMap::new();
    let mut vecs: HashMap<&str, Vec<f32>> = HashMap::new();
    for p in &plan {
        let (ty, shape, bytes) = st.read(&p.hf)?;
        if shape != p.shape.as_slice() {
            return Err(HfError::Shape {
                path: st.path_of(&p.hf),
                tensor: p.hf.clone(),
                expected: p.shape.clone(),
                found: shape.to_vec(),
            });
        }
        if p.is_vector() {
            let mut out = vec![0f32; p.shape[0]];
            dequantize_row(ty, bytes, &mut out);
            vecs.insert(p.gguf.as_str(), out);
        } else {
            // Matrices stay in the memory map (an 8B BF16 model is not copied into RAM). The
            // byte count was checked when the file was opened; `from_mapped` checks it again.
            let (file, info) = st.get(&p.hf)?;
            let t = Tensor::from_mapped(
                p.hf.clone(),
                ty,
                p.shape[0],
                p.shape[1],
                file.mmap().clone(),
                info.start,
                bytes.len(),
            );
            let t = t.ok_or_else(|| HfError::Shape {
                path: st.path_of(&p.hf),
                tensor: p.hf.clone(),
                expected: p.shape.clone(),
                found: shape.to_vec(),
            })?;
            match p.expert {
                Some(e) => expert_mats.insert((p.gguf.clone(), e), t),
                None => mats.insert(p.gguf.as_str(), t),
            };
        }
    }
    // Every planned name was inserted above, so the lookups below cannot fail; `take` keeps
    // that a typed error rather than a panic should the plan and this list ever disagree.
    let missing = |name: &str| SafetensorsError::MissingTensor { dir: st.dir.clone(), tensor: name.to_string() };
    let mut mat = |n: &str| mats.remove(n).ok_or_else(|| missing(n));
    let token_embd = mat("token_embd.weight")?;
    let output = if c.tied_embeddings { token_embd.clone() } else { mat("output.weight")? };
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        let mut vec = |s: &str| vecs.remove(n(s).as_str());
        let (attn_norm, ffn_norm) = (vec("attn_norm.weight"), vec("ffn_norm.weight"));
        let (bq, bk, bv) = (vec("attn_q.bias"), vec("attn_k.bias"), vec("attn_v.bias"));
        let (q_norm, k_norm) = (vec("attn_q_norm.weight"), vec("attn_k_norm.weight"));
        let moe = match &c.moe {
            Some(m) if m.is_sparse(i) => {
                let mut experts = Vec::with_capacity(m.n_experts);
                for e in 0..m.n_experts {
                    // (GGUF name, HF projection) of the expert's three matrices.
                    let mut take = |gguf: &str, proj: &str| {
                        let t = expert_mats.remove(&(n(gguf), e));
                        t.ok_or_else(|| missing(&format!("model.layers.{i}.mlp.experts.{e}.{proj}.weight")))
                    };
                    experts.push(Expert {
                        gate: take("ffn_gate_exps.weight", "gate_proj")?,
                        up: take("ffn_up_exps.weight", "up_proj")?,
                        down: take("ffn_down_exps.weight", "down_proj")?,
                    });
                }
                // The shared expert the plan lists for the families with one (Qwen2-MoE).
                let shared = match m.shared_ffn_dim {
                    None => None,
                    Some(_) => {
                        let expert = Expert {
                            gate: mat(&n("ffn_gate_shexp.weight"))?,
                            up: mat(&n("ffn_up_shexp.weight"))?,
                            down: mat(&n("ffn_down_shexp.weight"))?,
                        };
                        let gate = mat(&n("ffn_gate_inp_shexp.weight"))?;
                        let name = format!("model.layers.{i}.mlp.shared_expert_gate.weight");
                        let bad =
                            |reason: String| HfError::Config { path: st.path_of(&name), key: name.clone(), reason };
                        Some(SharedExpert::new(expert, gate, c.dim).map_err(bad)?)
                    }
                };
                Some(MoeWeights {
                    router: mat(&n("ffn_gate_inp.weight"))?,
                    experts,
                    n_used: m.n_used,
                    norm_topk_prob: m.norm_topk_prob,
                    shared,
                })
            }
            _ => None,
        };
        let (w_gate, w_up, w_down) = match moe {
            Some(_) => LayerWeights::empty_dense_ffn(i, c),
            None => (mat(&n("ffn_gate.weight"))?, mat(&n("ffn_up.weight"))?, mat(&n("ffn_down.weight"))?),
        };
        layers.push(LayerWeights {
            attn_norm: attn_norm.ok_or_else(|| missing(&n("attn_norm.weight")))?,
            wq: mat(&n("attn_q.weight"))?,
            wk: mat(&n("attn_k.weight"))?,
            wv: mat(&n("attn_v.weight"))?,
            wo: mat(&n("attn_output.weight"))?,
            bq,
            bk,
            bv,
            q_norm,
            k_norm,
            ffn_norm: ffn_norm.ok_or_else(|| missing(&n("ffn_norm.weight")))?,
            w_gate,
            w_up,
            w_down,
            moe,
            hybrid: None,
        });
    }
    let output_norm = vecs.remove("output_norm.weight").ok_or_else(|| missing("model.norm.weight"))?;
    Ok(ModelWeights { token_embd, layers, output_norm, output, rope_freq_factors: None })
}

/// Configuration and weights of an HF directory. The config's `vocab_size` must match the
/// embedding table.
pub fn load_dir(dir: &Path) -> Result<(ModelConfig, HfExtras, ModelWeights, SafetensorsDir), HfError> {
    let (cfg, extras) = read_config(dir)?;
    let st = SafetensorsDir::open(dir)?;
    let w = load_weights(&st, &cfg, &extras)?;
    Ok((cfg, extras, w, st))
}

/// The tensor-name prefix of the text model: `model.` for the text-only classes,
/// `model.language_model.` for the vision-language checkpoints of the official releases.
fn text_prefix(st: &SafetensorsDir) -> &'static str {
    if st.contains("model.language_model.embed_tokens.weight") {
        "model.language_model."
    } else {
        "model."
    }
}

/// Binds the weights of a Qwen3.5, Qwen3.5-MoE or Qwen3-Next HF checkpoint (text-only or
/// vision-language layout; experts one tensor each or fused). Vision
/// towers (`model.visual.*`) and multi-token-prediction layers (`mtp.*`) are not loaded; the
/// log says how many tensors were skipped.
fn load_hybrid(st: &SafetensorsDir, c: &ModelConfig, h: &HybridConfig) -> Result<ModelWeights, HfError> {
    let r = StReader { st };
    let p = text_prefix(st);
    let (dim, qd, kvd) = (c.dim, c.q_dim(), c.kv_dim());
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let n = |s: &str| format!("{p}layers.{i}.{s}");
        let mixer = if h.recurrent[i] {
            let (ch, vd, nv, k) = (h.conv_channels(), h.value_dim(), h.n_v_heads, h.conv_kernel);
            let a_log = r.values(&n("linear_attn.A_log"), &[nv])?;
            let (qkvz, ba) = (n("linear_attn.in_proj_qkvz.weight"), n("linear_attn.in_proj_ba.weight"));
            let (w_qkv, w_z, w_b, w_a) = if st.contains(&qkvz) {
                // Qwen3-Next: fused and grouped per key head.
                let (fq, fb) = (r.matrix(&qkvz, ch + vd, dim)?, r.matrix(&ba, 2 * nv, dim)?);
                let ((qkv_rows, z_rows), (b_rows, a_rows)) = (fused_qkvz_rows(h), fused_ba_rows(h));
                (
                    r.regroup(&fq, &qkvz, "q|k|v", &qkv_rows)?,
                    r.regroup(&fq, &qkvz, "z", &z_rows)?,
                    r.regroup(&fb, &ba, "b", &b_rows)?,
                    r.regroup(&fb, &ba, "a", &a_rows)?,
                )
            } else {
                (
                    r.matrix(&n("linear_attn.in_proj_qkv.weight"), ch, dim)?,
                    r.matrix(&n("linear_attn.in_proj_z.weight"), vd, dim)?,
                    r.matrix(&n("linear_attn.in_proj_b.weight"), nv, dim)?,
                    r.matrix(&n("linear_attn.in_proj_a.weight"), nv, dim)?,
                )
            };
            let d = DeltaNetWeights {
                w_qkv,
                w_z,
                w_b,
                w_a,
                conv: r.values(&n("linear_attn.conv1d.weight"), &[ch, 1, k])?,
                neg_a: a_log.iter().map(|v| -v.exp()).collect(),
                dt_bias: r.values(&n("linear_attn.dt_bias"), &[nv])?,
                norm: r.values(&n("linear_attn.norm.weight"), &[h.d_v])?,
                w_out: r.matrix(&n("linear_attn.out_proj.weight"), dim, vd)?,
            };
            let absent = |s: &str, cols| Tensor::absent(n(s), cols);
            let (a, b, cc, dd) = (
                absent("self_attn.q_proj", dim),
                absent("self_attn.k_proj", dim),
                absent("self_attn.v_proj", dim),
                absent("self_attn.o_proj", qd),
            );
            (HybridLayer::Linear(Box::new(d)), a, b, cc, dd, None, None)
        } else {
            let q_rows = if h.attn_output_gate { 2 * qd } else { qd };
            (
                HybridLayer::Attention,
                r.matrix(&n("self_attn.q_proj.weight"), q_rows, dim)?,
                r.matrix(&n("self_attn.k_proj.weight"), kvd, dim)?,
                r.matrix(&n("self_attn.v_proj.weight"), kvd, dim)?,
                r.matrix(&n("self_attn.o_proj.weight"), dim, qd)?,
                Some(r.centred_norm(&n("self_attn.q_norm.weight"), c.head_dim)?),
                Some(r.centred_norm(&n("self_attn.k_norm.weight"), c.head_dim)?),
            )
        };
        let ffn = ffn_parts(
            c,
            i,
            |mc| MoeWeights::from_hf(&r, &n("mlp."), dim, mc),
            || {
                Ok((
                    r.matrix(&n("mlp.gate_proj.weight"), c.ffn_dim, dim)?,
                    r.matrix(&n("mlp.up_proj.weight"), c.ffn_dim, dim)?,
                    r.matrix(&n("mlp.down_proj.weight"), dim, c.ffn_dim)?,
                ))
            },
        )?;
        let norms = (
            r.centred_norm(&n("input_layernorm.weight"), dim)?,
            r.centred_norm(&n("post_attention_layernorm.weight"), dim)?,
        );
        layers.push(hybrid_layer(norms.0, norms.1, mixer, ffn));
    }
    let token_embd = r.matrix(&format!("{p}embed_tokens.weight"), c.vocab_size, dim)?;
    let output = if c.tied_embeddings { token_embd.clone() } else { r.matrix("lm_head.weight", c.vocab_size, dim)? };
    let skipped: Vec<&str> = st
        .names()
        .into_iter()
        .filter(|t| t.starts_with("model.visual.") || t.starts_with("mtp.") || t.starts_with(&format!("{p}mtp.")))
        .collect();
    if !skipped.is_empty() {
        let vis = skipped.iter().filter(|t| t.starts_with("model.visual.")).count();
        eprintln!(
            "model: {}: skipped {} vision-tower tensors (model.visual.*) and {} multi-token-prediction tensors (mtp.*); \
             the text model is loaded",
            st.dir.display(),
            vis,
            skipped.len() - vis
        );
    }
    Ok(ModelWeights {
        token_embd,
        layers,
        output_norm: r.centred_norm(&format!("{p}norm.weight"), dim)?,
        output,
        rope_freq_factors: None,
    })
}

/// A hybrid layer's token mixer as its loaders read it: the mixer, wq, wk, wv, wo (absent in
/// a linear layer) and the q/k head norms (attention layers only).
type Mixer = (HybridLayer, Tensor, Tensor, Tensor, Tensor, Option<Vec<f32>>, Option<Vec<f32>>);
/// Its FFN: dense gate/up/down (empty in a sparse layer) and the experts of a sparse one.
type Ffn = (Tensor, Tensor, Tensor, Option<MoeWeights>);

/// Layer `i`'s FFN: the experts (`sparse`) where the MoE config makes it sparse, else the dense
/// matrices (`dense`).
fn ffn_parts<E>(
    c: &ModelConfig,
    i: usize,
    sparse: impl FnOnce(&MoeConfig) -> Result<MoeWeights, E>,
    dense: impl FnOnce() -> Result<(Tensor, Tensor, Tensor), E>,
) -> Result<Ffn, E> {
    Ok(match &c.moe {
        Some(mc) if mc.is_sparse(i) => {
            let (a, b, d) = LayerWeights::empty_dense_ffn(i, c);
            (a, b, d, Some(sparse(mc)?))
        }
        _ => {
            let (a, b, d) = dense()?;
            (a, b, d, None)
        }
    })
}

/// One hybrid layer from its loaded parts; no q/k/v biases (no hybrid family has them).
fn hybrid_layer(
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    (mix, wq, wk, wv, wo, q_norm, k_norm): Mixer,
    (w_gate, w_up, w_down, moe): Ffn,
) -> LayerWeights {
    LayerWeights {
        attn_norm,
        wq,
        wk,
        wv,
        wo,
        bq: None,
        bk: None,
        bv: None,
        q_norm,
        k_norm,
        ffn_norm,
        w_gate,
        w_up,
        w_down,
        moe,
        hybrid: Some(mix),
    }
}

/// Reads tensors of an HF checkpoint, shape-checked.
struct StReader<'a> {
    st: &'a SafetensorsDir,
}

impl StReader<'_> {
    fn shape_err(&self, name: &str, expected: Vec<usize>, found: &[usize]) -> HfError {
        HfError::Shape { path: self.st.path_of(name), tensor: name.to_string(), expected, found: found.to_vec() }
    }

    /// The stored shape of `name`.
    fn shape(&self, name: &str) -> Result<Vec<usize>, HfError> {
        Ok(self.st.read(name)?.1.to_vec())
    }

    /// A 3-D tensor `[d0, d1, d2]` (fused experts) as the matrix `[d0 d1, d2]`, in the map.
    fn stacked(&self, name: &str, dims: [usize; 3]) -> Result<Tensor, HfError> {
        let (ty, shape, bytes) = self.st.read(name)?;
        if shape != dims {
            return Err(self.shape_err(name, dims.to_vec(), shape));
        }
        let (file, info) = self.st.get(name)?;
        Tensor::from_mapped(name, ty, dims[0] * dims[1], dims[2], file.mmap().clone(), info.start, bytes.len())
            .ok_or_else(|| self.shape_err(name, dims.to_vec(), shape))
    }

    /// Regroups the rows of `t` (read from `name`) into a new tensor (see `Tensor::gather_rows`).
    fn regroup(&self, t: &Tensor, name: &str, what: &str, rows: &[usize]) -> Result<Tensor, HfError> {
        t.gather_rows(format!("{name} ({what} rows)"), rows).ok_or_else(|| {
            self.shape_err(name, vec![rows.iter().max().map_or(0, |m| m + 1), t.cols], &[t.rows, t.cols])
        })
    }

    /// A matrix, left in the memory map in its stored type.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Tensor, HfError> {
        let (ty, shape, bytes) = self.st.read(name)?;
        if shape != [rows, cols] {
            return Err(self.shape_err(name, vec![rows, cols], shape));
        }
        let (file, info) = self.st.get(name)?;
        Tensor::from_mapped(name, ty, rows, cols, file.mmap().clone(), info.start, bytes.len())
            .ok_or_else(|| self.shape_err(name, vec![rows, cols], shape))
    }

    /// Any tensor of `expected` shape, widened to f32 (norms, conv weights, per-head scalars).
    fn values(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, HfError> {
        let (ty, shape, bytes) = self.st.read(name)?;
        if shape != expected {
            return Err(self.shape_err(name, expected.to_vec(), shape));
        }
        let mut out = vec![0f32; expected.iter().product()];
        dequantize_row(ty, bytes, &mut out);
        Ok(out)
    }

    /// A zero-centred RMSNorm weight, returned as `1 + w` (the form the GGUF stores and the
    /// forward pass uses).
    fn centred_norm(&self, name: &str, n: usize) -> Result<Vec<f32>, HfError> {
        Ok(self.values(name, &[n])?.into_iter().map(|w| 1.0 + w).collect())
    }
}

impl MoeWeights {
    /// Binds a sparse layer of an HF checkpoint, `p` being the layer's `...layers.N.mlp.`:
    /// router `gate.weight`; experts one tensor each (`experts.E.{gate,up,down}_proj.weight`,
    /// Qwen3-Next) or fused (`experts.gate_up_proj` `[E, 2I, H]`, rows `0..I` gate and `I..2I`
    /// up, and `experts.down_proj` `[E, H, I]`: Qwen3.5-MoE), bound in place in the memory map
    /// either way; the shared expert (`shared_expert.*`, `shared_expert_gate.weight`) when the
    /// checkpoint has one.
    fn from_hf(r: &StReader, p: &str, dim: usize, m: &MoeConfig) -> Result<Self, HfError> {
        let (ne, f) = (m.n_experts, m.expert_ffn_dim);
        let router = r.matrix(&format!("{p}gate.weight"), ne, dim)?;
        let fused = format!("{p}experts.gate_up_proj");
        let experts = if r.st.contains(&fused) {
            let gate_up = r.stacked(&fused, [ne, 2 * f, dim])?;
            let down_name = format!("{p}experts.down_proj");
            let down = r.stacked(&down_name, [ne, dim, f])?;
            let slice = |t: &Tensor, name: &str, start: usize, rows: usize| {
                // In range: the stacked shapes were checked above.
                t.row_slice(name, start, rows).ok_or_else(|| HfError::Shape {
                    path: r.st.path_of(name),
                    tensor: name.to_string(),
                    expected: vec![start + rows, t.cols],
                    found: vec![t.rows, t.cols],
                })
            };
            (0..ne)
                .map(|e| {
                    Ok(Expert {
                        gate: slice(&gate_up, &format!("{fused}[{e}].gate"), 2 * f * e, f)?,
                        up: slice(&gate_up, &format!("{fused}[{e}].up"), 2 * f * e + f, f)?,
                        down: slice(&down, &format!("{down_name}[{e}]"), dim * e, dim)?,
                    })
                })
                .collect::<Result<Vec<_>, HfError>>()?
        } else {
            (0..ne)
                .map(|e| {
                    let x = |proj: &str| format!("{p}experts.{e}.{proj}.weight");
                    Ok(Expert {
                        gate: r.matrix(&x("gate_proj"), f, dim)?,
                        up: r.matrix(&x("up_proj"), f, dim)?,
                        down: r.matrix(&x("down_proj"), dim, f)?,
                    })
                })
                .collect::<Result<Vec<_>, HfError>>()?
        };
        let gate_name = format!("{p}shared_expert_gate.weight");
        let shared = if r.st.contains(&gate_name) {
            let x = |proj: &str| format!("{p}shared_expert.{proj}.weight");
            let sf = r.shape(&x("gate_proj"))?.first().copied().unwrap_or(0);
            let expert = Expert {
                gate: r.matrix(&x("gate_proj"), sf, dim)?,
                up: r.matrix(&x("up_proj"), sf, dim)?,
                down: r.matrix(&x("down_proj"), dim, sf)?,
            };
            let gate = r.matrix(&gate_name, 1, dim)?;
            let bad =
                |reason: String| HfError::Config { path: r.st.path_of(&gate_name), key: gate_name.clone(), reason };
            Some(SharedExpert::new(expert, gate, dim).map_err(bad)?)
        } else {
            None
        };
        Ok(MoeWeights { router, experts, n_used: m.n_used, norm_topk_prob: m.norm_topk_prob, shared })
    }
}
