//! A weight tensor: a 2-D matrix (or 1-D vector) of packed GGML blocks whose bytes live either
//! in a memory-mapped model file or in an owned buffer (converted or synthetic weights).

use std::sync::Arc;

use memmap2::Mmap;

use super::gguf::{GgufError, GgufFile};
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
