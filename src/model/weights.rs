//! Weight tensors and the per-layer weight set of a decoder model.
//!
//! A `Tensor` is a 2-D matrix (or 1-D vector) of packed GGML blocks whose bytes live either in a
//! memory-mapped model file or in an owned buffer (converted or synthetic weights).

use std::sync::Arc;

use memmap2::Mmap;

use super::config::ModelConfig;
use super::gguf::{GgufError, GgufFile};
use super::hybrid::HybridLayer;
use super::layer::{AttentionWeights, DenseFfn, Ffn, Layer, Mixer};
use super::moe::MoeWeights;
use super::quant::GgmlType;

#[derive(Clone)]
enum Storage {
    Mapped { map: Arc<Mmap>, offset: usize, len: usize },
    Owned(Arc<Vec<u8>>),
}

/// A weight matrix `[rows, cols]` (row-major; GGUF dims are `[cols, rows]`), rows packed in
/// `dtype` blocks. A vector has `rows == 1`.
#[derive(Clone)]
pub struct Tensor {
    pub name: String,
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    storage: Storage,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} {} [{}, {}])", self.name, self.dtype, self.rows, self.cols)
    }
}

impl Tensor {
    /// Wraps owned bytes. Panics only on a programming error (wrong byte count).
    pub fn from_bytes(name: impl Into<String>, dtype: GgmlType, rows: usize, cols: usize, bytes: Vec<u8>) -> Self {
        let name = name.into();
        let want = dtype.row_bytes(cols).map(|r| r * rows);
        assert_eq!(want, Some(bytes.len()), "tensor {name}: byte count does not match [{rows}, {cols}] {dtype}");
        Tensor { name, dtype, rows, cols, storage: Storage::Owned(Arc::new(bytes)) }
    }

    /// A tensor whose bytes lie in a memory map at `offset..offset + len` (no copy). `None` when
    /// the range is outside the map or does not hold `rows x cols` elements of `dtype`.
    pub fn from_mapped(
        name: impl Into<String>,
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    ) -> Option<Self> {
        let fits = offset.checked_add(len).is_some_and(|end| end <= map.len());
        let want = dtype.row_bytes(cols).and_then(|r| r.checked_mul(rows));
        (fits && want == Some(len)).then(|| Tensor {
            name: name.into(),
            dtype,
            rows,
            cols,
            storage: Storage::Mapped { map, offset, len },
        })
    }

    /// A matrix with no rows, `[0, cols]`: the dense FFN slots of a sparse (MoE) layer.
    pub fn empty(name: impl Into<String>, cols: usize) -> Self {
        Self::from_bytes(name, GgmlType::F32, 0, cols, Vec::new())
    }

    /// A `[0, cols]` matrix: a projection the layer does not have (the attention projections of
    /// a hybrid model's linear-attention layers). It holds no bytes and is never multiplied.
    pub fn absent(name: impl Into<String>, cols: usize) -> Self {
        Tensor { name: name.into(), dtype: GgmlType::F32, rows: 0, cols, storage: Storage::Owned(Arc::new(Vec::new())) }
    }

    /// An F32 tensor from values.
    pub fn from_f32(name: impl Into<String>, rows: usize, cols: usize, values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(name, GgmlType::F32, rows, cols, bytes)
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped { map, offset, len } => &map[*offset..*offset + *len],
            Storage::Owned(v) => v,
        }
    }

    pub fn row_bytes(&self) -> usize {
        self.bytes().len() / self.rows.max(1)
    }

    /// The packed bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.bytes()[r * rb..(r + 1) * rb]
    }

    /// All values widened to f32 (for small tensors: norms, biases).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for r in 0..self.rows {
            super::quant::dequantize_row(self.dtype, self.row(r), &mut out[r * self.cols..(r + 1) * self.cols]);
        }
        out
    }

    /// Rows `start..start + count` as a tensor of their own: a view into the same memory map
    /// (no copy) for a mapped tensor, a copy for an owned one. `None` when the rows are not all
    /// there. Splits fused checkpoint tensors (`gate_up_proj` `[E, 2I, H]` read as `[E 2I, H]`).
    pub fn row_slice(&self, name: impl Into<String>, start: usize, count: usize) -> Option<Self> {
        if start.checked_add(count)? > self.rows {
            return None;
        }
        let rb = self.row_bytes();
        let storage = match &self.storage {
            Storage::Mapped { map, offset, .. } => {
                Storage::Mapped { map: map.clone(), offset: offset + start * rb, len: count * rb }
            }
            Storage::Owned(v) => Storage::Owned(Arc::new(v[start * rb..(start + count) * rb].to_vec())),
        };
        Some(Tensor { name: name.into(), dtype: self.dtype, rows: count, cols: self.cols, storage })
    }

    /// The rows `order` (each `< rows`, any order, repeats allowed) copied into a new tensor:
    /// regroups projections whose checkpoint interleaves their parts (Qwen3-Next's
    /// `in_proj_qkvz`, grouped per key head). `None` when an index is out of range.
    pub fn gather_rows(&self, name: impl Into<String>, order: &[usize]) -> Option<Self> {
        let mut bytes = Vec::with_capacity(order.len() * self.row_bytes());
        for &r in order {
            if r >= self.rows {
                return None;
            }
            bytes.extend_from_slice(self.row(r));
        }
        Some(Tensor {
            name: name.into(),
            dtype: self.dtype,
            rows: order.len(),
            cols: self.cols,
            storage: Storage::Owned(Arc::new(bytes)),
        })
    }

    /// Loads a tensor of a GGUF file, checking it has `rows x cols` elements.
    pub fn from_gguf(g: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Self, GgufError> {
        let info = g.require_tensor(name)?;
        if info.row_len() != cols || info.n_rows() != rows {
            return Err(GgufError::Invalid {
                path: g.path.clone(),
                what: format!("tensor '{name}'"),
                reason: format!("shape {:?} (GGUF order), expected [{cols}, {rows}]", info.dims),
            });
        }
        Ok(Tensor {
            name: name.to_string(),
            dtype: info.dtype,
            rows,
            cols,
            storage: Storage::Mapped { map: g.mmap().clone(), offset: info.offset, len: info.n_bytes },
        })
    }
}

/// One transformer block. Matrices are `[out, in]`.
///
/// A sparse (mixture-of-experts) layer has `moe` set; its dense `w_gate`, `w_up`, `w_down` are
/// then empty (`[0, dim]`, `[0, dim]`, `[0, ffn_dim]`) and must not be used.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,      // [dim]
    pub wq: Tensor,               // [q_dim, dim]
    pub wk: Tensor,               // [kv_dim, dim]
    pub wv: Tensor,               // [kv_dim, dim]
    pub wo: Tensor,               // [dim, q_dim]
    pub bq: Option<Vec<f32>>,     // [q_dim] (qwen2)
    pub bk: Option<Vec<f32>>,     // [kv_dim]
    pub bv: Option<Vec<f32>>,     // [kv_dim]
    pub q_norm: Option<Vec<f32>>, // [head_dim] (qwen3)
    pub k_norm: Option<Vec<f32>>, // [head_dim]
    pub ffn_norm: Vec<f32>,       // [dim]
    pub w_gate: Tensor,           // [ffn_dim, dim]
    pub w_up: Tensor,             // [ffn_dim, dim]
    pub w_down: Tensor,           // [dim, ffn_dim]
    pub moe: Option<MoeWeights>,  // sparse layers: router and experts
    /// Hybrid models: the layer's token mixer (Gated DeltaNet or gated attention).
    pub hybrid: Option<HybridLayer>,
}

impl LayerWeights {
    /// The layer typed by kind (see `model::layer`): its mixer and FFN with their weights.
    pub fn typed(&self) -> Layer<'_> {
        let attention = || AttentionWeights {
            wq: &self.wq,
            wk: &self.wk,
            wv: &self.wv,
            wo: &self.wo,
            bq: self.bq.as_deref(),
            bk: self.bk.as_deref(),
            bv: self.bv.as_deref(),
            q_norm: self.q_norm.as_deref(),
            k_norm: self.k_norm.as_deref(),
        };
        let mixer = match &self.hybrid {
            Some(HybridLayer::Linear(d)) => Mixer::DeltaNet(d),
            // The output gate doubles the query rows: `wq` [2 q_dim, dim], `wo` [dim, q_dim].
            Some(HybridLayer::Attention) if self.wq.rows == 2 * self.wo.cols => Mixer::GatedAttention(attention()),
            _ => Mixer::Attention(attention()),
        };
        let ffn = match &self.moe {
            Some(m) => Ffn::Moe(m),
            None => Ffn::Dense(DenseFfn { gate: &self.w_gate, up: &self.w_up, down: &self.w_down }),
        };
        Layer { attn_norm: &self.attn_norm, mixer, ffn_norm: &self.ffn_norm, ffn }
    }

    /// The dense FFN matrices, empty for a sparse layer (see above).
    pub fn empty_dense_ffn(layer: usize, c: &ModelConfig) -> (Tensor, Tensor, Tensor) {
        let n = |s: &str| format!("blk.{layer}.{s} (sparse layer: none)");
        (
            Tensor::empty(n("ffn_gate"), c.dim),
            Tensor::empty(n("ffn_up"), c.dim),
            Tensor::empty(n("ffn_down"), c.ffn_dim),
        )
    }
}

#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub token_embd: Tensor, // [vocab, dim]
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>, // [dim]
    /// The output head `[vocab, dim]`; the embedding table itself when tied.
    pub output: Tensor,
    /// Per-pair RoPE frequency divisors (`rope_freqs.weight`, Llama 3 scaling): `[head_dim / 2]`.
    pub rope_freq_factors: Option<Vec<f32>>,
}

impl ModelWeights {
    /// Binds the tensors of a GGUF file, named as the GGUF conventions define (`blk.N.attn_q.weight`...).
    pub fn from_gguf(g: &GgufFile, c: &ModelConfig) -> Result<Self, GgufError> {
        let vec = |name: &str, n: usize| Tensor::from_gguf(g, name, 1, n).map(|t| t.to_f32_vec());
        let opt_vec = |name: &str, n: usize| -> Result<Option<Vec<f32>>, GgufError> {
            if g.tensor_info(name).is_some() {
                vec(name, n).map(Some)
            } else {
                Ok(None)
            }
        };
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            if let Some(h) = &c.hybrid {
                layers.push(super::hybrid::gguf_layer(g, c, h, i)?);
                continue;
            }
            let n = |s: &str| format!("blk.{i}.{s}");
            let m = |s: &str, rows, cols| Tensor::from_gguf(g, &n(s), rows, cols);
            let moe = match &c.moe {
                Some(mc) if mc.is_sparse(i) => Some(MoeWeights::from_gguf(g, i, c.dim, mc)?),
                _ => None,
            };
            let (w_gate, w_up, w_down) = match moe {
                Some(_) => LayerWeights::empty_dense_ffn(i, c),
                None => (
                    m("ffn_gate.weight", c.ffn_dim, c.dim)?,
                    m("ffn_up.weight", c.ffn_dim, c.dim)?,
                    m("ffn_down.weight", c.dim, c.ffn_dim)?,
                ),
            };
            layers.push(LayerWeights {
                attn_norm: vec(&n("attn_norm.weight"), c.dim)?,
                wq: m("attn_q.weight", c.q_dim(), c.dim)?,
                wk: m("attn_k.weight", c.kv_dim(), c.dim)?,
                wv: m("attn_v.weight", c.kv_dim(), c.dim)?,
                wo: m("attn_output.weight", c.dim, c.q_dim())?,
                bq: opt_vec(&n("attn_q.bias"), c.q_dim())?,
                bk: opt_vec(&n("attn_k.bias"), c.kv_dim())?,
                bv: opt_vec(&n("attn_v.bias"), c.kv_dim())?,
                q_norm: opt_vec(&n("attn_q_norm.weight"), c.head_dim)?,
                k_norm: opt_vec(&n("attn_k_norm.weight"), c.head_dim)?,
                ffn_norm: vec(&n("ffn_norm.weight"), c.dim)?,
                w_gate,
                w_up,
                w_down,
                moe,
                hybrid: None,
            });
        }
        let token_embd = Tensor::from_gguf(g, "token_embd.weight", c.vocab_size, c.dim)?;
        let output = if c.tied_embeddings {
            token_embd.clone()
        } else {
            Tensor::from_gguf(g, "output.weight", c.vocab_size, c.dim)?
        };
        Ok(ModelWeights {
            token_embd,
            layers,
            output_norm: vec("output_norm.weight", c.dim)?,
            output,
            rope_freq_factors: opt_vec("rope_freqs.weight", c.head_dim / 2)?,
        })
    }
}
