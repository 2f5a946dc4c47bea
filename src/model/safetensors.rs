//! Safetensors reader and writer (Hugging Face checkpoints).
//!
//! A file is `u64 LE header length N`, `N` bytes of JSON
//! (`{"name": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [start, end]}, ...,
//! "__metadata__": {..}}`), then the data section; offsets are relative to its start.
//! Files are memory-mapped; every offset, size and shape is checked against the file before a
//! byte is read, so a truncated or hostile file gives a [`SafetensorsError`] naming the file and
//! the tensor. A checkpoint directory holds one `model.safetensors` or several shards listed by
//! `model.safetensors.index.json` (`{"weight_map": {"tensor name": "shard file name"}}`).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde_json::Value as Json;

use super::quant::GgmlType;

/// Headers beyond this are not a real checkpoint (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;
pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";

#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid safetensors header: {reason}")]
    Header { path: PathBuf, reason: String },
    #[error("{path}: tensor '{tensor}': {reason}")]
    Tensor { path: PathBuf, tensor: String, reason: String },
    #[error("{path}: tensor '{tensor}' has dtype {dtype}; dustoff reads BF16, F16 and F32")]
    UnsupportedDtype { path: PathBuf, tensor: String, dtype: String },
    #[error("{path}: invalid index: {reason}")]
    Index { path: PathBuf, reason: String },
    #[error("{dir}: tensor '{tensor}' is missing from the checkpoint")]
    MissingTensor { dir: PathBuf, tensor: String },
    #[error("{dir}: no model.safetensors or model.safetensors.index.json")]
    NoWeights { dir: PathBuf },
    #[error("{0}")]
    Interrupted(#[from] crate::sys::interrupt::Interrupted),
}

/// One tensor of a safetensors file.
#[derive(Clone, Debug)]
pub struct StTensorInfo {
    pub name: String,
    /// The dtype string as written ("BF16", "F16", "F32", "I64", ...).
    pub dtype: String,
    /// Row-major shape, outermost first (`[out, in]` for a linear layer).
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub end: usize,
}

impl StTensorInfo {
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Maps a safetensors dtype name to the GGML type of the same encoding.
pub fn ggml_type_of(dtype: &str) -> Option<GgmlType> {
    match dtype {
        "BF16" => Some(GgmlType::BF16),
        "F16" => Some(GgmlType::F16),
        "F32" => Some(GgmlType::F32),
        _ => None,
    }
}

/// Element size of every dtype the format defines (for bounds checks of tensors we never read).
fn dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

/// An open, memory-mapped safetensors file.
pub struct SafetensorsFile {
    pub path: PathBuf,
    pub tensors: BTreeMap<String, StTensorInfo>,
    pub metadata: BTreeMap<String, String>,
    mmap: Arc<Mmap>,
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self, SafetensorsError> {
        let io = |source| SafetensorsError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: mapped read-only; dustoff never writes a checkpoint while reading it. An
        // external truncation while mapped could fault, as with every mmap-based loader.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, Arc::new(mmap))
    }

    fn parse(path: &Path, mmap: Arc<Mmap>) -> Result<Self, SafetensorsError> {
        let header = |reason: String| SafetensorsError::Header { path: path.to_path_buf(), reason };
        let len = mmap.len();
        if len < 8 {
            return Err(header(format!("file is {len} bytes, too short for the header length")));
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&mmap[..8]);
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER || n > (len - 8) as u64 {
            return Err(header(format!("header length {n} exceeds the file ({len} bytes) or 100 MB")));
        }
        let data_start = 8 + n as usize;
        let json: Json = serde_json::from_slice(&mmap[8..data_start]).map_err(|e| header(format!("JSON: {e}")))?;
        let obj = json.as_object().ok_or_else(|| header("the header is not a JSON object".into()))?;
        let data_len = len - data_start;
        let mut tensors = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for (name, v) in obj {
            if name == "__metadata__" {
                if let Some(m) = v.as_object() {
                    for (k, val) in m {
                        metadata.insert(k.clone(), val.as_str().map(str::to_string).unwrap_or_else(|| val.to_string()));
                    }
                }
                continue;
            }
            let bad =
                |reason: String| SafetensorsError::Tensor { path: path.to_path_buf(), tensor: name.clone(), reason };
            let dtype = v.get("dtype").and_then(Json::as_str).ok_or_else(|| bad("no string \"dtype\"".into()))?;
            let shape = v
                .get("shape")
                .and_then(Json::as_array)
                .ok_or_else(|| bad("no \"shape\" list".into()))?
                .iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| bad("shape entries must be non-negative integers".into()))?;
            let offs = v
                .get("data_offsets")
                .and_then(Json::as_array)
                .filter(|a| a.len() == 2)
                .and_then(|a| Some((a[0].as_u64()? as usize, a[1].as_u64()? as usize)))
                .ok_or_else(|| bad("\"data_offsets\" must be [start, end]".into()))?;
            let size = dtype_size(dtype).ok_or_else(|| bad(format!("unknown dtype {dtype}")))?;
            let n_bytes = shape
                .iter()
                .try_fold(size, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
            if offs.0 > offs.1 || offs.1 > data_len {
                return Err(bad(format!(
                    "data bytes {}..{} lie outside the data section ({data_len} bytes)",
                    offs.0, offs.1
                )));
            }
            if offs.1 - offs.0 != n_bytes {
                return Err(bad(format!(
                    "{} data bytes for shape {shape:?} {dtype} ({n_bytes} expected)",
                    offs.1 - offs.0
                )));
            }
            let info = StTensorInfo {
                name: name.clone(),
                dtype: dtype.to_string(),
                shape,
                start: data_start + offs.0,
                end: data_start + offs.1,
            };
            tensors.insert(name.clone(), info);
        }
        Ok(SafetensorsFile { path: path.to_path_buf(), tensors, metadata, mmap })
    }

    /// The file's memory map (for zero-copy tensors: `info.start..info.end` are checked).
    pub fn mmap(&self) -> &Arc<Mmap> {
        &self.mmap
    }

    /// The bytes of a tensor (checked against the file at open).
    pub fn data(&self, info: &StTensorInfo) -> &[u8] {
        &self.mmap[info.start..info.end]
    }
}

/// A checkpoint directory: one file or the shards of an index.
pub struct SafetensorsDir {
    pub dir: PathBuf,
    pub files: Vec<SafetensorsFile>,
    /// Tensor name -> index into `files`.
    index: HashMap<String, usize>,
}

impl SafetensorsDir {
    pub fn open(dir: &Path) -> Result<Self, SafetensorsError> {
        let index_path = dir.join(INDEX_FILE);
        let shard_names: Vec<String> = if index_path.is_file() {
            let ierr = |reason: String| SafetensorsError::Index { path: index_path.clone(), reason };
            let text = std::fs::read_to_string(&index_path)
                .map_err(|source| SafetensorsError::Io { path: index_path.clone(), source })?;
            let json: Json = serde_json::from_str(&text).map_err(|e| ierr(format!("JSON: {e}")))?;
            let map = json
                .get("weight_map")
                .and_then(Json::as_object)
                .ok_or_else(|| ierr("no \"weight_map\" object".into()))?;
            let mut names: Vec<String> = Vec::new();
            for (t, f) in map {
                let f = f.as_str().ok_or_else(|| ierr(format!("weight_map[{t:?}] is not a file name")))?;
                // Shards must be plain file names inside the directory.
                if f.contains('/') || f.contains('\\') || f == ".." {
                    return Err(ierr(format!("shard name {f:?} is not a plain file name")));
                }
                if !names.iter().any(|n| n == f) {
                    names.push(f.to_string());
                }
            }
            names.sort();
            names
        } else if dir.join(SINGLE_FILE).is_file() {
            vec![SINGLE_FILE.to_string()]
        } else {
            return Err(SafetensorsError::NoWeights { dir: dir.to_path_buf() });
        };
        let mut files = Vec::with_capacity(shard_names.len());
        let mut index = HashMap::new();
        for (i, name) in shard_names.iter().enumerate() {
            let f = SafetensorsFile::open(&dir.join(name))?;
            for t in f.tensors.keys() {
                if let Some(prev) = index.insert(t.clone(), i) {
                    return Err(SafetensorsError::Index {
                        path: index_path.clone(),
                        reason: format!("tensor '{t}' is in both {} and {name}", shard_names[prev]),
                    });
                }
            }
            files.push(f);
        }
        Ok(SafetensorsDir { dir: dir.to_path_buf(), files, index })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.index.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// The file holding `name` and the tensor's info.
    pub fn get(&self, name: &str) -> Result<(&SafetensorsFile, &StTensorInfo), SafetensorsError> {
        let missing = || SafetensorsError::MissingTensor { dir: self.dir.clone(), tensor: name.to_string() };
        let f = &self.files[*self.index.get(name).ok_or_else(missing)?];
        Ok((f, f.tensors.get(name).ok_or_else(missing)?))
    }

    /// The tensor's GGML type, shape and bytes; an unsupported dtype is an error naming it.
    pub fn read(&self, name: &str) -> Result<(GgmlType, &[usize], &[u8]), SafetensorsError> {
        let (f, info) = self.get(name)?;
        let ty = ggml_type_of(&info.dtype).ok_or_else(|| SafetensorsError::UnsupportedDtype {
            path: f.path.clone(),
            tensor: name.to_string(),
            dtype: info.dtype.clone(),
        })?;
        Ok((ty, &info.shape, f.data(info)))
    }

    /// The file a tensor lives in (for error messages).
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.index.get(name).map(|&i| self.files[i].path.clone()).unwrap_or_else(|| self.dir.clone())
    }
}

/// A tensor to write: name, safetensors dtype name, row-major shape.
#[derive(Clone, Debug)]
pub struct StMeta {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
}

impl StMeta {
    pub fn n_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * dtype_size(self.dtype).unwrap_or(0)
    }
}

/// A tensor with its bytes (for small checkpoints written in one go).
pub struct StWriteTensor<'a> {
    pub meta: StMeta,
    pub data: std::borrow::Cow<'a, [u8]>,
}

/// Writes one safetensors file holding `metas[i]` for `i` in `members`, in that order;
/// `data(i)` yields tensor `i`'s bytes (called once each, so large models stream). The file
/// appears only when complete (written as `.partial`, then renamed).
pub fn write_file_with<E: From<SafetensorsError>>(
    path: &Path,
    metas: &[StMeta],
    members: &[usize],
    metadata: &BTreeMap<String, String>,
    data: &mut impl FnMut(usize) -> Result<Vec<u8>, E>,
) -> Result<(), E> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), serde_json::to_value(metadata).unwrap_or(Json::Null));
    }
    let mut off = 0usize;
    for &i in members {
        let t = &metas[i];
        let end = off + t.n_bytes();
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, end]}),
        );
        off = end;
    }
    let mut h = Json::Object(header).to_string().into_bytes();
    // Pad the header with spaces so the data section starts 8-byte aligned.
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let partial = path.with_extension("safetensors.partial");
    let io = |source| E::from(SafetensorsError::Io { path: partial.clone(), source });
    let mut w = BufWriter::with_capacity(1 << 20, File::create(&partial).map_err(io)?);
    w.write_all(&(h.len() as u64).to_le_bytes()).map_err(io)?;
    w.write_all(&h).map_err(io)?;
    for &i in members {
        // Between tensors (see `gguf_writer::write_gguf`): the partial file goes.
        if let Err(stop) = crate::sys::interrupt::check(|| format!("before {} was complete", path.display())) {
            drop(w);
            let _ = std::fs::remove_file(&partial);
            return Err(E::from(SafetensorsError::from(stop)));
        }
        let bytes = data(i)?;
        if bytes.len() != metas[i].n_bytes() {
            let _ = std::fs::remove_file(&partial);
            return Err(E::from(SafetensorsError::Tensor {
                path: path.to_path_buf(),
                tensor: metas[i].name.clone(),
                reason: format!("{} bytes to write, {} expected", bytes.len(), metas[i].n_bytes()),
            }));
        }
        w.write_all(&bytes).map_err(io)?;
    }
    w.flush().map_err(io)?;
    drop(w);
    std::fs::rename(&partial, path).map_err(|source| E::from(SafetensorsError::Io { path: path.to_path_buf(), source }))
}

/// Writes a checkpoint into `dir`: `model.safetensors`, or, when `n_shards > 1`,
/// `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json` (tensors dealt out in
/// order, about the same number of bytes per shard).
pub fn write_checkpoint_with<E: From<SafetensorsError>>(
    dir: &Path,
    metas: &[StMeta],
    n_shards: usize,
    mut data: impl FnMut(usize) -> Result<Vec<u8>, E>,
) -> Result<(), E> {
    let meta: BTreeMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    if n_shards <= 1 {
        let all: Vec<usize> = (0..metas.len()).collect();
        return write_file_with(&dir.join(SINGLE_FILE), metas, &all, &meta, &mut data);
    }
    let total: usize = metas.iter().map(StMeta::n_bytes).sum();
    // Fill shards in order; each closes once it reaches its share of the bytes still to place,
    // recomputed as shards close (so one huge embedding table does not leave later shards empty).
    let mut groups: Vec<Vec<usize>> = vec![Vec::new()];
    let (mut left, mut cur) = (total, 0usize);
    for (i, t) in metas.iter().enumerate() {
        let shards_left = n_shards - (groups.len() - 1);
        if cur > 0 && shards_left > 1 && cur >= left.div_ceil(shards_left) {
            groups.push(Vec::new());
            left -= cur;
            cur = 0;
        }
        if let Some(g) = groups.last_mut() {
            g.push(i);
        }
        cur += t.n_bytes();
    }
    let n_shards = groups.len();
    let mut weight_map = serde_json::Map::new();
    for (g, members) in groups.iter().enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", g + 1, n_shards);
        for &i in members {
            weight_map.insert(metas[i].name.clone(), Json::String(name.clone()));
        }
        write_file_with(&dir.join(&name), metas, members, &meta, &mut data)?;
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let path = dir.join(INDEX_FILE);
    std::fs::write(&path, serde_json::to_string_pretty(&index).unwrap_or_default())
        .map_err(|source| E::from(SafetensorsError::Io { path, source }))
}

/// [`write_checkpoint_with`] for tensors already in memory.
pub fn write_checkpoint(dir: &Path, tensors: &[StWriteTensor], n_shards: usize) -> Result<(), SafetensorsError> {
    let metas: Vec<StMeta> = tensors.iter().map(|t| t.meta.clone()).collect();
    write_checkpoint_with(dir, &metas, n_shards, |i| Ok::<_, SafetensorsError>(tensors[i].data.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("dustoff-st-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn meta(name: &str, dtype: &'static str, shape: Vec<usize>) -> StMeta {
        StMeta { name: name.into(), dtype, shape }
    }

    #[test]
    fn round_trip_and_bounds_checks() {
        let d = tmp("rt");
        let a: Vec<u8> = (0..12u8).collect();
        let t = vec![
            StWriteTensor { meta: meta("a", "BF16", vec![2, 3]), data: Cow::Borrowed(&a) },
            StWriteTensor { meta: meta("b", "F32", vec![1]), data: Cow::Owned(vec![0, 0, 128, 63]) },
        ];
        write_checkpoint(&d, &t, 1).unwrap();
        let st = SafetensorsDir::open(&d).unwrap();
        let (ty, shape, bytes) = st.read("a").unwrap();
        assert_eq!((ty, shape, bytes), (GgmlType::BF16, &[2usize, 3][..], &a[..]));
        assert!(matches!(st.read("zz"), Err(SafetensorsError::MissingTensor { .. })));

        // Truncate the file: the last tensor's range now lies outside it.
        let p = d.join(SINGLE_FILE);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 2]).unwrap();
        let e = SafetensorsFile::open(&p).err().unwrap().to_string();
        assert!(e.contains("tensor 'b'") && e.contains("outside"), "{e}");
        // Header length beyond the file.
        std::fs::write(&p, 1000u64.to_le_bytes()).unwrap();
        assert!(matches!(SafetensorsFile::open(&p), Err(SafetensorsError::Header { .. })));
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn sharded_checkpoint_reads_every_tensor() {
        let d = tmp("shard");
        let data: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 8]).collect();
        let t: Vec<StWriteTensor> = data
            .iter()
            .enumerate()
            .map(|(i, b)| StWriteTensor { meta: meta(&format!("t{i}"), "F16", vec![4]), data: Cow::Borrowed(b) })
            .collect();
        write_checkpoint(&d, &t, 3).unwrap();
        let st = SafetensorsDir::open(&d).unwrap();
        assert_eq!(st.files.len(), 3);
        for (i, b) in data.iter().enumerate() {
            assert_eq!(st.read(&format!("t{i}")).unwrap().2, &b[..]);
        }
        std::fs::remove_dir_all(&d).ok();
    }
}
