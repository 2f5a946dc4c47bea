//! Job I/O without the model: readers, writers, checkpoints and resume, pipelines, sharding and
//! merge, on real files. Rows here are plain data made with the writer's row functions; the
//! end-to-end tests with the sample model live with the runner.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dustoff::job::checkpoint::{
    checkpoint_dir, discard_dir, Checkpoint, CheckpointError, PendingRow, CHECKPOINT_FORMAT_VERSION,
};
use dustoff::job::fingerprint::{file_identity, JobFingerprint};
use dustoff::job::pipeline::{parse_json_output, Overflow, Pipeline, TextCodec};
use dustoff::job::reader::{expand_inputs, InputFormat, ReadError, ReaderConfig, RecordReader};
use dustoff::job::record::{ChatMessage, ErrorKind, Item, OpenAiEndpoint, RecordBody, RecordError};
use dustoff::job::runner::{JobKind, StopFlag};
use dustoff::job::shard::{merge, order_path, ShardSpec};
use dustoff::job::writer::{error_row, ok_row, openai_ok_row, RowLines, RowOutput, RowWriter};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sample(name: &str) -> PathBuf {
    root().join("samples").join(name)
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dustoff-job-io-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn read_all(files: Vec<PathBuf>, cfg: ReaderConfig) -> Vec<Item> {
    RecordReader::new(files, cfg).collect::<Result<Vec<_>, _>>().unwrap()
}

fn kind(it: &Item) -> Option<ErrorKind> {
    it.body.as_ref().err().map(|e| e.kind)
}

/// A byte-level codec (one token per UTF-8 byte): a tokenizer, not a model, so truncation and
/// dry-run arithmetic can be checked by hand.
struct ByteCodec;
impl TextCodec for ByteCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        let b: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    fn chat_prompt(&self, m: &[ChatMessage]) -> Result<String, String> {
        Ok(m.iter().map(|m| format!("<{}>{}</{}>", m.role, m.content, m.role)).collect::<String>() + "<assistant>")
    }
}

#[test]
fn malformed_corpus_gives_one_error_per_bad_line() {
    let items = read_all(vec![sample("bad.jsonl")], ReaderConfig::new("id", &["text"]));
    let got: Vec<(u64, Option<&str>, Option<ErrorKind>)> =
        items.iter().map(|i| (i.line, i.id.as_deref(), kind(i))).collect();
    use ErrorKind::*;
    let want = vec![
        (1, Some("ok-1"), None),
        (2, None, Some(MalformedJson)),
        (3, None, Some(MalformedJson)),
        (4, None, Some(MissingField)),
        (5, Some("no-text"), Some(MissingField)),
        (6, Some("wrong-type"), Some(WrongType)),
        (7, Some("empty"), Some(EmptyDocument)),
        (8, Some("ok-1"), Some(DuplicateId)),
        (9, Some("77"), None),
        (10, None, Some(WrongType)),
        // line 11 is blank: not a record
        (12, Some("ok-2"), None),
        (13, Some("bad-utf8"), Some(InvalidUtf8)),
    ];
    assert_eq!(got, want);
    let idx: Vec<u64> = items.iter().map(|i| i.index).collect();
    assert_eq!(idx, (0..12).collect::<Vec<_>>());
    // The error message names the file and line.
    let msg = &items[1].body.as_ref().unwrap_err().message;
    assert!(msg.contains("bad.jsonl line 2"), "{msg}");
    // Rows: unparseable lines carry `"id": null` and the 1-based line.
    let row = error_row(items[1].id.as_deref(), items[1].line, items[1].body.as_ref().unwrap_err());
    assert!(
        row.starts_with(r#"{"id":null,"line":2,"output":null,"error":{"kind":"malformed_json","message":"#),
        "{row}"
    );
    let row = error_row(Some("no-text"), 5, &RecordError::new(MissingField, "field 'text' is missing"));
    assert_eq!(
        row,
        r#"{"id":"no-text","output":null,"error":{"kind":"missing_field","message":"field 'text' is missing"}}"#
    );
}

#[test]
fn over_long_lines_are_error_rows_and_reading_goes_on() {
    let d = tmpdir("long");
    let p = d.join("in.jsonl");
    let long = "x".repeat(5000);
    fs::write(&p, format!("{{\"id\":\"a\",\"text\":\"{long}\"}}\n{{\"id\":\"b\",\"text\":\"short\"}}\n")).unwrap();
    let mut cfg = ReaderConfig::new("id", &["text"]);
    cfg.max_line_bytes = 1000;
    let items = read_all(vec![p], cfg);
    assert_eq!(items.len(), 2);
    assert_eq!(kind(&items[0]), Some(ErrorKind::InputTooLong));
    assert_eq!(items[0].id, None);
    assert_eq!((items[1].id.as_deref(), kind(&items[1])), (Some("b"), None));
}

#[test]
fn object_lines_keep_every_field_and_any_id() {
    // generate --input's lines: the id is optional and of any JSON type (the item's id is its
    // JSON text), ids may repeat, blank lines are skipped but counted, a bad line is its error.
    let d = tmpdir("objects");
    let p = d.join("in.jsonl");
    let text = "{\"id\":\"a\",\"prompt\":\"x\",\"chat\":true}\n\n{\"id\":7,\"prompt_ids\":[1,2]}\n{\"prompt\":\"y\"}\n{\"id\":\"a\",\"prompt\":\"z\"}\n{oops\n";
    fs::write(&p, text).unwrap();
    let items = read_all(vec![p], ReaderConfig::objects("id"));
    assert_eq!(items.len(), 5);
    let ids: Vec<Option<&str>> = items.iter().map(|i| i.id.as_deref()).collect();
    assert_eq!(ids, [Some("\"a\""), Some("7"), None, Some("\"a\""), None]);
    assert_eq!(items.iter().map(|i| i.line).collect::<Vec<_>>(), [1, 3, 4, 5, 6]);
    match &items[0].body {
        Ok(RecordBody::Fields(f)) => {
            assert_eq!(f.len(), 3, "every field kept: {f:?}");
            assert_eq!(f["chat"], serde_json::Value::Bool(true));
        }
        other => panic!("a whole object: {other:?}"),
    }
    assert_eq!(kind(&items[3]), None, "a repeated id is not an error here");
    assert_eq!(kind(&items[4]), Some(ErrorKind::MalformedJson));
}

/// `samples/news.parquet` is generated from `samples/news.jsonl` by this test when missing
/// (delete it and run `cargo test --release --test job_io sample_parquet` to regenerate).
#[test]
fn sample_parquet_matches_sample_jsonl() {
    use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt32Array};
    let pq = sample("news.parquet");
    let jsonl = read_all(vec![sample("news.jsonl")], ReaderConfig::new("id", &["text"]));
    if !pq.exists() {
        let text = |it: &Item| match it.body.as_ref().unwrap() {
            RecordBody::Fields(f) => f["text"].as_str().unwrap().to_string(),
            RecordBody::OpenAi(_) => unreachable!(),
        };
        let ids: Vec<String> = jsonl.iter().map(|i| i.id.clone().unwrap()).collect();
        let texts: Vec<String> = jsonl.iter().map(text).collect();
        let lens: Vec<u32> = texts.iter().map(|t| t.len() as u32).collect();
        let batch = RecordBatch::try_from_iter(vec![
            ("id", Arc::new(StringArray::from(ids)) as ArrayRef),
            ("n_chars", Arc::new(UInt32Array::from(lens)) as ArrayRef),
            ("text", Arc::new(StringArray::from(texts)) as ArrayRef),
        ])
        .unwrap();
        // Small row groups so the reader really streams group by group.
        let props = parquet::file::properties::WriterProperties::builder().set_max_row_group_size(5).build();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(fs::File::create(&pq).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
    let mut cfg = ReaderConfig::new("id", &["text"]);
    cfg.parquet_batch_rows = 3;
    let from_pq = read_all(vec![pq.clone()], cfg);
    assert_eq!(from_pq.len(), 12);
    for (a, b) in jsonl.iter().zip(&from_pq) {
        assert_eq!((&a.id, &a.body, a.index, a.line), (&b.id, &b.body, b.index, b.line));
    }
    // Both files in one input set: indices continue across files.
    let both = read_all(vec![sample("news.jsonl"), pq.clone()], ReaderConfig::new("id", &["text"]));
    assert_eq!(both.len(), 24);
    assert_eq!(both[12].index, 12);
    assert_eq!(kind(&both[12]), Some(ErrorKind::DuplicateId));
    // A column the pipeline needs but the file lacks stops the job with a clear message.
    let err = RecordReader::new(vec![pq], ReaderConfig::new("id", &["body"])).next().unwrap().unwrap_err();
    assert!(matches!(err, ReadError::MissingColumn { .. }));
    assert!(err.to_string().contains("no column 'body'") && err.to_string().contains("n_chars"), "{err}");
}

#[test]
fn parquet_bad_cells_become_error_rows() {
    use arrow::array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
    let d = tmpdir("pqbad");
    let p = d.join("in.parquet");
    let ids: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(3), Some(4)]));
    let text: ArrayRef = Arc::new(BinaryArray::from(vec![
        Some(b"fine".as_slice()),
        Some(b"no id".as_slice()),
        None,
        Some(b"caf\xe9".as_slice()),
    ]));
    let batch = RecordBatch::try_from_iter(vec![("id", ids), ("text", text)]).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(fs::File::create(&p).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let items = read_all(vec![p], ReaderConfig::new("id", &["text"]));
    let got: Vec<(Option<&str>, Option<ErrorKind>)> = items.iter().map(|i| (i.id.as_deref(), kind(i))).collect();
    assert_eq!(
        got,
        vec![
            (Some("1"), None),
            (None, Some(ErrorKind::MissingField)),
            (Some("3"), Some(ErrorKind::MissingField)),
            (Some("4"), Some(ErrorKind::InvalidUtf8)),
        ]
    );
}

#[test]
fn openai_batch_input_and_output_lines() {
    let items = read_all(vec![sample("openai-batch.jsonl")], ReaderConfig::openai());
    assert_eq!(items.len(), 4);
    let req = |i: usize| match items[i].body.as_ref().unwrap() {
        RecordBody::OpenAi(r) => r.clone(),
        RecordBody::Fields(_) => panic!("not an OpenAI request"),
    };
    assert_eq!(items[0].id.as_deref(), Some("req-1"));
    assert_eq!(req(0).endpoint, OpenAiEndpoint::Chat);
    assert_eq!(req(0).messages.len(), 2);
    assert_eq!(req(0).max_tokens, Some(32));
    assert_eq!(req(1).messages[0].content, "Translate 'good morning' into Spanish.");
    assert_eq!(req(2).endpoint, OpenAiEndpoint::Completion);
    assert_eq!(req(2).prompt, "The capital of Norway is");
    assert_eq!((req(3).temperature, req(3).seed), (Some(0.7), Some(7)));

    let line = openai_ok_row("req-1", OpenAiEndpoint::Chat, "smollm2", "Rhine, Danube, Seine.", "stop", 20, 6);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["custom_id"], "req-1");
    assert_eq!(v["error"], serde_json::Value::Null);
    assert_eq!(v["response"]["status_code"], 200);
    assert_eq!(v["response"]["body"]["choices"][0]["message"]["content"], "Rhine, Danube, Seine.");
    assert_eq!(v["response"]["body"]["usage"]["total_tokens"], 26);
    assert!(line.starts_with(r#"{"id":"batch_req_"#));
}

#[test]
fn openai_requests_with_options_dustoff_does_not_do_become_error_rows() {
    let d = tmpdir("oa-options");
    let p = d.join("in.jsonl");
    let msg = serde_json::json!([{"role": "user", "content": "Hi"}]);
    // (body options, the error kind, or none for a request that runs)
    let cases: Vec<(serde_json::Value, Option<ErrorKind>)> = vec![
        (
            serde_json::json!({"n": 1, "stop": [], "presence_penalty": 0, "logit_bias": {}, "logprobs": false,
            "response_format": {"type": "text"}, "temperature": 2.0, "top_p": 1}),
            None,
        ),
        (serde_json::json!({"n": 2}), Some(ErrorKind::Unsupported)),
        (serde_json::json!({"stop": ["\n"]}), Some(ErrorKind::Unsupported)),
        (serde_json::json!({"frequency_penalty": 0.5}), Some(ErrorKind::Unsupported)),
        (serde_json::json!({"tools": [{"type": "function"}]}), Some(ErrorKind::Unsupported)),
        (serde_json::json!({"response_format": {"type": "json_object"}}), Some(ErrorKind::Unsupported)),
        (serde_json::json!({"temperature": -1}), Some(ErrorKind::WrongType)),
        (serde_json::json!({"top_p": 0}), Some(ErrorKind::WrongType)),
        (serde_json::json!({"messages": [{"role": "wizard", "content": "Hi"}]}), Some(ErrorKind::WrongType)),
    ];
    let lines: String = cases
        .iter()
        .enumerate()
        .map(|(i, (opts, _))| {
            let mut body = serde_json::json!({"model": "m", "messages": msg});
            body.as_object_mut().unwrap().extend(opts.as_object().unwrap().clone());
            let line = serde_json::json!({"custom_id": format!("r{i}"), "method": "POST",
                "url": "/v1/chat/completions", "body": body});
            format!("{line}\n")
        })
        .collect();
    fs::write(&p, lines).unwrap();
    let items = read_all(vec![p], ReaderConfig::openai());
    let got: Vec<Option<ErrorKind>> = items.iter().map(kind).collect();
    assert_eq!(got, cases.iter().map(|c| c.1).collect::<Vec<_>>());
    let unsupported = items[2].body.as_ref().unwrap_err().to_string();
    assert!(unsupported.contains("body.stop") && unsupported.contains("not supported"), "{unsupported}");
}

#[test]
fn a_job_reads_its_inputs_as_they_were_when_its_identity_was_taken() {
    let d = tmpdir("limits");
    let p = d.join("in.jsonl");
    fs::write(&p, "{\"id\":\"a\",\"text\":\"one\"}\n{\"id\":\"b\",\"text\":\"two\"}\n").unwrap();
    let size = file_identity(&p).unwrap().size;
    // Appended after the identity (a writer still at work on the archive).
    let mut f = fs::OpenOptions::new().append(true).open(&p).unwrap();
    std::io::Write::write_all(&mut f, b"{\"id\":\"c\",\"text\":\"three\"}\n").unwrap();
    let cfg = ReaderConfig::new("id", &["text"]);
    let ids = |items: Vec<Item>| items.into_iter().map(|i| i.id.unwrap()).collect::<Vec<_>>();
    let limited = RecordReader::new(vec![p.clone()], cfg.clone()).with_byte_limits(vec![size]);
    assert_eq!(ids(limited.collect::<Result<Vec<_>, _>>().unwrap()), ["a", "b"]);
    assert_eq!(ids(read_all(vec![p], cfg)), ["a", "b", "c"]);
}

#[test]
fn parquet_output_reads_back_to_the_same_rows() {
    let d = tmpdir("pqrows");
    for json_output in [false, true] {
        let out = if json_output {
            RowOutput::Json(serde_json::json!({"people": ["Ada"], "places": []}))
        } else {
            RowOutput::Text("A summary.".into())
        };
        let rows = vec![
            ok_row("a", &out, "stop", 12, 3, false),
            error_row(Some("b"), 2, &RecordError::new(ErrorKind::EmptyDocument, "document field 'text' is empty")),
            error_row(None, 3, &RecordError::new(ErrorKind::MalformedJson, "x line 3: EOF")),
            ok_row("d", &out, "length", 7, 64, true),
        ];
        let p = d.join(format!("out-{json_output}.parquet"));
        let mut w = RowWriter::create(&p, json_output).unwrap();
        for r in &rows {
            w.write_row(r).unwrap();
        }
        assert_eq!(w.finish().unwrap(), 4);
        let back: Vec<String> = RowLines::open(&p).unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(back, rows);
    }
}

fn fingerprint(shard: Option<ShardSpec>, pipeline: &str) -> JobFingerprint {
    JobFingerprint {
        model: file_identity(&root().join("samples/models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap(),
        pipeline: pipeline.to_string(),
        params: "{}".into(),
        inputs: vec![file_identity(&sample("news.jsonl")).unwrap(), file_identity(&sample("bad.jsonl")).unwrap()],
        shard,
        base: None,
    }
}

/// The rows of the sample inputs as a job would write them (deterministic plain data).
fn sample_rows(shard: Option<ShardSpec>) -> Vec<PendingRow> {
    let mut cfg = ReaderConfig::new("id", &["text"]);
    cfg.shard = shard;
    read_all(vec![sample("news.jsonl"), sample("bad.jsonl")], cfg)
        .into_iter()
        .map(|it| match &it.body {
            Ok(_) => {
                let id = it.id.clone().unwrap();
                let out = RowOutput::Text(format!("summary of {id}"));
                PendingRow {
                    index: it.index,
                    line: ok_row(&id, &out, "stop", 40 + it.index as u32, 9, false),
                    is_error: false,
                }
            }
            Err(e) => PendingRow { index: it.index, line: error_row(it.id.as_deref(), it.line, e), is_error: true },
        })
        .collect()
}

/// Commits `rows` in batches of `batch` in a scrambled order (as slots finish out of order).
fn commit_scrambled(ck: &mut Checkpoint, rows: &[PendingRow], batch: usize) {
    let mut rows: Vec<PendingRow> = rows.iter().filter(|r| !ck.is_done(r.index)).cloned().collect();
    rows.reverse();
    let third = rows.len() / 3;
    rows.rotate_left(third);
    for b in rows.chunks(batch) {
        ck.commit(b.to_vec()).unwrap();
    }
}

#[test]
fn resume_after_crash_is_byte_identical() {
    let rows = sample_rows(None);
    assert_eq!(rows.len(), 24);
    for ext in ["jsonl", "parquet"] {
        let d = tmpdir(&format!("resume-{ext}"));
        let fp = fingerprint(None, "p1");
        let whole = d.join(format!("whole.{ext}"));
        let mut ck = Checkpoint::open(&whole, &fp, false).unwrap();
        commit_scrambled(&mut ck, &rows, 5);
        ck.finish(&whole, rows.len() as u64, false).unwrap().1.remove().unwrap();
        assert!(!checkpoint_dir(&whole).exists());

        for crash_after in [0usize, 1, 3, 4] {
            let out = d.join(format!("resumed-{crash_after}.{ext}"));
            let mut ck = Checkpoint::open(&out, &fp, false).unwrap();
            let mut first: Vec<PendingRow> = rows.iter().rev().cloned().collect();
            first.truncate(crash_after * 5);
            for b in first.chunks(5) {
                ck.commit(b.to_vec()).unwrap();
            }
            drop(ck); // kill -9: nothing is finished or cleaned up
            let dir = checkpoint_dir(&out);
            // A part written but never journaled, and a torn journal line.
            fs::write(dir.join("part-999999.tsv"), "0\t{\"id\":\"zzz\"}\n").unwrap();
            let mut j = fs::OpenOptions::new().append(true).open(dir.join("journal.jsonl")).unwrap();
            std::io::Write::write_all(&mut j, b"{\"part\":\"part-0000").unwrap();
            drop(j);

            let mut ck = Checkpoint::open(&out, &fp, false).unwrap();
            assert_eq!(ck.resumed_rows(), (crash_after * 5) as u64);
            assert_eq!(ck.committed_errors(), first.iter().filter(|r| r.is_error).count() as u64);
            for r in &first {
                assert!(ck.is_done(r.index));
            }
            assert!(!dir.join("part-999999.tsv").exists());
            commit_scrambled(&mut ck, &rows, 7);
            ck.finish(&out, rows.len() as u64, false).unwrap().1.remove().unwrap();
            assert_eq!(fs::read(&out).unwrap(), fs::read(&whole).unwrap(), "{ext} crash after {crash_after} batches");
        }
        if ext == "jsonl" {
            // The final output is in input order.
            let text = fs::read_to_string(&whole).unwrap();
            let want: Vec<&str> = rows.iter().map(|r| r.line.as_str()).collect();
            assert_eq!(text.lines().collect::<Vec<_>>(), want);
        }
    }
}

/// A finished job's checkpoint goes in one rename: a kill while its files are deleted leaves
/// the renamed directory only (the checkpoint is whole or gone), and the next open removes it.
#[test]
fn checkpoint_removal_is_whole_or_nothing() {
    let rows = sample_rows(None);
    let d = tmpdir("discard");
    let fp = fingerprint(None, "p1");
    let out = d.join("out.jsonl");
    let mut ck = Checkpoint::open(&out, &fp, false).unwrap();
    commit_scrambled(&mut ck, &rows, 6);
    let old = discard_dir(&checkpoint_dir(&out));
    ck.finish(&out, rows.len() as u64, false).unwrap().1.remove().unwrap();
    assert!(out.exists() && !checkpoint_dir(&out).exists() && !old.exists());
    // The state a kill in the middle of the deletion leaves: part of the renamed directory.
    fs::create_dir_all(&old).unwrap();
    fs::write(old.join("journal.jsonl"), "{\"part\":\"part-000001.tsv\",\"first\":0,\"rows\":6,\"errors\":0}\n")
        .unwrap();
    let ck = Checkpoint::open(&out, &fp, false).unwrap();
    assert_eq!(ck.committed_rows(), 0, "the old journal is not read as this checkpoint's");
    assert!(!old.exists(), "the leftover of the interrupted deletion is removed");
    drop(ck);
    // --restart goes the same way.
    let mut ck = Checkpoint::open(&out, &fp, false).unwrap();
    ck.commit(rows[..4].to_vec()).unwrap();
    drop(ck);
    let ck = Checkpoint::open(&out, &fp, true).unwrap();
    assert_eq!(ck.committed_rows(), 0);
    assert!(!old.exists());
    // The renamed directory is one of the output's own paths (an input there is refused).
    assert!(dustoff::job::outputs::owned_paths(&out).contains(&old));
}

/// What a kill during a finished checkpoint's removal leaves (`.dustoff.old` holding only its
/// finished marker) reads as the job complete: every record done, the output kept, the leftover
/// removed. Another job's marker, or one whose output is gone, is a leftover only.
#[test]
fn a_finished_marker_left_by_a_kill_reads_as_the_job_complete() {
    let rows = sample_rows(None);
    let n = rows.len() as u64;
    let d = tmpdir("finished-marker");
    let fp = fingerprint(None, "p1");
    let out = d.join("out.jsonl");
    let mut ck = Checkpoint::open(&out, &fp, false).unwrap();
    commit_scrambled(&mut ck, &rows, 6);
    let errors = ck.committed_errors();
    assert!(errors > 0, "the sample has error rows, which the marker must carry");
    ck.finish(&out, n, false).unwrap().1.remove().unwrap();
    let want = fs::read(&out).unwrap();
    let (dir, old) = (checkpoint_dir(&out), discard_dir(&checkpoint_dir(&out)));
    let leave_marker = |digest: String| {
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&old).unwrap();
        let m = serde_json::json!({"format_version": CHECKPOINT_FORMAT_VERSION, "digest": digest, "rows": n, "errors": errors});
        fs::write(old.join("finished.json"), m.to_string()).unwrap();
    };

    leave_marker(fp.digest());
    let mut ck = Checkpoint::open(&out, &fp, false).unwrap();
    assert_eq!((ck.resumed_rows(), ck.committed_errors()), (n, errors));
    assert!(rows.iter().all(|r| ck.is_done(r.index)));
    assert!(ck.commit(rows[..1].to_vec()).is_err(), "a complete job takes no commit");
    ck.finish(&out, n, false).unwrap().1.remove().unwrap();
    assert_eq!(fs::read(&out).unwrap(), want, "the output is kept");
    assert!(!old.exists() && !dir.exists());

    leave_marker(fingerprint(None, "p2").digest());
    let ck = Checkpoint::open(&out, &fp, false).unwrap();
    assert_eq!(ck.resumed_rows(), 0, "another job's marker");
    assert!(!old.exists());
    drop(ck);
    leave_marker(fp.digest());
    fs::remove_file(&out).unwrap();
    let ck = Checkpoint::open(&out, &fp, false).unwrap();
    assert_eq!(ck.resumed_rows(), 0, "a marker whose output is gone");
    assert!(!old.exists());
    drop(ck);
    fs::write(&out, &want).unwrap();
    leave_marker(fp.digest());
    let ck = Checkpoint::open(&out, &fp, true).unwrap();
    assert_eq!(ck.resumed_rows(), 0, "--restart discards the marker with the rest");
    assert!(!old.exists());
}

#[test]
fn checkpoint_refuses_another_job_and_unknown_versions() {
    let d = tmpdir("fp");
    let out = d.join("out.jsonl");
    let rows = sample_rows(None);
    let mut ck = Checkpoint::open(&out, &fingerprint(None, "p1"), false).unwrap();
    ck.commit(rows[..4].to_vec()).unwrap();
    drop(ck);
    let err = Checkpoint::open(&out, &fingerprint(None, "p2"), false).err().unwrap();
    assert!(matches!(err, CheckpointError::Mismatch { .. }));
    let msg = err.to_string();
    assert!(msg.contains("the pipeline file") && msg.contains("--restart"), "{msg}");
    // Committing a record twice is refused.
    let mut ck = Checkpoint::open(&out, &fingerprint(None, "p1"), false).unwrap();
    assert!(ck.commit(rows[3..5].to_vec()).is_err());
    // Incomplete jobs cannot be assembled.
    assert!(matches!(ck.finish(&out, 24, false), Err(CheckpointError::Incomplete { expected: 24, committed: 4 })));
    // --restart discards the old checkpoint.
    let ck = Checkpoint::open(&out, &fingerprint(None, "p2"), true).unwrap();
    assert_eq!(ck.committed_rows(), 0);
    drop(ck);
    let job = checkpoint_dir(&out).join("job.json");
    let text = fs::read_to_string(&job).unwrap().replace("\"format_version\": 1", "\"format_version\": 99");
    fs::write(&job, text).unwrap();
    let err = Checkpoint::open(&out, &fingerprint(None, "p2"), false).err().unwrap();
    assert!(matches!(err, CheckpointError::Version { found: 99, .. }), "{err}");
}

#[test]
fn three_shards_merge_to_the_unsharded_output() {
    for ext in ["jsonl", "parquet"] {
        let d = tmpdir(&format!("shards-{ext}"));
        let whole = d.join(format!("whole.{ext}"));
        let rows = sample_rows(None);
        let mut ck = Checkpoint::open(&whole, &fingerprint(None, "p1"), false).unwrap();
        commit_scrambled(&mut ck, &rows, 4);
        ck.finish(&whole, rows.len() as u64, false).unwrap().1.remove().unwrap();

        let mut outs = Vec::new();
        let mut total = 0;
        for k in 0..3 {
            let shard = ShardSpec { index: k, count: 3 };
            let rows = sample_rows(Some(shard));
            total += rows.len();
            let out = d.join(format!("shard-{k}.{ext}"));
            let mut ck = Checkpoint::open(&out, &fingerprint(Some(shard), "p1"), false).unwrap();
            commit_scrambled(&mut ck, &rows, 3);
            ck.finish(&out, rows.len() as u64, false).unwrap().1.remove().unwrap();
            assert!(order_path(&out).exists());
            outs.push(out);
        }
        assert_eq!(total, 24);
        let merged = d.join(format!("merged.{ext}"));
        // Any order of shard arguments.
        let args = vec![outs[2].clone(), outs[0].clone(), outs[1].clone()];
        let s = merge(&args, &merged).unwrap();
        assert_eq!((s.shards, s.rows), (3, 24));
        assert_eq!(fs::read(&merged).unwrap(), fs::read(&whole).unwrap(), "{ext}");

        let e = merge(&outs[..2], &merged).unwrap_err().to_string();
        assert!(e.contains("missing shard 2/3"), "{e}");
        let e = merge(&[outs[0].clone(), outs[0].clone()], &merged).unwrap_err().to_string();
        assert!(e.contains("given twice"), "{e}");
        let e = merge(std::slice::from_ref(&whole), &merged).unwrap_err().to_string();
        assert!(e.contains("--shard"), "{e}");
    }
}

#[test]
fn shipped_pipelines_load_and_render() {
    let dir = root().join("pipelines");
    let s = Pipeline::resolve("summarize", &dir).unwrap();
    let e = Pipeline::resolve("extract-entities", &dir).unwrap();
    use dustoff::engine::finish::FinishReason::{Length, Stop};
    assert_eq!(s.spec.input.id_field, "id");
    assert_eq!(s.document_field(), "text");
    assert_eq!(s.spec.limits.overflow, Overflow::TruncateTail);
    let mut f = serde_json::Map::new();
    f.insert("text".into(), "Storm closes the port.".into());
    let text = e.render_record("n1", &f).unwrap();
    assert_eq!(text, "Text: Storm closes the port.");
    let m = e.messages(&text);
    assert_eq!(m[0].role, "system");
    assert!(m[1].content.starts_with("List the people") && m[1].content.ends_with("Text: Storm closes the port."));
    // Prompts of different records share the system + instruction prefix.
    let a = s.prompt_ids(&ByteCodec, "a", &f).unwrap().ids;
    f.insert("text".into(), "A different document.".into());
    let b = s.prompt_ids(&ByteCodec, "b", &f).unwrap().ids;
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared > 100, "{shared}");
    // Seeds are per record, stable.
    assert_eq!(s.sampling("a"), s.sampling("a"));
    assert_ne!(s.sampling("a").seed, s.sampling("b").seed);
    // JSON outputs.
    assert!(matches!(
        e.parse_output("```json\n{\"people\":[],\"organizations\":[],\"places\":[\"Oslo\"]}\n```", Stop),
        Ok(RowOutput::Json(_))
    ));
    // The schema (pipelines/entities.schema.json) is checked: a missing key, a non-string name.
    assert_eq!(e.parse_output("{\"people\": []}", Stop).unwrap_err().kind, ErrorKind::OutputMismatch);
    let bad = "{\"people\": [7], \"organizations\": [], \"places\": []}";
    assert_eq!(e.parse_output(bad, Stop).unwrap_err().kind, ErrorKind::OutputMismatch);
    assert_eq!(e.parse_output("{\"people\": [\"Ann", Length).unwrap_err().kind, ErrorKind::Truncated);
    assert_eq!(parse_json_output("Sure! Here you go", &[]).unwrap_err().kind, ErrorKind::OutputNotJson);
    assert_eq!(parse_json_output("[1,2]", &[]).unwrap_err().kind, ErrorKind::OutputNotJson);
}

#[test]
fn pipeline_validation_names_the_problem() {
    let p = Path::new("bad.toml");
    let cases = [
        ("name = \"x\"\n[prompt]\ntemplate = \"{{ body }}\"\n", "uses 'body'"),
        ("name = \"x\"\n[prompt]\ntemplate = \"{{ text \"\n", "does not compile"),
        ("name = \"x\"\n[prompt]\n[generation]\ntop_p = 0.0\n", "top_p"),
        ("name = \"x\"\n[prompt]\n[generation]\nmax_tokens = 0\n", "max_tokens"),
        ("name = \"x\"\n[prompt]\ncolour = \"red\"\n", "unknown field"),
        ("name = \"x\"\n[prompt]\n[limits]\noverflow = \"drop\"\n", "unknown variant"),
        ("name = \"x\"\n[prompt]\n[input]\ndocument_field = \"body\"\n", "document_field"),
        ("[prompt]\n", "missing field `name`"),
        // Neither a field nor the id: every record would get the same prompt.
        ("name = \"x\"\n[prompt]\ntemplate = \"Say hello.\"\n", "reads none of input.fields"),
    ];
    for (text, want) in cases {
        let e = Pipeline::from_toml(text, p).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("bad.toml"), "{want}: {e}");
    }
    assert!(Pipeline::resolve("no-such-pipeline", &root().join("pipelines")).is_err());
    // The id alone differs per record: accepted.
    Pipeline::from_toml("name = \"x\"\n[prompt]\ntemplate = \"A haiku about item {{ id }}.\"\n", p).unwrap();
}

#[test]
fn overflow_policies_fit_the_limit() {
    let base = "name = \"t\"\n[prompt]\nchat_template = false\ninstruction = \"Sum:\"\n[limits]\nmax_input_tokens = 40\nmarker = \" [...]\"\n";
    let mut f = serde_json::Map::new();
    f.insert("text".into(), "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ".into());
    let tail = Pipeline::from_toml(base, Path::new("t.toml")).unwrap();
    let r = tail.prompt_ids(&ByteCodec, "x", &f).unwrap();
    let text = ByteCodec.decode(&r.ids).unwrap();
    assert!(r.truncated && r.ids.len() <= 40, "{text}");
    assert!(text.starts_with("Sum:\n\n0123") && text.ends_with(" [...]"), "{text}");
    let head = Pipeline::from_toml(&format!("{base}overflow = \"truncate-head\"\n"), Path::new("t.toml")).unwrap();
    let r = head.prompt_ids(&ByteCodec, "x", &f).unwrap();
    let text = ByteCodec.decode(&r.ids).unwrap();
    assert!(r.ids.len() <= 40 && text.starts_with("Sum:\n\n[...]") && text.ends_with("GHIJ"), "{text}");
    let err = Pipeline::from_toml(&format!("{base}overflow = \"error\"\n"), Path::new("t.toml")).unwrap();
    assert_eq!(err.prompt_ids(&ByteCodec, "x", &f).unwrap_err().kind, ErrorKind::InputTooLong);
    f.insert("text".into(), "short".into());
    assert!(!tail.prompt_ids(&ByteCodec, "x", &f).unwrap().truncated);
}

#[test]
fn dry_run_counts_errors_and_prefix_savings() {
    let p = Pipeline::resolve("summarize", &root().join("pipelines")).unwrap();
    let job = JobKind::Pipeline(Box::new(p));
    // openai-batch.jsonl has no `id` fields: 4 missing-field rows.
    let names = ["bad.jsonl", "news.jsonl", "openai-batch.jsonl"];
    let inputs = expand_inputs(&names.map(|n| sample(n).display().to_string())).unwrap();
    let d = tmpdir("glob");
    for n in ["b.jsonl", "a.jsonl", "c.txt"] {
        fs::write(d.join(n), "").unwrap();
    }
    let globbed = expand_inputs(&[format!("{}/*.jsonl", d.display())]).unwrap();
    assert_eq!(globbed, vec![d.join("a.jsonl"), d.join("b.jsonl")]);
    assert!(expand_inputs(&[format!("{}/*.csv", d.display())]).is_err());
    let r = dustoff::job::dry_run::dry_run(&job, &inputs, None, &ByteCodec, 16).unwrap();
    assert_eq!(r.records, 12 + 12 + 4);
    assert_eq!(r.ok, 3 + 12);
    assert_eq!(r.errors_by_kind[&ErrorKind::MissingField], 2 + 4);
    // The shared system prompt + instruction (> 150 bytes) is computed once, not 15 times.
    assert!(r.prompt_tokens_uncached + 14 * 150 < r.prompt_tokens, "{r:?}");
    assert_eq!(InputFormat::from_path(Path::new("a.PARQUET")), InputFormat::Parquet);
    assert!(!StopFlag::new().is_set());
}

/// `--slots auto` sizes the KV pool from the job's first records: the sample stops at its count,
/// and a sequence's expected positions are its own prompt tokens (the shared prefix held once)
/// plus its max_tokens, in whole blocks plus one.
#[test]
fn the_sizing_sample_reads_the_first_records_and_counts_a_sequence_s_own_positions() {
    let p = Pipeline::resolve("summarize", &root().join("pipelines")).unwrap();
    let max_tokens = p.spec.generation.max_tokens as u64;
    let job = JobKind::Pipeline(Box::new(p));
    let inputs = vec![sample("news.jsonl")];
    let all = dustoff::job::dry_run::dry_run(&job, &inputs, None, &ByteCodec, 16).unwrap();
    let five = dustoff::job::dry_run::sample(&job, &inputs, None, &ByteCodec, 16, 5).unwrap();
    assert_eq!((all.records, five.records, five.ok), (12, 5, 5));
    let own = (five.prompt_tokens_uncached + 5 * max_tokens).div_ceil(5) as usize;
    let e = five.expected_positions(16).unwrap();
    assert!(e > own && e <= own + 32 && e.is_multiple_of(16), "{e} for {own}");
    // The shared instruction is counted once: fewer positions than the mean whole prompt.
    assert!((e as u64) < (five.prompt_tokens + 5 * max_tokens) / 5, "{e} {five:?}");
    let none = dustoff::job::dry_run::sample(&job, &inputs, None, &ByteCodec, 16, 0).unwrap();
    assert_eq!((none.records, none.expected_positions(16)), (0, None));
}

/// Dry-run speed over 100,000 short records (byte codec: measures the job machinery only).
/// `cargo test --release --test job_io dry_run_speed -- --ignored --nocapture`
#[test]
#[ignore]
fn dry_run_speed() {
    let d = tmpdir("speed");
    let p = d.join("big.jsonl");
    let mut s = String::new();
    for i in 0..100_000 {
        s += &format!(
            "{{\"id\":\"r{i}\",\"text\":\"Record {i}: the shipment to depot {} was delayed by weather.\"}}\n",
            i % 97
        );
    }
    fs::write(&p, s).unwrap();
    let job = JobKind::Pipeline(Box::new(Pipeline::resolve("summarize", &root().join("pipelines")).unwrap()));
    let r = dustoff::job::dry_run::dry_run(&job, &[p], None, &ByteCodec, 16).unwrap();
    assert_eq!(r.ok, 100_000);
    eprintln!("dry run: {} records in {:.2} s = {:.0} records/s", r.records, r.seconds, r.records_per_second());
}
