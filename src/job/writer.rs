//! Output rows and files. A row is one canonical JSON line everywhere inside the job (part files,
//! shard outputs); the final file is JSONL (those lines) or Parquet (the same rows as columns),
//! chosen by the output's extension. Rows hold no wall-clock values so reruns compare byte for byte.
//!
//! Row shapes (key order is fixed):
//! - ok: `{"id","output","finish_reason","prompt_tokens","generated_tokens","input_truncated","empty_output"}`
//! - error: `{"id","output":null,"error":{"kind","message"}}`
//! - unparseable line: `{"id":null,"line":N,"output":null,"error":{...}}`
//! - OpenAI batch input: OpenAI batch output lines (`id`, `custom_id`, `response`, `error`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanBuilder, RecordBatch, StringBuilder, StructArray, UInt32Builder, UInt64Builder,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, UInt32Type, UInt64Type};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use serde::Serialize;
use serde_json::Value;

use super::record::{ErrorKind, OpenAiEndpoint, RecordError};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot write Parquet {path}: {source}")]
    Parquet { path: PathBuf, source: parquet::errors::ParquetError },
    #[error("cannot read rows of {path}: {message}")]
    BadRows { path: PathBuf, message: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> WriteError + '_ {
    move |source| WriteError::Io { path: path.to_path_buf(), source }
}

/// The output file's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Jsonl,
    Parquet,
}

impl OutputFormat {
    /// `.parquet` / `.pq` is Parquet, anything else JSONL.
    pub fn from_path(path: &Path) -> OutputFormat {
        match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()) {
            Some(e) if e == "parquet" || e == "pq" => OutputFormat::Parquet,
            _ => OutputFormat::Jsonl,
        }
    }
}

/// A successful record's output.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum RowOutput {
    Text(String),
    /// The parsed JSON of a JSON pipeline, keys in the order the model wrote them (the schema's
    /// order under a grammar; serde_json keeps insertion order: llguidance turns on `preserve_order`).
    Json(Value),
}

#[derive(Serialize)]
struct OkRow<'a> {
    id: &'a str,
    output: &'a RowOutput,
    /// A pipeline's `output.thinking_field`: field name -> reasoning (at most one entry).
    #[serde(flatten)]
    extra: BTreeMap<&'a str, Option<&'a str>>,
    finish_reason: &'a str,
    prompt_tokens: u32,
    generated_tokens: u32,
    /// The prompt was cut to `limits.max_input_tokens` (the model saw part of the document).
    input_truncated: bool,
    /// The answer is empty or only whitespace (the row still counts as ok).
    empty_output: bool,
}

#[derive(Serialize)]
struct ErrBody<'a> {
    kind: ErrorKind,
    message: &'a str,
}

#[derive(Serialize)]
struct ErrRow<'a> {
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u64>,
    output: Option<()>,
    error: ErrBody<'a>,
}

fn to_line<T: Serialize>(v: &T) -> String {
    // Serializing these plain structs cannot fail (string keys, finite numbers).
    serde_json::to_string(v).unwrap_or_default()
}

impl RowOutput {
    /// Whether the answer is empty or only whitespace (a row's `empty_output` flag). A JSON
    /// output is an object the schema accepted: never empty.
    pub fn is_empty(&self) -> bool {
        matches!(self, RowOutput::Text(t) if t.trim().is_empty())
    }
}

/// The row of a record that ran. `input_truncated`: its prompt was cut to fit
/// `limits.max_input_tokens`; `empty_output` is derived from `output`.
pub fn ok_row(
    id: &str,
    output: &RowOutput,
    finish_reason: &str,
    prompt_tokens: u32,
    generated_tokens: u32,
    input_truncated: bool,
) -> String {
    ok_row_with(id, output, None, finish_reason, prompt_tokens, generated_tokens, input_truncated)
}

/// As [`ok_row`], with `thinking`: (field, reasoning) written after `output` (JSONL only: the
/// Parquet schema has no such column, and the run refuses the combination).
pub fn ok_row_with(
    id: &str,
    output: &RowOutput,
    thinking: Option<(&str, Option<&str>)>,
    finish_reason: &str,
    prompt_tokens: u32,
    generated_tokens: u32,
    input_truncated: bool,
) -> String {
    let extra = thinking.into_iter().collect();
    let empty_output = output.is_empty();
    to_line(&OkRow { id, output, extra, finish_reason, prompt_tokens, generated_tokens, input_truncated, empty_output })
}

/// The row of a record that failed; `line` is written only when there is no id.
pub fn error_row(id: Option<&str>, line: u64, err: &RecordError) -> String {
    let line = if id.is_none() { Some(line) } else { None };
    to_line(&ErrRow { id, line, output: None, error: ErrBody { kind: err.kind, message: &err.message } })
}

fn short_hash(s: &str) -> String {
    blake3::hash(s.as_bytes()).to_hex()[..24].to_string()
}

/// An OpenAI batch output line for a request that ran. `created` is 0: no wall clock in rows.
pub fn openai_ok_row(
    custom_id: &str,
    endpoint: OpenAiEndpoint,
    model: &str,
    text: &str,
    finish_reason: &str,
    prompt_tokens: u32,
    generated_tokens: u32,
) -> String {
    let h = short_hash(custom_id);
    let usage = serde_json::json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated_tokens,
        "total_tokens": prompt_tokens + generated_tokens,
    });
    let body = match endpoint {
        OpenAiEndpoint::Chat => serde_json::json!({
            "id": format!("chatcmpl-{h}"),
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
            "usage": usage,
        }),
        OpenAiEndpoint::Completion => serde_json::json!({
            "id": format!("cmpl-{h}"),
            "object": "text_completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}],
            "usage": usage,
        }),
    };
    #[derive(Serialize)]
    struct Line<'a> {
        id: String,
        custom_id: &'a str,
        response: Value,
        error: Option<()>,
    }
    let response = serde_json::json!({"status_code": 200, "request_id": format!("req_{h}"), "body": body});
    to_line(&Line { id: format!("batch_req_{h}"), custom_id, response, error: None })
}

/// An OpenAI batch output line for a request that failed. Lines without a `custom_id` also say
/// their 1-based `line`.
pub fn openai_error_row(custom_id: Option<&str>, line: u64, err: &RecordError) -> String {
    #[derive(Serialize)]
    struct Line<'a> {
        id: String,
        custom_id: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        line: Option<u64>,
        response: Option<()>,
        error: Value,
    }
    let key = custom_id.map(str::to_string).unwrap_or_else(|| format!("\u{0}line:{line}"));
    to_line(&Line {
        id: format!("batch_req_{}", short_hash(&key)),
        custom_id,
        line: if custom_id.is_none() { Some(line) } else { None },
        response: None,
        error: serde_json::json!({"code": err.kind.as_str(), "message": err.message}),
    })
}

/// Parquet columns of a row: flat, with `error` as a struct column.
pub fn parquet_schema(json_output: bool) -> SchemaRef {
    let err_fields =
        Fields::from(vec![Field::new("kind", DataType::Utf8, false), Field::new("message", DataType::Utf8, false)]);
    let meta = [("dustoff.output_kind".to_string(), if json_output { "json" } else { "text" }.to_string())];
    Arc::new(
        Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("line", DataType::UInt64, true),
            Field::new("output", DataType::Utf8, true),
            Field::new("finish_reason", DataType::Utf8, true),
            Field::new("prompt_tokens", DataType::UInt32, true),
            Field::new("generated_tokens", DataType::UInt32, true),
            Field::new("error", DataType::Struct(err_fields), true),
            Field::new("input_truncated", DataType::Boolean, true),
            Field::new("empty_output", DataType::Boolean, true),
        ])
        .with_metadata(meta.into_iter().collect()),
    )
}

/// Column builders for one Parquet batch.
struct Columns {
    id: StringBuilder,
    line: UInt64Builder,
    output: StringBuilder,
    finish: StringBuilder,
    prompt: UInt32Builder,
    generated: UInt32Builder,
    err_kind: StringBuilder,
    err_msg: StringBuilder,
    err_valid: Vec<bool>,
    input_truncated: BooleanBuilder,
    empty_output: BooleanBuilder,
}

impl Columns {
    fn new() -> Self {
        Columns {
            id: StringBuilder::new(),
            line: UInt64Builder::new(),
            output: StringBuilder::new(),
            finish: StringBuilder::new(),
            prompt: UInt32Builder::new(),
            generated: UInt32Builder::new(),
            err_kind: StringBuilder::new(),
            err_msg: StringBuilder::new(),
            err_valid: Vec::new(),
            input_truncated: BooleanBuilder::new(),
            empty_output: BooleanBuilder::new(),
        }
    }

    fn len(&self) -> usize {
        self.err_valid.len()
    }

    /// Appends one row line; `Err` names what is wrong with it.
    fn push(&mut self, line: &str) -> Result<(), String> {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("row is not JSON: {e}"))?;
        if v.get("custom_id").is_some() {
            return Err("OpenAI batch output can only be written as JSONL".to_string());
        }
        let s = |k: &str| v.get(k).and_then(Value::as_str);
        let u = |k: &str| v.get(k).and_then(Value::as_u64);
        self.id.append_option(s("id"));
        self.line.append_option(u("line"));
        match v.get("output") {
            None | Some(Value::Null) => self.output.append_null(),
            Some(Value::String(t)) => self.output.append_value(t),
            Some(other) => self.output.append_value(other.to_string()),
        }
        self.finish.append_option(s("finish_reason"));
        self.prompt.append_option(u("prompt_tokens").map(|n| n as u32));
        self.generated.append_option(u("generated_tokens").map(|n| n as u32));
        let e = v.get("error").filter(|e| e.is_object());
        let kind = e.and_then(|e| e.get("kind")).and_then(Value::as_str);
        let msg = e.and_then(|e| e.get("message")).and_then(Value::as_str);
        // The struct's children are non-null: null rows carry empty strings under the null mask.
        self.err_kind.append_value(kind.unwrap_or(""));
        self.err_msg.append_value(msg.unwrap_or(""));
        self.err_valid.push(e.is_some());
        let b = |k: &str| v.get(k).and_then(Value::as_bool);
        self.input_truncated.append_option(b("input_truncated"));
        self.empty_output.append_option(b("empty_output"));
        Ok(())
    }

    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch, arrow::error::ArrowError> {
        let DataType::Struct(err_fields) = schema.field(6).data_type().clone() else {
            return Err(arrow::error::ArrowError::SchemaError("error column is not a struct".into()));
        };
        let valid = std::mem::take(&mut self.err_valid);
        let err = StructArray::try_new(
            err_fields,
            vec![Arc::new(self.err_kind.finish()) as ArrayRef, Arc::new(self.err_msg.finish())],
            Some(NullBuffer::from(valid)),
        )?;
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(self.id.finish()),
                Arc::new(self.line.finish()),
                Arc::new(self.output.finish()),
                Arc::new(self.finish.finish()),
                Arc::new(self.prompt.finish()),
                Arc::new(self.generated.finish()),
                Arc::new(err),
                Arc::new(self.input_truncated.finish()),
                Arc::new(self.empty_output.finish()),
            ],
        )
    }
}

const PARQUET_BATCH_ROWS: usize = 4096;

enum Sink {
    Jsonl(BufWriter<File>),
    Parquet { writer: Box<ArrowWriter<File>>, cols: Box<Columns>, schema: SchemaRef },
}

/// Writes the final output atomically: rows go to `<output>.partial`, which is fsync'd and
/// renamed over the output by [`RowWriter::finish`]. A crash never leaves a half output file.
pub struct RowWriter {
    path: PathBuf,
    tmp: PathBuf,
    sink: Sink,
    rows: u64,
}

impl RowWriter {
    /// `json_output`: the `output` values are JSON objects (recorded in the Parquet metadata so
    /// they read back as objects).
    pub fn create(path: &Path, json_output: bool) -> Result<Self, WriteError> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".partial");
        let tmp = PathBuf::from(tmp);
        let file = File::create(&tmp).map_err(io_err(&tmp))?;
        let sink = match OutputFormat::from_path(path) {
            OutputFormat::Jsonl => Sink::Jsonl(BufWriter::with_capacity(1 << 20, file)),
            OutputFormat::Parquet => {
                let schema = parquet_schema(json_output);
                let props = WriterProperties::builder()
                    .set_compression(Compression::SNAPPY)
                    .set_created_by(format!("dustoff {}", env!("CARGO_PKG_VERSION")))
                    .set_key_value_metadata(Some(vec![KeyValue::new(
                        "dustoff.format_version".to_string(),
                        "1".to_string(),
                    )]))
                    .build();
                let writer = ArrowWriter::try_new(file, schema.clone(), Some(props))
                    .map_err(|source| WriteError::Parquet { path: path.to_path_buf(), source })?;
                Sink::Parquet { writer: Box::new(writer), cols: Box::new(Columns::new()), schema }
            }
        };
        Ok(RowWriter { path: path.to_path_buf(), tmp, sink, rows: 0 })
    }

    /// Appends one row (a line made by this module, without the newline).
    pub fn write_row(&mut self, line: &str) -> Result<(), WriteError> {
        self.rows += 1;
        match &mut self.sink {
            Sink::Jsonl(w) => w.write_all(line.as_bytes()).and_then(|_| w.write_all(b"\n")).map_err(io_err(&self.tmp)),
            Sink::Parquet { writer, cols, schema } => {
                cols.push(line).map_err(|message| WriteError::BadRows { path: self.path.clone(), message })?;
                if cols.len() >= PARQUET_BATCH_ROWS {
                    flush_batch(&self.path, writer, cols, schema)?;
                }
                Ok(())
            }
        }
    }

    /// The file the rows go to until `finish` renames it to the output.
    pub fn partial_path(&self) -> &Path {
        &self.tmp
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Flushes, fsyncs and renames the output into place.
    pub fn finish(self) -> Result<u64, WriteError> {
        self.finish_with(|_, _| Ok(()))
    }

    /// [`RowWriter::finish`], running `before_rename(partial, rows)` on the complete, fsync'd
    /// file before it takes the output's name (what must exist before the output does: a
    /// report naming its digest). An error there leaves the output as it was.
    pub fn finish_with(
        self,
        before_rename: impl FnOnce(&Path, u64) -> Result<(), WriteError>,
    ) -> Result<u64, WriteError> {
        let file = match self.sink {
            Sink::Jsonl(w) => {
                w.into_inner().map_err(|e| WriteError::Io { path: self.tmp.clone(), source: e.into_error() })?
            }
            Sink::Parquet { mut writer, mut cols, schema } => {
                if cols.len() > 0 {
                    flush_batch(&self.path, &mut writer, &mut cols, &schema)?;
                }
                writer.into_inner().map_err(|source| WriteError::Parquet { path: self.path.clone(), source })?
            }
        };
        file.sync_all().map_err(io_err(&self.tmp))?;
        before_rename(&self.tmp, self.rows)?;
        std::fs::rename(&self.tmp, &self.path).map_err(io_err(&self.path))?;
        sync_parent(&self.path).map_err(io_err(&self.path))?;
        Ok(self.rows)
    }
}

fn flush_batch(
    path: &Path,
    writer: &mut ArrowWriter<File>,
    cols: &mut Columns,
    schema: &SchemaRef,
) -> Result<(), WriteError> {
    let batch =
        cols.finish(schema).map_err(|e| WriteError::BadRows { path: path.to_path_buf(), message: e.to_string() })?;
    writer.write(&batch).map_err(|source| WriteError::Parquet { path: path.to_path_buf(), source })
}

/// Outputs are plain JSONL (or Parquet): a name that says gzip or zstd would hold plain text that
/// every reader of it then fails to decompress. `Some(why)` for such a name.
pub fn compressed_name(output: &Path) -> Option<String> {
    let ext = output.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    ["gz", "zst", "bz2", "xz", "zip", "lz4", "7z"].contains(&ext.as_str()).then(|| {
        format!(
            "--output {}: outputs are written as plain JSONL (or Parquet), not .{ext}; name it without .{ext} and \
             compress it afterwards",
            output.display()
        )
    })
}

/// Makes a rename or a new file in `path`'s directory durable.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Reads the rows of an output file back as canonical JSON lines (JSONL: the lines as they are;
/// Parquet: each row rebuilt with the functions above). Used by `merge`.
pub struct RowLines {
    path: PathBuf,
    inner: RowLinesInner,
}

enum RowLinesInner {
    Jsonl(std::io::Lines<std::io::BufReader<File>>),
    Parquet { reader: ParquetRecordBatchReader, batch: Option<RecordBatch>, pos: usize, json_output: bool },
}

impl RowLines {
    pub fn open(path: &Path) -> Result<Self, WriteError> {
        let file = File::open(path).map_err(io_err(path))?;
        let inner = match OutputFormat::from_path(path) {
            OutputFormat::Jsonl => {
                use std::io::BufRead;
                RowLinesInner::Jsonl(std::io::BufReader::with_capacity(1 << 20, file).lines())
            }
            OutputFormat::Parquet => {
                let pq = |source| WriteError::Parquet { path: path.to_path_buf(), source };
                let b = ParquetRecordBatchReaderBuilder::try_new(file).map_err(pq)?;
                let json_output = b.schema().metadata().get("dustoff.output_kind").is_some_and(|k| k == "json");
                let reader = b.with_batch_size(PARQUET_BATCH_ROWS).build().map_err(pq)?;
                RowLinesInner::Parquet { reader, batch: None, pos: 0, json_output }
            }
        };
        Ok(RowLines { path: path.to_path_buf(), inner })
    }

    /// Whether the `output` values of this file are JSON objects.
    pub fn json_output(&self) -> bool {
        matches!(self.inner, RowLinesInner::Parquet { json_output: true, .. })
    }

    fn bad(&self, message: String) -> WriteError {
        WriteError::BadRows { path: self.path.clone(), message }
    }
}

impl Iterator for RowLines {
    type Item = Result<String, WriteError>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.inner {
            RowLinesInner::Jsonl(lines) => {
                lines.next().map(|l| l.map_err(|source| WriteError::Io { path: self.path.clone(), source }))
            }
            RowLinesInner::Parquet { reader, batch, pos, json_output } => loop {
                if let Some(b) = batch {
                    if *pos < b.num_rows() {
                        let r = *pos;
                        *pos += 1;
                        let line = parquet_row_line(b, r, *json_output);
                        return Some(line.map_err(|m| self.bad(m)));
                    }
                }
                match reader.next()? {
                    Ok(b) => {
                        *batch = Some(b);
                        *pos = 0;
                    }
                    Err(e) => return Some(Err(self.bad(e.to_string()))),
                }
            },
        }
    }
}

fn parquet_row_line(b: &RecordBatch, r: usize, json_output: bool) -> Result<String, String> {
    let col = |name: &str| b.column_by_name(name).ok_or_else(|| format!("no column '{name}'"));
    let text = |name: &str| -> Result<Option<String>, String> {
        let c = col(name)?;
        let a = c.as_string_opt::<i32>().ok_or_else(|| format!("column '{name}' is not text"))?;
        Ok(if a.is_null(r) { None } else { Some(a.value(r).to_string()) })
    };
    let id = text("id")?;
    let err = col("error")?;
    let err = err.as_struct_opt().ok_or("column 'error' is not a struct")?;
    if err.is_valid(r) {
        let kind_s = err.column(0).as_string::<i32>().value(r).to_string();
        let message = err.column(1).as_string::<i32>().value(r).to_string();
        let kind: ErrorKind = serde_json::from_value(Value::String(kind_s.clone()))
            .map_err(|_| format!("unknown error kind '{kind_s}'"))?;
        let line = col("line")?;
        let line = line.as_primitive_opt::<UInt64Type>().ok_or("column 'line' is not u64")?;
        let n = if line.is_null(r) { 0 } else { line.value(r) };
        return Ok(error_row(id.as_deref(), n, &RecordError::new(kind, message)));
    }
    let id = id.ok_or_else(|| format!("row {r} has neither an id nor an error"))?;
    let out = text("output")?.unwrap_or_default();
    let output = if json_output {
        RowOutput::Json(serde_json::from_str(&out).map_err(|e| format!("row {r}: output is not JSON: {e}"))?)
    } else {
        RowOutput::Text(out)
    };
    let num = |name: &str| -> Result<u32, String> {
        let c = col(name)?;
        let a = c.as_primitive_opt::<UInt32Type>().ok_or_else(|| format!("column '{name}' is not u32"))?;
        Ok(if a.is_null(r) { 0 } else { a.value(r) })
    };
    let finish = text("finish_reason")?.unwrap_or_default();
    // Outputs written before the row flags existed have no such column: not truncated.
    let truncated = match b.column_by_name("input_truncated") {
        Some(c) => {
            let a = c.as_boolean_opt().ok_or("column 'input_truncated' is not boolean")?;
            !a.is_null(r) && a.value(r)
        }
        None => false,
    };
    Ok(ok_row(&id, &output, &finish, num("prompt_tokens")?, num("generated_tokens")?, truncated))
}
