//! GGUF reader (versions 2 and 3): memory-mapped, every metadata value type, tensor infos,
//! alignment. Every read is bounds-checked: a truncated, corrupt or hostile file yields a
//! `GgufError` naming the file and the key or tensor, never a panic or an out-of-bounds read.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::quant::GgmlType;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Dimensions beyond this are not a real model; refusing them keeps products from overflowing.
const MAX_DIMS: u32 = 8;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open model file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a GGUF file (magic bytes {found:?}, expected \"GGUF\")")]
    BadMagic { path: PathBuf, found: [u8; 4] },
    #[error("{path}: GGUF version {version} is not supported (versions 2 and 3 are)")]
    Version { path: PathBuf, version: u32 },
    #[error("{path}: file is truncated or corrupt while reading {what} (at byte {offset})")]
    Truncated { path: PathBuf, what: String, offset: usize },
    #[error("{path}: {what} is invalid: {reason}")]
    Invalid { path: PathBuf, what: String, reason: String },
    #[error("{path}: tensor '{tensor}' has type id {type_id}, which dustoff does not support")]
    UnsupportedType { path: PathBuf, tensor: String, type_id: u32 },
    #[error("{path}: tensor '{tensor}' data (bytes {start}..{end}) lies outside the file ({len} bytes)")]
    TensorOutOfBounds { path: PathBuf, tensor: String, start: u64, end: u64, len: usize },
    #[error("{path}: metadata key '{key}' is missing")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata key '{key}' has the wrong type: expected {expected}, found {found}")]
    WrongType { path: PathBuf, key: String, expected: &'static str, found: &'static str },
    #[error("{path}: tensor '{tensor}' is missing")]
    MissingTensor { path: PathBuf, tensor: String },
}

/// A metadata value. Arrays keep their element values (GGUF arrays are homogeneous).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }

    /// Any integer type as u64 (negative values are `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type as i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v as i64),
            Value::U16(v) => Some(v as i64),
            Value::U32(v) => Some(v as i64),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v as i64),
            Value::I16(v) => Some(v as i64),
            Value::I32(v) => Some(v as i64),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any number as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where a tensor's data lies and how to read it.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the innermost (contiguous) dimension, i.e. the row length.
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    pub n_bytes: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Row length (innermost dimension).
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }
    /// Number of rows (product of the outer dimensions).
    pub fn n_rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }
}

/// An open GGUF file. Tensor data is borrowed from the memory map.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    /// Metadata keys in file order (for writers that must preserve it).
    pub metadata_order: Vec<String>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    mmap: Arc<Mmap>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| GgufError::Io { path: path.clone(), source })?;
        // SAFETY: the file is mapped read-only; dustoff never writes to a model file while it is
        // open. A concurrent external truncation could fault, as with any mmap-based loader.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|source| GgufError::Io { path: path.clone(), source })?;
        Self::from_mmap(path, mmap)
    }

    fn from_mmap(path: PathBuf, mmap: Mmap) -> Result<Self, GgufError> {
        let parsed = parse(&path, &mmap)?;
        let tensor_index = parsed.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile {
            path,
            version: parsed.version,
            metadata: parsed.metadata,
            metadata_order: parsed.metadata_order,
            tensors: parsed.tensors,
            tensor_index,
            alignment: parsed.alignment,
            mmap: Arc::new(mmap),
        })
    }

    /// The whole file as bytes (the memory map).
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (bounds were checked at open).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.mmap[info.offset..info.offset + info.n_bytes]
    }

    /// The shared memory map (tensors loaded from this file keep it alive).
    pub fn mmap(&self) -> &Arc<Mmap> {
        &self.mmap
    }

    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor { path: self.path.clone(), tensor: name.to_string() })
    }

    pub fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey { path: self.path.clone(), key: key.to_string() })
    }

    fn wrong(&self, key: &str, expected: &'static str, v: &Value) -> GgufError {
        GgufError::WrongType { path: self.path.clone(), key: key.to_string(), expected, found: v.type_name() }
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.wrong(key, "unsigned integer", v)),
        }
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.wrong(key, "number", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.wrong(key, "string", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.wrong(key, "bool", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&[Value]>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| self.wrong(key, "array", v)),
        }
    }

    /// A string array (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        let Some(arr) = self.get_array(key)? else { return Ok(None) };
        arr.iter()
            .map(|v| v.as_str().ok_or_else(|| self.wrong(key, "array of strings", v)))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An integer array (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i64_array(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        let Some(arr) = self.get_array(key)? else { return Ok(None) };
        arr.iter()
            .map(|v| v.as_i64().ok_or_else(|| self.wrong(key, "array of integers", v)))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

#[derive(Debug)]
struct Parsed {
    version: u32,
    metadata: HashMap<String, Value>,
    metadata_order: Vec<String>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
}

/// A bounds-checked little-endian cursor.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Array elements the metadata may still hold ([`METADATA_ELEMENTS`] in all).
    elements_left: u64,
}

/// Most array elements the whole metadata may hold. The largest real arrays are a vocabulary's
/// tokens, scores, types and merges (~260k entries each); each element is parsed into a value
/// of 32 bytes, so a corrupt count that the file's bytes could still back (a u8 array of 90M
/// elements over tensor data) would otherwise cost 30 times the file's size in memory.
const METADATA_ELEMENTS: u64 = 1 << 24;

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::Truncated { path: self.path.to_path_buf(), what: what(), offset: self.pos }),
        }
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn invalid(&self, what: String, reason: String) -> GgufError {
        GgufError::Invalid { path: self.path.to_path_buf(), what, reason }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(GgufError::Truncated { path: self.path.to_path_buf(), what: what(), offset: self.pos });
        }
        let bytes = self.take(len as usize, what)?;
        // Vocabularies of some converted models hold invalid UTF-8 pieces; keep them lossily
        // rather than refusing the file.
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, ty: u32, what: &dyn Fn() -> String, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.invalid(what(), format!("bool byte {b} is neither 0 nor 1"))),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth > 2 {
                    return Err(self.invalid(what(), "arrays nested more than 2 deep".into()));
                }
                let elem_ty = self.u32(what)?;
                let count = self.u64(what)?;
                // Every element takes at least one byte: a count beyond the bytes left is corrupt,
                // and checking it first keeps a hostile count from allocating huge vectors.
                if count > self.remaining() as u64 {
                    return Err(self.invalid(what(), format!("array count {count} exceeds the bytes left in the file")));
                }
                if count > self.elements_left {
                    return Err(self.invalid(
                        what(),
                        format!(
                            "array count {count} takes the metadata past {METADATA_ELEMENTS} array elements in all, \
                             far more than any model's vocabulary needs"
                        ),
                    ));
                }
                self.elements_left -= count;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem_ty, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            t => return Err(self.invalid(what(), format!("unknown metadata value type {t}"))),
        })
    }
}

fn parse(path: &Path, buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor { buf, pos: 0, path, elements_left: METADATA_ELEMENTS };
    let magic: [u8; 4] = c.array(&|| "the magic bytes".into())?;
    if &magic != MAGIC {
        return Err(GgufError::BadMagic { path: path.to_path_buf(), found: magic });
    }
    let version = c.u32(&|| "the version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::Version { path: path.to_path_buf(), version });
    }
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.u64(&|| "the metadata count".into())?;
    // Each entry needs well over 8 bytes; larger counts cannot be honest.
    if n_tensors > (buf.len() / 8) as u64 || n_kv > (buf.len() / 8) as u64 {
        return Err(c.invalid(
            "the header".into(),
            format!("{n_tensors} tensors / {n_kv} metadata entries cannot fit in {} bytes", buf.len()),
        ));
    }

    let mut metadata = HashMap::new();
    let mut metadata_order = Vec::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata entry #{i} key"))?;
        let what = || format!("metadata key '{key}'");
        let ty = c.u32(&what)?;
        let value = c.value(ty, &what, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(c.invalid(what(), "the key appears twice".into()));
        }
        metadata_order.push(key);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
            _ => {
                let why = format!("{v:?} must be a power of two of at most 1 MiB");
                return Err(c.invalid("metadata key 'general.alignment'".into(), why));
            }
        },
    };

    struct Raw {
        name: String,
        dims: Vec<u64>,
        type_id: u32,
        rel_offset: u64,
    }
    // Grown as the entries parse: a corrupt count within the file's size (~1/8 of its bytes)
    // would otherwise reserve 64 bytes each before the first entry is read.
    let mut raws = Vec::with_capacity(n_tensors.min(1 << 16) as usize);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("tensor info #{i} name"))?;
        let what = || format!("tensor '{name}' info");
        let n_dims = c.u32(&what)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.invalid(what(), format!("{n_dims} dimensions")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&what)?);
        }
        let type_id = c.u32(&what)?;
        let rel_offset = c.u64(&what)?;
        raws.push(Raw { name, dims, type_id, rel_offset });
    }

    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let mut tensors = Vec::with_capacity(raws.len());
    let mut seen = std::collections::HashSet::new();
    for r in raws {
        if !seen.insert(r.name.clone()) {
            return Err(c.invalid(format!("tensor '{}'", r.name), "the name appears twice".into()));
        }
        let dtype = GgmlType::from_id(r.type_id).ok_or_else(|| GgufError::UnsupportedType {
            path: path.to_path_buf(),
            tensor: r.name.clone(),
            type_id: r.type_id,
        })?;
        let n_elem = r.dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let row = r.dims[0];
        let n_bytes = n_elem.and_then(|n| {
            if row == 0 || row % dtype.block_size() as u64 != 0 {
                return None;
            }
            (n / dtype.block_size() as u64).checked_mul(dtype.type_size() as u64)
        });
        let Some(n_bytes) = n_bytes else {
            let why = if n_elem.is_none() {
                "its element count overflows 64 bits".to_string()
            } else if r.dims.contains(&0) {
                "a dimension is 0".to_string()
            } else {
                format!("rows must be whole blocks of {}", dtype.block_size())
            };
            return Err(c.invalid(
                format!("tensor '{}'", r.name),
                format!("shape {:?} does not fit type {} ({why})", r.dims, dtype),
            ));
        };
        if r.rel_offset % alignment != 0 {
            return Err(c.invalid(
                format!("tensor '{}'", r.name),
                format!("offset {} is not aligned to {alignment}", r.rel_offset),
            ));
        }
        let start = data_start.checked_add(r.rel_offset);
        let end = start.and_then(|s| s.checked_add(n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= buf.len() as u64 => tensors.push(TensorInfo {
                name: r.name,
                dims: r.dims,
                dtype,
                offset: s as usize,
                n_bytes: n_bytes as usize,
            }),
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    path: path.to_path_buf(),
                    tensor: r.name,
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    len: buf.len(),
                })
            }
        }
    }
    Ok(Parsed { version, metadata, metadata_order, tensors, alignment })
}

/// Parses GGUF bytes already in memory (used by tests and the fuzz property test).
pub fn parse_bytes(path: &Path, bytes: &[u8]) -> Result<(u32, usize, usize), GgufError> {
    let p = parse(path, bytes)?;
    Ok((p.version, p.metadata.len(), p.tensors.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny GGUF v3 file written by hand: one metadata key of each type, two tensors.
    pub(crate) fn tiny_gguf() -> Vec<u8> {
        let mut b = Vec::new();
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend((x.len() as u64).to_le_bytes());
            b.extend(x.as_bytes());
        };
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(2u64.to_le_bytes()); // tensors
        b.extend(4u64.to_le_bytes()); // kv
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "llama");
        s(&mut b, "a.u32");
        b.extend(4u32.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        s(&mut b, "a.arr");
        b.extend(9u32.to_le_bytes());
        b.extend(5u32.to_le_bytes()); // i32 elements
        b.extend(3u64.to_le_bytes());
        for v in [-1i32, 0, 1] {
            b.extend(v.to_le_bytes());
        }
        s(&mut b, "a.f64");
        b.extend(12u32.to_le_bytes());
        b.extend(1.5f64.to_le_bytes());
        // tensor 0: f32 [4]
        s(&mut b, "t0");
        b.extend(1u32.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        // tensor 1: q8_0 [32, 2]
        s(&mut b, "t1");
        b.extend(2u32.to_le_bytes());
        b.extend(32u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(32u64.to_le_bytes());
        while b.len() % 32 != 0 {
            b.push(0);
        }
        for v in [1.0f32, 2.0, 3.0, 4.0] {
            b.extend(v.to_le_bytes());
        }
        b.resize(b.len() + 16, 0); // pad to offset 32
        b.resize(b.len() + 68, 1);
        b
    }

    #[test]
    fn parses_hand_written_file() {
        let bytes = tiny_gguf();
        let p = parse(Path::new("tiny.gguf"), &bytes).unwrap();
        assert_eq!(p.version, 3);
        assert_eq!(p.metadata["general.architecture"], Value::String("llama".into()));
        assert_eq!(p.metadata["a.u32"].as_u64(), Some(7));
        assert_eq!(p.metadata["a.arr"], Value::Array(vec![Value::I32(-1), Value::I32(0), Value::I32(1)]));
        assert_eq!(p.metadata["a.f64"].as_f64(), Some(1.5));
        assert_eq!(p.tensors[1].dtype, GgmlType::Q8_0);
        assert_eq!(p.tensors[1].n_bytes, 68);
        assert_eq!(p.tensors[1].n_rows(), 2);
        let t0 = &p.tensors[0];
        assert_eq!(&bytes[t0.offset..t0.offset + 4], &1.0f32.to_le_bytes());
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = tiny_gguf();
        for n in 0..bytes.len() {
            assert!(parse(Path::new("t.gguf"), &bytes[..n]).is_err(), "prefix of {n} bytes parsed");
        }
    }

    #[test]
    fn bad_magic_and_version_are_named() {
        let mut bytes = tiny_gguf();
        bytes[4] = 9;
        let e = parse(Path::new("m.gguf"), &bytes).unwrap_err().to_string();
        assert!(e.contains("version 9") && e.contains("m.gguf"), "{e}");
        bytes[0] = b'X';
        let e = parse(Path::new("m.gguf"), &bytes).unwrap_err().to_string();
        assert!(e.contains("not a GGUF file"), "{e}");
    }

    #[test]
    fn an_array_past_the_element_budget_is_refused_before_it_is_parsed() {
        // One u8 array whose count the bytes after it could back: parsed, it would take 32
        // bytes of memory for each byte of the file.
        let count = METADATA_ELEMENTS + 1;
        let mut b = Vec::new();
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes()); // tensors
        b.extend(1u64.to_le_bytes()); // kv
        b.extend(5u64.to_le_bytes());
        b.extend(b"a.big");
        b.extend(9u32.to_le_bytes());
        b.extend(0u32.to_le_bytes()); // u8 elements
        b.extend(count.to_le_bytes());
        b.resize(b.len() + count as usize, 0);
        let e = parse(Path::new("big.gguf"), &b).unwrap_err().to_string();
        assert!(e.contains("big.gguf") && e.contains("a.big") && e.contains("array elements in all"), "{e}");
        // One element fewer parses.
        let at = b.len() - count as usize - 8;
        b[at..at + 8].copy_from_slice(&(count - 1).to_le_bytes());
        let p = parse(Path::new("big.gguf"), &b[..b.len() - 1]).unwrap();
        assert!(matches!(&p.metadata["a.big"], Value::Array(v) if v.len() == (count - 1) as usize));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Random byte flips anywhere in the header never panic; they parse or give an error.
        #[test]
        fn byte_flips_never_panic(flips in proptest::collection::vec((0usize..400, proptest::prelude::any::<u8>()), 1..6)) {
            let mut bytes = tiny_gguf();
            for (i, v) in flips {
                let n = bytes.len();
                bytes[i % n] = v;
            }
            let _ = parse(Path::new("f.gguf"), &bytes);
        }
    }
}
