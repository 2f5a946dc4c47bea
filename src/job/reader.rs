//! Streaming input: JSONL, Parquet (row group by row group, only the needed columns) and the
//! OpenAI Batch API input format. Several files or globs form one input set read in order.
//!
//! Memory stays bounded whatever the input size: one line (capped at `max_line_bytes`) or one
//! Parquet batch at a time, plus a 16-byte digest per owned id for duplicate detection.

use std::collections::HashSet;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int16Type, Int32Type, Int64Type, Int8Type};
use arrow::datatypes::{UInt16Type, UInt32Type, UInt64Type, UInt8Type};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use serde_json::{Map, Value};

use super::record::{id_from_json, json_type, ChatMessage, ErrorKind, Item, OpenAiEndpoint};
use super::record::{OpenAiRequest, RecordBody, RecordError};
use super::shard::ShardSpec;

/// A failure that stops reading (unlike [`RecordError`], which becomes one error row).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read input {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("bad input pattern '{pattern}': {message}")]
    Pattern { pattern: String, message: String },
    #[error("input '{0}' is a folder: give its files, e.g. '{0}/*.jsonl'")]
    Folder(String),
    #[error("input '{0}' matches no file")]
    NoMatch(String),
    #[error(
        "input '{0}' is not a regular file (a pipe or a device): a job reads its inputs more than once (to know them on a resume), so save the stream to a file first (gzip and zstd files are read as they are)"
    )]
    NotAFile(String),
    #[error("cannot read Parquet input {path}: {source}")]
    Parquet { path: PathBuf, source: parquet::errors::ParquetError },
    #[error("Parquet input {path} has no column '{column}' (columns: {available})")]
    MissingColumn { path: PathBuf, column: String, available: String },
    #[error(transparent)]
    Decompress(#[from] super::decompress::DecompressError),
}

/// How an input file is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputFormat {
    Jsonl,
    Parquet,
    /// JSONL lines `{"custom_id", "method", "url", "body": {...}}`.
    OpenAiBatch,
    /// JSONL lines of any object, kept whole (`RecordBody::Fields` of every field): the id field
    /// is optional and of any JSON type (the item's id is its JSON text), and ids may repeat
    /// (`generate --input`'s prompt lines).
    Objects,
}

impl InputFormat {
    /// `.parquet` / `.pq` files are Parquet, everything else JSONL.
    pub fn from_path(path: &Path) -> InputFormat {
        match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()) {
            Some(e) if e == "parquet" || e == "pq" => InputFormat::Parquet,
            _ => InputFormat::Jsonl,
        }
    }
}

/// What to read and check.
#[derive(Clone, Debug)]
pub struct ReaderConfig {
    /// `None`: decided per file by [`InputFormat::from_path`].
    pub format: Option<InputFormat>,
    pub id_field: String,
    /// Text fields the pipeline reads; each must be present and a string.
    pub fields: Vec<String>,
    /// The field that must not be empty (the document).
    pub document_field: Option<String>,
    /// Longer lines become `input_too_long` error rows without being held in memory.
    pub max_line_bytes: usize,
    /// Yield only this shard's records (indices still count every record).
    pub shard: Option<ShardSpec>,
    /// Rows per Parquet batch.
    pub parquet_batch_rows: usize,
}

impl ReaderConfig {
    pub fn new(id_field: &str, fields: &[&str]) -> Self {
        ReaderConfig {
            format: None,
            id_field: id_field.to_string(),
            fields: fields.iter().map(|s| s.to_string()).collect(),
            document_field: fields.first().map(|s| s.to_string()),
            max_line_bytes: 16 << 20,
            shard: None,
            parquet_batch_rows: 1024,
        }
    }

    /// Whole JSON objects ([`InputFormat::Objects`]), the id (if any) from `id_field`.
    pub fn objects(id_field: &str) -> Self {
        ReaderConfig { format: Some(InputFormat::Objects), document_field: None, ..ReaderConfig::new(id_field, &[]) }
    }

    /// The OpenAI Batch API format: id from `custom_id`, request from `body`.
    pub fn openai() -> Self {
        ReaderConfig {
            format: Some(InputFormat::OpenAiBatch),
            id_field: "custom_id".to_string(),
            fields: Vec::new(),
            document_field: None,
            ..ReaderConfig::new("custom_id", &[])
        }
    }
}

/// Expands input arguments: plain paths must exist, patterns with `*?[` are globbed (sorted).
pub fn expand_inputs(args: &[String]) -> Result<Vec<PathBuf>, ReadError> {
    let mut out = Vec::new();
    for a in args {
        if a.contains(['*', '?', '[']) {
            let paths = glob::glob(a).map_err(|e| ReadError::Pattern { pattern: a.clone(), message: e.to_string() })?;
            let mut found = Vec::new();
            for p in paths {
                let p = p.map_err(|e| ReadError::Io {
                    path: e.path().to_path_buf(),
                    source: std::io::Error::other(e.to_string()),
                })?;
                if p.is_file() {
                    found.push(p);
                }
            }
            if found.is_empty() {
                return Err(ReadError::NoMatch(a.clone()));
            }
            found.sort();
            out.extend(found);
        } else {
            let p = PathBuf::from(a);
            if p.is_dir() {
                return Err(ReadError::Folder(a.trim_end_matches('/').to_string()));
            }
            if p.exists() && !p.is_file() {
                // A pipe, a device, `<(zcat ...)`: a job reads its inputs more than once (their
                // identity, the records, again on a resume), which a stream cannot give.
                return Err(ReadError::NotAFile(a.clone()));
            }
            if !p.is_file() {
                return Err(ReadError::NoMatch(a.clone()));
            }
            out.push(p);
        }
    }
    Ok(out)
}

/// Number of records in the input set when cheap to know: Parquet row counts from the footer,
/// JSONL non-blank line counts for files up to 2 GiB in total. `None` otherwise.
pub fn count_hint(files: &[PathBuf], cfg: &ReaderConfig) -> Option<u64> {
    let mut total = 0u64;
    let mut jsonl_bytes = 0u64;
    for f in files {
        if cfg.format.unwrap_or(InputFormat::from_path(f)) == InputFormat::Parquet {
            let b = ParquetRecordBatchReaderBuilder::try_new(File::open(f).ok()?).ok()?;
            total += b.metadata().file_metadata().num_rows() as u64;
            continue;
        }
        // A compressed file's records are counted only by reading it all: not cheap.
        if super::decompress::compression_of(f).ok()? != super::decompress::Compression::None {
            return None;
        }
        jsonl_bytes += std::fs::metadata(f).ok()?.len();
        if jsonl_bytes > 2 << 30 {
            return None;
        }
        let mut r = BufReader::with_capacity(1 << 20, File::open(f).ok()?);
        let mut blank = true;
        loop {
            let buf = r.fill_buf().ok()?;
            if buf.is_empty() {
                break;
            }
            for &b in buf {
                if b == b'\n' {
                    total += u64::from(!blank);
                    blank = true;
                } else if !b.is_ascii_whitespace() {
                    blank = false;
                }
            }
            let n = buf.len();
            r.consume(n);
        }
        total += u64::from(!blank);
    }
    Some(total)
}

/// A raw unit from one file, before validation.
enum Raw {
    /// A JSONL line, or `Err(len)` when over the byte limit.
    Line(Result<Vec<u8>, u64>),
    /// A Parquet row: (id cell, field cells in config order).
    Row(Cell, Vec<Cell>),
}

enum Cell {
    Null,
    Str(String),
    Int(String),
    BadUtf8,
    Other(String),
}

struct JsonlSource {
    path: PathBuf,
    /// The file's bytes, decompressed when it is gzip or zstd ([`super::decompress`]).
    reader: BufReader<Box<dyn Read + Send>>,
    line: u64,
}

impl JsonlSource {
    /// The next non-blank line, reading at most `max` bytes of it into memory.
    fn next_line(&mut self, max: usize) -> Result<Option<(u64, Raw)>, ReadError> {
        let io = |source| ReadError::Io { path: self.path.clone(), source };
        loop {
            let mut buf = Vec::new();
            let mut len = 0u64;
            let mut saw_any = false;
            loop {
                let chunk = self.reader.fill_buf().map_err(io)?;
                if chunk.is_empty() {
                    break;
                }
                saw_any = true;
                let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
                    Some(p) => (p, true),
                    None => (chunk.len(), false),
                };
                len += take as u64;
                if buf.len() + take <= max {
                    buf.extend_from_slice(&chunk[..take]);
                }
                self.reader.consume(take + usize::from(done));
                if done {
                    break;
                }
            }
            if !saw_any {
                return Ok(None);
            }
            self.line += 1;
            if len > max as u64 {
                return Ok(Some((self.line, Raw::Line(Err(len)))));
            }
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            if buf.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            return Ok(Some((self.line, Raw::Line(Ok(buf)))));
        }
    }
}

struct ParquetSource {
    path: PathBuf,
    reader: ParquetRecordBatchReader,
    batch: Option<(RecordBatch, Vec<usize>)>,
    pos: usize,
    row: u64,
}

impl ParquetSource {
    fn open(path: &Path, cfg: &ReaderConfig) -> Result<Self, ReadError> {
        let pq = |source| ReadError::Parquet { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(|source| ReadError::Io { path: path.to_path_buf(), source })?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(pq)?;
        let schema = builder.schema().clone();
        let mut roots = Vec::new();
        for name in std::iter::once(&cfg.id_field).chain(&cfg.fields) {
            match schema.index_of(name) {
                Ok(i) => roots.push(i),
                Err(_) => {
                    let available: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                    return Err(ReadError::MissingColumn {
                        path: path.to_path_buf(),
                        column: name.clone(),
                        available: available.join(", "),
                    });
                }
            }
        }
        // Only the id and the needed fields are decoded; other columns are never read.
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        let reader =
            builder.with_projection(mask).with_batch_size(cfg.parquet_batch_rows.max(1)).build().map_err(pq)?;
        Ok(ParquetSource { path: path.to_path_buf(), reader, batch: None, pos: 0, row: 0 })
    }

    fn next_row(&mut self, cfg: &ReaderConfig) -> Result<Option<(u64, Raw)>, ReadError> {
        loop {
            if let Some((batch, cols)) = &self.batch {
                if self.pos < batch.num_rows() {
                    let r = self.pos;
                    self.pos += 1;
                    self.row += 1;
                    let id = cell(batch.column(cols[0]), r);
                    let fields = cols[1..].iter().map(|&c| cell(batch.column(c), r)).collect();
                    return Ok(Some((self.row, Raw::Row(id, fields))));
                }
            }
            match self.reader.next() {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(ReadError::Parquet {
                        path: self.path.clone(),
                        source: parquet::errors::ParquetError::ArrowError(e.to_string()),
                    })
                }
                Some(Ok(batch)) => {
                    let schema = batch.schema();
                    let mut cols = Vec::new();
                    for name in std::iter::once(&cfg.id_field).chain(&cfg.fields) {
                        // Present: the projection was built from these names.
                        cols.push(schema.index_of(name).unwrap_or(0));
                    }
                    self.batch = Some((batch, cols));
                    self.pos = 0;
                }
            }
        }
    }
}

fn cell(a: &ArrayRef, r: usize) -> Cell {
    if a.is_null(r) {
        return Cell::Null;
    }
    let bytes_cell = |b: &[u8]| match std::str::from_utf8(b) {
        Ok(s) => Cell::Str(s.to_string()),
        Err(_) => Cell::BadUtf8,
    };
    match a.data_type() {
        DataType::Utf8 => Cell::Str(a.as_string::<i32>().value(r).to_string()),
        DataType::LargeUtf8 => Cell::Str(a.as_string::<i64>().value(r).to_string()),
        DataType::Utf8View => Cell::Str(a.as_string_view().value(r).to_string()),
        DataType::Binary => bytes_cell(a.as_binary::<i32>().value(r)),
        DataType::LargeBinary => bytes_cell(a.as_binary::<i64>().value(r)),
        DataType::Int8 => Cell::Int(a.as_primitive::<Int8Type>().value(r).to_string()),
        DataType::Int16 => Cell::Int(a.as_primitive::<Int16Type>().value(r).to_string()),
        DataType::Int32 => Cell::Int(a.as_primitive::<Int32Type>().value(r).to_string()),
        DataType::Int64 => Cell::Int(a.as_primitive::<Int64Type>().value(r).to_string()),
        DataType::UInt8 => Cell::Int(a.as_primitive::<UInt8Type>().value(r).to_string()),
        DataType::UInt16 => Cell::Int(a.as_primitive::<UInt16Type>().value(r).to_string()),
        DataType::UInt32 => Cell::Int(a.as_primitive::<UInt32Type>().value(r).to_string()),
        DataType::UInt64 => Cell::Int(a.as_primitive::<UInt64Type>().value(r).to_string()),
        other => Cell::Other(other.to_string()),
    }
}

enum Source {
    Jsonl(JsonlSource),
    Parquet(Box<ParquetSource>),
}

/// Ids are already blake3 digests: hash them by their low bits instead of SipHash again.
#[derive(Default)]
struct DigestHasher(u64);
impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for (i, b) in bytes.iter().take(8).enumerate() {
            self.0 |= u64::from(*b) << (8 * i);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

/// The record stream over an input set. Yields `Err` only for failures that stop the job (I/O,
/// an unreadable Parquet file); bad records come as items with an error body.
pub struct RecordReader {
    files: Vec<PathBuf>,
    cfg: ReaderConfig,
    next_file: usize,
    current: Option<(usize, Source)>,
    next_index: u64,
    /// 128-bit digests of the owned ids seen so far (16 bytes per record).
    seen: HashSet<u128, BuildHasherDefault<DigestHasher>>,
    /// Bytes of each JSONL file to read (its size when the job's identity was taken).
    byte_limits: Option<Vec<u64>>,
}

impl RecordReader {
    pub fn new(files: Vec<PathBuf>, cfg: ReaderConfig) -> Self {
        RecordReader {
            files,
            cfg,
            next_file: 0,
            current: None,
            next_index: 0,
            seen: HashSet::default(),
            byte_limits: None,
        }
    }

    /// Reads no JSONL file past its size in `limits` (one per file): a job reads its inputs as
    /// they were when its identity was taken, so lines appended while it runs are left for the
    /// next run (which sees a changed input) instead of landing in an output whose identity
    /// does not cover them.
    pub fn with_byte_limits(mut self, limits: Vec<u64>) -> Self {
        if limits.len() == self.files.len() {
            self.byte_limits = Some(limits);
        }
        self
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    fn format_of(&self, file: usize) -> InputFormat {
        self.cfg.format.unwrap_or_else(|| InputFormat::from_path(&self.files[file]))
    }

    fn open(&self, file: usize) -> Result<Source, ReadError> {
        let path = &self.files[file];
        match self.format_of(file) {
            InputFormat::Parquet => Ok(Source::Parquet(Box::new(ParquetSource::open(path, &self.cfg)?))),
            InputFormat::Jsonl | InputFormat::OpenAiBatch | InputFormat::Objects => {
                let limit = self.byte_limits.as_ref().map(|l| l[file]);
                let f = super::decompress::open_limited(path, limit)?;
                Ok(Source::Jsonl(JsonlSource {
                    path: path.clone(),
                    reader: BufReader::with_capacity(1 << 20, f),
                    line: 0,
                }))
            }
        }
    }

    fn next_raw(&mut self) -> Result<Option<(usize, u64, Raw)>, ReadError> {
        loop {
            if self.current.is_none() {
                if self.next_file >= self.files.len() {
                    return Ok(None);
                }
                let f = self.next_file;
                self.next_file += 1;
                self.current = Some((f, self.open(f)?));
            }
            let Some((f, src)) = self.current.as_mut() else { continue };
            let got = match src {
                Source::Jsonl(s) => s.next_line(self.cfg.max_line_bytes)?,
                Source::Parquet(s) => s.next_row(&self.cfg)?,
            };
            match got {
                Some((line, raw)) => return Ok(Some((*f, line, raw))),
                None => self.current = None,
            }
        }
    }

    fn file_name(&self, file: usize) -> String {
        self.files[file].display().to_string()
    }

    /// Validates a raw unit into (id, body).
    fn parse(&self, file: usize, line: u64, raw: Raw) -> (Option<String>, Result<RecordBody, RecordError>) {
        let at = format!("{} line {line}", self.file_name(file));
        match raw {
            Raw::Line(Err(len)) => (
                None,
                Err(RecordError::new(
                    ErrorKind::InputTooLong,
                    format!("{at}: line of {len} bytes is over the {} byte limit", self.cfg.max_line_bytes),
                )),
            ),
            Raw::Line(Ok(bytes)) => {
                let (mut text, utf8_err) = match String::from_utf8(bytes) {
                    Ok(s) => (s, None),
                    Err(e) => {
                        let valid = e.utf8_error().valid_up_to();
                        let s = String::from_utf8_lossy(e.as_bytes()).into_owned();
                        (s, Some(format!("{at}: invalid UTF-8 at byte {valid}")))
                    }
                };
                // A byte-order mark (files saved by Windows tools) is not part of the first record.
                if line == 1 && text.starts_with('\u{feff}') {
                    text.drain(..'\u{feff}'.len_utf8());
                }
                let obj = match serde_json::from_str::<Value>(&text) {
                    Ok(Value::Object(m)) => m,
                    Ok(other) => {
                        let msg = format!("{at}: expected a JSON object, got {}", json_type(&other));
                        return (None, Err(RecordError::new(ErrorKind::MalformedJson, msg)));
                    }
                    Err(e) => {
                        let (kind, msg) = match utf8_err {
                            Some(m) => (ErrorKind::InvalidUtf8, m),
                            None => (ErrorKind::MalformedJson, format!("{at}: {e}")),
                        };
                        return (None, Err(RecordError::new(kind, msg)));
                    }
                };
                if self.format_of(file) == InputFormat::Objects {
                    let id = obj.get(&self.cfg.id_field).filter(|v| !v.is_null()).map(Value::to_string);
                    let body = match utf8_err {
                        Some(m) => Err(RecordError::new(ErrorKind::InvalidUtf8, m)),
                        None => Ok(RecordBody::Fields(obj)),
                    };
                    return (id, body);
                }
                // Lossy decoding may still recover the id for a better error row.
                let id = id_from_json(&self.cfg.id_field, obj.get(&self.cfg.id_field));
                if let Some(m) = utf8_err {
                    return (id.ok(), Err(RecordError::new(ErrorKind::InvalidUtf8, m)));
                }
                let id = match id {
                    Ok(id) => id,
                    Err(e) => return (None, Err(RecordError::new(e.kind, format!("{at}: {}", e.message)))),
                };
                let body = if self.format_of(file) == InputFormat::OpenAiBatch {
                    parse_openai(obj).map(RecordBody::OpenAi)
                } else {
                    self.take_fields(obj)
                };
                (Some(id), body)
            }
            Raw::Row(id_cell, cells) => {
                let id = match id_cell {
                    Cell::Str(s) if !s.is_empty() => s,
                    Cell::Int(s) => s,
                    Cell::Null | Cell::Str(_) => {
                        let m = format!("{at}: id column '{}' is null or empty", self.cfg.id_field);
                        return (None, Err(RecordError::new(ErrorKind::MissingField, m)));
                    }
                    Cell::BadUtf8 => {
                        let m = format!("{at}: id column '{}' is not UTF-8", self.cfg.id_field);
                        return (None, Err(RecordError::new(ErrorKind::InvalidUtf8, m)));
                    }
                    Cell::Other(t) => {
                        let m = format!("{at}: id column '{}' has type {t}", self.cfg.id_field);
                        return (None, Err(RecordError::new(ErrorKind::WrongType, m)));
                    }
                };
                let mut map = Map::new();
                for (name, c) in self.cfg.fields.iter().zip(cells) {
                    let v = match c {
                        Cell::Str(s) => s,
                        Cell::Null => {
                            return (Some(id), Err(missing(name)));
                        }
                        Cell::BadUtf8 => {
                            let m = format!("field '{name}' is not valid UTF-8");
                            return (Some(id), Err(RecordError::new(ErrorKind::InvalidUtf8, m)));
                        }
                        Cell::Int(_) | Cell::Other(_) => {
                            let m = format!("field '{name}' must be text");
                            return (Some(id), Err(RecordError::new(ErrorKind::WrongType, m)));
                        }
                    };
                    map.insert(name.clone(), Value::String(v));
                }
                let body = self.check_document(&map).map(|_| RecordBody::Fields(map));
                (Some(id), body)
            }
        }
    }

    fn take_fields(&self, mut obj: Map<String, Value>) -> Result<RecordBody, RecordError> {
        let mut map = Map::new();
        for name in &self.cfg.fields {
            match obj.remove(name) {
                None | Some(Value::Null) => return Err(missing(name)),
                Some(Value::String(s)) => {
                    map.insert(name.clone(), Value::String(s));
                }
                Some(other) => {
                    let m = format!("field '{name}' must be a string, got {}", json_type(&other));
                    return Err(RecordError::new(ErrorKind::WrongType, m));
                }
            }
        }
        self.check_document(&map)?;
        Ok(RecordBody::Fields(map))
    }

    fn check_document(&self, map: &Map<String, Value>) -> Result<(), RecordError> {
        if let Some(doc) = &self.cfg.document_field {
            if map.get(doc).and_then(Value::as_str).is_some_and(|s| s.trim().is_empty()) {
                let m = format!("document field '{doc}' is empty");
                return Err(RecordError::new(ErrorKind::EmptyDocument, m));
            }
        }
        Ok(())
    }
}

fn missing(name: &str) -> RecordError {
    RecordError::new(ErrorKind::MissingField, format!("field '{name}' is missing"))
}

impl Iterator for RecordReader {
    type Item = Result<Item, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (file, line, raw) = match self.next_raw() {
                Ok(Some(x)) => x,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            let index = self.next_index;
            self.next_index += 1;
            let (id, mut body) = self.parse(file, line, raw);
            let item_key = match &id {
                Some(id) => id.clone(),
                None => format!("\u{0}index:{index}"),
            };
            if let Some(shard) = self.cfg.shard {
                if !shard.owns(&item_key) {
                    continue;
                }
            }
            if let Some(id) = id.as_ref().filter(|_| self.format_of(file) != InputFormat::Objects) {
                let d = blake3::hash(id.as_bytes());
                let digest = u128::from_le_bytes(d.as_bytes()[..16].try_into().unwrap_or([0; 16]));
                if !self.seen.insert(digest) {
                    let m = format!("id '{id}' appeared before in this input set");
                    body = Err(RecordError::new(ErrorKind::DuplicateId, m));
                }
            }
            return Some(Ok(Item { index, file, line, id, body }));
        }
    }
}

/// Reads one OpenAI Batch API request body.
fn parse_openai(mut obj: Map<String, Value>) -> Result<OpenAiRequest, RecordError> {
    let wrong = |m: String| RecordError::new(ErrorKind::WrongType, m);
    let url = obj.get("url").and_then(Value::as_str).map(str::to_string);
    let mut body = match obj.remove("body") {
        Some(Value::Object(b)) => b,
        None | Some(Value::Null) => return Err(missing("body")),
        Some(o) => return Err(wrong(format!("field 'body' must be an object, got {}", json_type(&o)))),
    };
    let endpoint = match url.as_deref() {
        Some(u) if u.ends_with("/chat/completions") => OpenAiEndpoint::Chat,
        Some(u) if u.ends_with("/completions") => OpenAiEndpoint::Completion,
        Some(u) => return Err(wrong(format!("url '{u}' is not /v1/chat/completions or /v1/completions"))),
        None if body.contains_key("messages") => OpenAiEndpoint::Chat,
        None => OpenAiEndpoint::Completion,
    };
    let mut req = OpenAiRequest {
        endpoint,
        model: body.get("model").and_then(Value::as_str).map(str::to_string),
        messages: Vec::new(),
        prompt: String::new(),
        max_tokens: None,
        temperature: None,
        top_p: None,
        seed: None,
    };
    match endpoint {
        OpenAiEndpoint::Chat => {
            let msgs = match body.remove("messages") {
                Some(Value::Array(a)) if !a.is_empty() => a,
                Some(Value::Array(_)) => {
                    return Err(RecordError::new(ErrorKind::EmptyDocument, "body.messages is empty"))
                }
                None | Some(Value::Null) => return Err(missing("body.messages")),
                Some(o) => return Err(wrong(format!("body.messages must be an array, got {}", json_type(&o)))),
            };
            for (i, m) in msgs.into_iter().enumerate() {
                req.messages.push(chat_message(i, m)?);
            }
        }
        OpenAiEndpoint::Completion => {
            req.prompt = match body.remove("prompt") {
                Some(Value::String(s)) => s,
                Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                    a[0].as_str().unwrap_or_default().to_string()
                }
                None | Some(Value::Null) => return Err(missing("body.prompt")),
                Some(_) => return Err(wrong("body.prompt must be a string".to_string())),
            };
            if req.prompt.trim().is_empty() {
                return Err(RecordError::new(ErrorKind::EmptyDocument, "body.prompt is empty"));
            }
        }
    }
    let num = |k: &str| body.get(k).filter(|v| !v.is_null());
    if let Some(v) = num("max_completion_tokens").or_else(|| num("max_tokens")) {
        let n = v.as_u64().filter(|&n| n > 0 && n <= u64::from(u32::MAX));
        req.max_tokens = Some(n.ok_or_else(|| wrong("body.max_tokens must be a positive integer".into()))? as u32);
    }
    if let Some(v) = num("temperature") {
        let t = v.as_f64().filter(|t| (0.0..=2.0).contains(t));
        req.temperature = Some(t.ok_or_else(|| wrong("body.temperature must be a number from 0 to 2".into()))? as f32);
    }
    if let Some(v) = num("top_p") {
        let p = v.as_f64().filter(|p| *p > 0.0 && *p <= 1.0);
        req.top_p = Some(p.ok_or_else(|| wrong("body.top_p must be a number above 0, at most 1".into()))? as f32);
    }
    unsupported_options(&body)?;
    if let Some(v) = num("seed") {
        let s = v.as_i64().ok_or_else(|| wrong("body.seed must be an integer".into()))?;
        req.seed = Some(s as u64);
    }
    Ok(req)
}

/// Request options that would change the answer and that dustoff does not implement: refused
/// (an `unsupported` error row) rather than silently left out. Their neutral values pass.
fn unsupported_options(body: &Map<String, Value>) -> Result<(), RecordError> {
    let set = |k: &str| body.get(k).filter(|v| !v.is_null());
    let unsupported = |what: &str| {
        Err(RecordError::new(ErrorKind::Unsupported, format!("{what} is not supported; leave it out of the request")))
    };
    if set("n").is_some_and(|v| v.as_u64() != Some(1)) {
        return unsupported("body.n other than 1 (one completion per request)");
    }
    if set("stop").is_some_and(|v| !(v.as_array().is_some_and(Vec::is_empty) || v.as_str() == Some(""))) {
        return unsupported("body.stop (stop sequences)");
    }
    for k in ["presence_penalty", "frequency_penalty"] {
        if set(k).is_some_and(|v| v.as_f64() != Some(0.0)) {
            return unsupported(&format!("body.{k} other than 0"));
        }
    }
    for k in ["logit_bias", "tools", "functions"] {
        if set(k)
            .is_some_and(|v| !(v.as_object().is_some_and(Map::is_empty) || v.as_array().is_some_and(Vec::is_empty)))
        {
            return unsupported(&format!("body.{k}"));
        }
    }
    if set("logprobs").is_some_and(|v| v.as_bool() != Some(false)) {
        return unsupported("body.logprobs");
    }
    if let Some(f) = set("response_format") {
        if f.get("type").and_then(Value::as_str) != Some("text") {
            return unsupported(
                "body.response_format other than text (a pipeline with [output] kind = \"json\" constrains JSON)",
            );
        }
    }
    Ok(())
}

fn chat_message(i: usize, m: Value) -> Result<ChatMessage, RecordError> {
    let wrong = |m: String| RecordError::new(ErrorKind::WrongType, m);
    let Value::Object(mut m) = m else {
        return Err(wrong(format!("body.messages[{i}] must be an object")));
    };
    let role = match m.remove("role") {
        Some(Value::String(r)) => r,
        _ => return Err(missing(&format!("body.messages[{i}].role"))),
    };
    if !["system", "developer", "user", "assistant", "tool"].contains(&role.as_str()) {
        return Err(wrong(format!(
            "body.messages[{i}].role '{role}' is not one of system, developer, user, assistant, tool"
        )));
    }
    let content = match m.remove("content") {
        Some(Value::String(c)) => c,
        // Content parts: only text parts can be run by a text model.
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => return Err(wrong(format!("body.messages[{i}].content has a non-text part"))),
                }
            }
            text
        }
        None | Some(Value::Null) => return Err(missing(&format!("body.messages[{i}].content"))),
        Some(o) => return Err(wrong(format!("body.messages[{i}].content must be a string, got {}", json_type(&o)))),
    };
    Ok(ChatMessage { role, content })
}
