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
//! - the experts of a stacked GGUF tensor `M` (`ffn_*_exps`), whose matrices the forward pass
//!   names `M[e]`, are stored together as llama.cpp stores them: `M.in_sum2` `[n_experts, cols]`
//!   and `M.counts` `[n_experts, 1]` (an expert no calibration token was routed to has count 0
//!   and no entry once loaded).
//!
//! The tensor naming matches llama.cpp's GGUF imatrix files, so that tool's files load too
//! (and ours in it).

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
        // Experts `M[e]` grouped under `M` (missing experts: zero sums, count 0).
        let mut groups: BTreeMap<String, Vec<(usize, &Entry)>> = BTreeMap::new();
        for (name, e) in &self.entries {
            match expert_of(name) {
                Some((base, i)) => groups.entry(base.to_string()).or_default().push((i, e)),
                None => groups.entry(name.clone()).or_default().push((usize::MAX, e)),
            }
        }
        for (name, members) in &groups {
            let cols = members[0].1.sum_sq.len();
            let (sums, counts): (Vec<f32>, Vec<f32>) = if members[0].0 == usize::MAX {
                (members[0].1.sum_sq.iter().map(|&v| v as f32).collect(), vec![members[0].1.count as f32])
            } else {
                let n = members.iter().map(|m| m.0 + 1).max().unwrap_or(0);
                let (mut sums, mut counts) = (vec![0f32; n * cols], vec![0f32; n]);
                for (i, e) in members.iter().filter(|m| m.1.sum_sq.len() == cols) {
                    sums[i * cols..(i + 1) * cols].iter_mut().zip(&e.sum_sq).for_each(|(d, &v)| *d = v as f32);
                    counts[*i] = e.count as f32;
                }
                (sums, counts)
            };
            let n = counts.len();
            let shape = if members[0].0 == usize::MAX { vec![cols] } else { vec![n, cols] };
            tensors.push(TensorOut { name: format!("{name}.in_sum2"), dtype: GgmlType::F32, shape });
            data.push(sums.iter().flat_map(|v| v.to_le_bytes()).collect());
            let shape = if members[0].0 == usize::MAX { vec![1] } else { vec![n, 1] };
            tensors.push(TensorOut { name: format!("{name}.counts"), dtype: GgmlType::F32, shape });
            data.push(counts.iter().flat_map(|v| v.to_le_bytes()).collect());
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
            let (n_mat, cols) = (t.n_rows(), t.row_len());
            let sums = f32s(&t.name)?;
            let counts = f32s(&format!("{name}.counts"))?;
            if counts.len() != n_mat || counts.iter().any(|c| !c.is_finite() || *c < 0.0) {
                return Err(bad(format!("'{name}.counts' must hold {n_mat} non-negative count(s)")));
            }
            if sums.iter().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(bad(format!("'{}' holds a negative or non-finite sum", t.name)));
            }
            for (i, (row, &count)) in sums.chunks_exact(cols.max(1)).zip(&counts).enumerate() {
                let entry = Entry { sum_sq: row.iter().map(|&v| f64::from(v)).collect(), count: count as u64 };
                if n_mat == 1 {
                    m.entries.insert(name.to_string(), entry);
                } else if count > 0.0 {
                    m.entries.insert(format!("{name}[{i}]"), entry);
                }
            }
        }
        if m.entries.is_empty() {
            return Err(bad("no '<matrix>.in_sum2' tensors".into()));
        }
        Ok(m)
    }
}

/// The stacked tensor and the index of an expert's matrix name `M[e]`.
pub fn expert_of(name: &str) -> Option<(&str, usize)> {
    let (base, rest) = name.strip_suffix(']')?.rsplit_once('[')?;
    Some((base, rest.parse().ok()?))
}

impl ActivationTap for Imatrix {
    fn matmul_input(&mut self, names: &[&str], x: &[f32], n_tok: usize) {
        // A file tensor bound as several row groups (`blk.N.ssm_ba.weight (b rows)` and
        // `(a rows)`: one input) is one matrix of the file: recorded once, under its name.
        let mut seen: Vec<&str> = Vec::with_capacity(names.len());
        for n in names {
            let base = n.split_once(" (").map_or(*n, |(b, _)| b);
            if !seen.contains(&base) {
                seen.push(base);
                self.add(base, x, n_tok);
            }
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

    /// Experts `M[e]` are saved as llama.cpp stores them (`M.in_sum2` `[n, cols]`, `M.counts`
    /// `[n, 1]`); an expert without tokens (1 here) is stored with count 0 and not loaded; the
    /// file tap records a matrix bound as row groups once, under the file's name.
    #[test]
    fn experts_round_trip_as_one_stacked_entry() {
        let mut m = Imatrix { tokens: 2, chunks: 1, dataset: "t".into(), ..Default::default() };
        m.add("blk.0.ffn_up_exps.weight[0]", &[1.0, 2.0], 1);
        m.add("blk.0.ffn_up_exps.weight[2]", &[3.0, 4.0, 5.0, 6.0], 2);
        m.matmul_input(&["blk.0.ssm_ba.weight (b rows)", "blk.0.ssm_ba.weight (a rows)"], &[2.0, 2.0], 1);
        assert_eq!(m.entries["blk.0.ssm_ba.weight"].count, 1);
        let dir = std::env::temp_dir().join(format!("dustoff-imatrix-exp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("i.gguf");
        m.save(&p).unwrap();
        let g = GgufFile::open(&p).unwrap();
        let t = g.tensor_info("blk.0.ffn_up_exps.weight.in_sum2").unwrap();
        assert_eq!(t.dims, vec![2, 3]);
        assert_eq!(g.tensor_info("blk.0.ffn_up_exps.weight.counts").unwrap().dims, vec![1, 3]);
        let back = Imatrix::load(&p).unwrap();
        assert_eq!(back, m);
        assert_eq!(expert_of("blk.0.ffn_up_exps.weight[12]"), Some(("blk.0.ffn_up_exps.weight", 12)));
        assert_eq!(expert_of("blk.0.ffn_up.weight"), None);
        std::fs::remove_dir_all(&dir).ok();
    }
}
