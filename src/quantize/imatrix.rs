//! The importance matrix: for every weight matrix, the mean squared activation of each input
//! column over the calibration tokens (`E[x_c^2]`), which weights the least-squares fit of that
//! matrix's quantization (the output error of a row is `sum_c E[x_c^2] (w_c - ŵ_c)^2` when the
//! activations are uncorrelated).
//!
//! On disk it is a GGUF file (format of its own, versioned):
//! - `general.type = "imatrix"`, `dustoff.imatrix.format_version = 1` (u32; other versions are
//!   refused), `dustoff.imatrix.tokens` (u64, calibration tokens), `dustoff.imatrix.chunks` (u32),
//!   `dustoff.imatrix.dataset` (string, the calibration file);
//! - per matrix `M` (its GGUF tensor name): `M.in_sum2` F32 `[cols]`, the sum of squared inputs,
//!   and `M.counts` F32 `[1]`, the number of input rows summed.
//!
//! The tensor naming matches llama.cpp's GGUF imatrix files, so files of that tool whose
//! matrices have one expert (`in_sum2` of shape `[cols]` or `[cols, 1]`) load too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::backend::cpu::tap::ActivationTap;
use crate::model::gguf::{GgufFile, Value};
use crate::model::gguf_writer::{write_gguf, GgufWriteError, TensorOut};
use crate::model::quant::{dequantize_row, GgmlType};

pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ImatrixError {
    #[error(transparent)]
    Write(#[from] GgufWriteError),
    #[error(transparent)]
    Gguf(#[from] crate::model::gguf::GgufError),
    #[error("{path}: not an importance matrix: {reason}")]
    Format { path: PathBuf, reason: String },
}

/// Sums for one matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// `[cols]`: sum over input rows of `x_c^2`.
    pub sum_sq: Vec<f64>,
    /// Input rows summed.
    pub count: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Imatrix {
    pub entries: BTreeMap<String, Entry>,
    pub tokens: u64,
    pub chunks: u32,
    pub dataset: String,
}

impl Imatrix {
    /// Adds `n_tok` input rows (`x`: `[n_tok, cols]`) of the matrix `name`.
    pub fn add(&mut self, name: &str, x: &[f32], n_tok: usize) {
        if n_tok == 0 || x.is_empty() {
            return;
        }
        let cols = x.len() / n_tok;
        let e = self.entries.entry(name.to_string()).or_insert_with(|| Entry { sum_sq: vec![0.0; cols], count: 0 });
        if e.sum_sq.len() != cols {
            // A name reused with another width is not one matrix; keep the first.
            return;
        }
        for row in x.chunks_exact(cols).take(n_tok) {
            for (s, &v) in e.sum_sq.iter_mut().zip(row) {
                *s += f64::from(v) * f64::from(v);
            }
        }
        e.count += n_tok as u64;
    }

    /// `[cols]`: the mean squared activation per input column of `name`, if it was observed.
    pub fn importance(&self, name: &str) -> Option<Vec<f32>> {
        let e = self.entries.get(name)?;
        (e.count > 0).then(|| e.sum_sq.iter().map(|&s| (s / e.count as f64) as f32).collect())
    }

    pub fn save(&self, path: &Path) -> Result<(), ImatrixError> {
        let kv = vec![
            ("general.type".to_string(), Value::String("imatrix".into())),
            ("dustoff.imatrix.format_version".to_string(), Value::U32(FORMAT_VERSION)),
            ("dustoff.imatrix.tokens".to_string(), Value::U64(self.tokens)),
            ("dustoff.imatrix.chunks".to_string(), Value::U32(self.chunks)),
            ("dustoff.imatrix.dataset".to_string(), Value::String(self.dataset.clone())),
        ];
        let mut tensors = Vec::new();
        let mut data: Vec<Vec<u8>> = Vec::new();
        for (name, e) in &self.entries {
            tensors.push(TensorOut {
                name: format!("{name}.in_sum2"),
                dtype: GgmlType::F32,
                shape: vec![e.sum_sq.len()],
            });
            data.push(e.sum_sq.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect());
            tensors.push(TensorOut { name: format!("{name}.counts"), dtype: GgmlType::F32, shape: vec![1] });
            data.push((e.count as f32).to_le_bytes().to_vec());
        }
        write_gguf::<ImatrixError>(path, &kv, &tensors, |i| Ok(std::mem::take(&mut data[i])))
    }

    pub fn load(path: &Path) -> Result<Self, ImatrixError> {
        let g = GgufFile::open(path)?;
        let bad = |reason: String| ImatrixError::Format { path: path.to_path_buf(), reason };
        if g.get_str("general.type")? != Some("imatrix") {
            return Err(bad("general.type is not \"imatrix\"".into()));
        }
        if let Some(v) = g.get_u64("dustoff.imatrix.format_version")? {
            if v != u64::from(FORMAT_VERSION) {
                return Err(bad(format!("format_version {v} (this dustoff reads {FORMAT_VERSION})")));
            }
        }
        let mut m = Imatrix {
            tokens: g.get_u64("dustoff.imatrix.tokens")?.unwrap_or(0),
            chunks: g.get_u64("dustoff.imatrix.chunks")?.unwrap_or(0) as u32,
            dataset: g.get_str("dustoff.imatrix.dataset")?.unwrap_or_default().to_string(),
            ..Default::default()
        };
        let f32s = |name: &str| -> Result<Vec<f32>, ImatrixError> {
            let info = g.require_tensor(name)?;
            if info.dtype != GgmlType::F32 {
                return Err(bad(format!("tensor '{name}' is {}, expected F32", info.dtype)));
            }
            let mut v = vec![0f32; info.n_elements() as usize];
            dequantize_row(GgmlType::F32, g.tensor_data(info), &mut v);
            Ok(v)
        };
        for t in &g.tensors {
            let Some(name) = t.name.strip_suffix(".in_sum2") else { continue };
            if t.n_rows() != 1 {
                return Err(bad(format!(
                    "'{}' has {} experts; only single matrices are supported",
                    t.name,
                    t.n_rows()
                )));
            }
            let sums = f32s(&t.name)?;
            let counts = f32s(&format!("{name}.counts"))?;
            let count = counts
                .first()
                .copied()
                .filter(|c| c.is_finite() && *c >= 0.0)
                .ok_or_else(|| bad(format!("'{name}.counts' must hold one non-negative count")))?;
            if sums.iter().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(bad(format!("'{}' holds a negative or non-finite sum", t.name)));
            }
            m.entries.insert(
                name.to_string(),
                Entry { sum_sq: sums.iter().map(|&v| f64::from(v)).collect(), count: count as u64 },
            );
        }
        if m.entries.is_empty() {
            return Err(bad("no '<matrix>.in_sum2' tensors".into()));
        }
        Ok(m)
    }
}

impl ActivationTap for Imatrix {
    fn matmul_input(&mut self, names: &[&str], x: &[f32], n_tok: usize) {
        for n in names {
            self.add(n, x, n_tok);
        }
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_round_trip_and_means() {
        let mut m = Imatrix { tokens: 3, chunks: 1, dataset: "t.txt".into(), ..Default::default() };
        // Two rows then one row of a 3-column matrix: means of squares per column.
        m.add("blk.0.attn_q.weight", &[1.0, -2.0, 0.5, 3.0, 0.0, 0.5], 2);
        m.add("blk.0.attn_q.weight", &[2.0, 2.0, 2.0], 1);
        m.add("output.weight", &[4.0, 4.0], 1);
        let imp = m.importance("blk.0.attn_q.weight").unwrap();
        assert_eq!(imp, vec![(1.0 + 9.0 + 4.0) / 3.0, (4.0 + 0.0 + 4.0) / 3.0, (0.25 + 0.25 + 4.0) / 3.0]);
        let dir = std::env::temp_dir().join(format!("dustoff-imatrix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("i.gguf");
        m.save(&p).unwrap();
        let back = Imatrix::load(&p).unwrap();
        assert_eq!(back, m);
        // A model file is not an importance matrix.
        let e = Imatrix::load(Path::new(crate::model::loader::SAMPLE_MODEL)).unwrap_err();
        assert!(e.to_string().contains("not an importance matrix"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
