//! Rows that say how good they are (issue 31, item 5): the real binary, the sample model, the
//! CPU backend, 12 news records and a few generated tokens.
//! - every ok row carries `input_truncated` (its prompt was cut to `limits.max_input_tokens`)
//!   and `empty_output` (the answer is empty or whitespace), in JSONL and Parquet alike;
//! - the end summary and the report count finish reasons and flags over the output;
//! - a generation cut inside a multi-byte character ends before it, not in U+FFFD (the real
//!   tokenizer, through the codec the job loop decodes with).

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use common::*;

const NEWS: &str = "samples/news.jsonl";

/// summarize with `max_tokens`, `max_input_tokens` and, when given, an `[output]` section.
fn pipeline(dir: &Path, name: &str, max_tokens: u32, max_input: u32, output: Option<&str>) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("pipelines/summarize.toml")).unwrap();
    assert!(text.contains("max_tokens = 64") && text.contains("max_input_tokens = 1024"), "summarize.toml changed");
    let mut text = text
        .replace("max_tokens = 64", &format!("max_tokens = {max_tokens}"))
        .replace("max_input_tokens = 1024", &format!("max_input_tokens = {max_input}"));
    if let Some(o) = output {
        text = text.replace("[output]\nkind = \"text\"", &format!("[output]\n{o}"));
        assert!(text.contains(o), "summarize.toml's [output] changed");
    }
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

fn run(pipeline: &Path, output: &Path) -> Output {
    let a = ["run", s(pipeline), "--input", NEWS, "--output", s(output), "--device", "cpu", "--quiet"];
    let o = dustoff_cmd(&a, &[]).output().expect("start dustoff");
    assert_eq!(o.status.code(), Some(0), "stderr:\n{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn report(output: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(with_suffix(output, ".report.json")).unwrap()).unwrap()
}

#[test]
fn truncated_inputs_are_flagged_and_finish_reasons_counted_in_jsonl_and_parquet() {
    let d = tmpdir("row-flags");
    // The 12 prompts take 81 to 97 tokens in full: at 88, six are cut and six are not.
    let p = pipeline(&d, "cut88", 4, 88, None);
    let out = d.join("rows.jsonl");
    let o = run(&p, &out);
    let rows = read_jsonl(&out);
    assert_eq!(rows.len(), 12);
    let cut: Vec<&Value> = rows.iter().filter(|r| r["input_truncated"] == true).collect();
    let whole: Vec<&Value> = rows.iter().filter(|r| r["input_truncated"] == false).collect();
    assert_eq!(cut.len() + whole.len(), 12, "every row has the flag: {rows:?}");
    assert!(!cut.is_empty() && !whole.is_empty(), "the limit splits the records: {rows:?}");
    // A cut prompt fills the limit; one that was not cut is within it.
    assert!(cut.iter().all(|r| r["prompt_tokens"].as_u64().unwrap() <= 88), "{cut:?}");
    assert!(whole.iter().all(|r| r["prompt_tokens"].as_u64().unwrap() <= 88), "{whole:?}");
    assert!(rows.iter().all(|r| r["empty_output"] == false), "4 tokens of a summary are text: {rows:?}");
    let length = rows.iter().filter(|r| r["finish_reason"] == "length").count();
    let e = String::from_utf8_lossy(&o.stderr);
    let want = format!("finish: {length} of 12 rows stopped at max_tokens (\"length\")");
    assert!(e.contains(&want), "want {want:?} in:\n{e}");
    assert!(e.contains(&format!("flags: {} rows with input_truncated", cut.len())), "{e}");
    assert!(e.contains("0 with empty_output"), "{e}");
    let rep = report(&out);
    assert_eq!(rep["rows"]["finish_reasons"]["length"], length as u64, "{rep}");
    assert_eq!(rep["rows"]["input_truncated"], cut.len() as u64, "{rep}");
    assert_eq!(rep["rows"]["rows"], 12, "{rep}");

    // Parquet: the same flags as columns (the same job: the rows are greedy, so identical).
    let pq = d.join("rows.parquet");
    run(&p, &pq);
    let f = std::fs::File::open(&pq).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap().build().unwrap();
    let mut flags = Vec::new();
    for b in reader {
        use arrow::array::AsArray;
        let b = b.unwrap();
        let col = |n: &str| b.column_by_name(n).unwrap_or_else(|| panic!("no column {n}")).as_boolean().clone();
        let (t, e) = (col("input_truncated"), col("empty_output"));
        flags.extend((0..b.num_rows()).map(|i| (t.value(i), e.value(i))));
    }
    let want: Vec<(bool, bool)> =
        rows.iter().map(|r| (r["input_truncated"] == true, r["empty_output"] == true)).collect();
    assert_eq!(flags, want, "Parquet columns match the JSONL rows");
}

#[test]
fn empty_answers_are_flagged_and_counted() {
    let d = tmpdir("row-empty");
    // The answer may only be a space or nothing: whatever the model picks is empty.
    let p = pipeline(&d, "empty", 4, 1024, Some("kind = \"regex\"\npattern = \" ?\""));
    let out = d.join("rows.jsonl");
    let o = run(&p, &out);
    let rows = read_jsonl(&out);
    assert_eq!(rows.len(), 12);
    for r in &rows {
        assert!(r["error"].is_null(), "an empty answer is still an ok row: {r}");
        assert_eq!(r["empty_output"], true, "{r}");
        assert_eq!(r["input_truncated"], false, "{r}");
    }
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("12 with empty_output"), "{e}");
    assert!(e.contains("0 rows with input_truncated"), "{e}");
    let stop = rows.iter().filter(|r| r["finish_reason"] == "stop").count();
    assert_eq!(report(&out)["rows"]["empty_output"], 12);
    assert_eq!(report(&out)["rows"]["finish_reasons"]["stop"], stop as u64);
}

#[test]
fn a_generation_cut_inside_a_character_drops_the_partial_bytes() {
    use dustoff::job::adapters::TokenizerCodec;
    use dustoff::job::pipeline::TextCodec;
    let m = sample_model();
    let tok = &m.tokenizer;
    let codec = TokenizerCodec(tok);
    // CJK and emoji take several byte tokens each in this vocabulary.
    for (head, last) in [("今天天气很", "好"), ("Pizza night", "🍕")] {
        // A model may generate any token sequence: the head's tokens, then the last character's.
        let head_ids = tok.encode(head, false, true).unwrap();
        let ids = [head_ids.clone(), tok.encode(last, false, true).unwrap()].concat();
        assert!(ids.len() >= head_ids.len() + 2, "{last:?} must take several tokens: {ids:?}");
        for cut in head_ids.len() + 1..ids.len() {
            let plain = codec.decode(&ids[..cut]).unwrap();
            assert!(plain.ends_with('\u{FFFD}'), "a plain decode replaces the partial character: {plain:?}");
            assert_eq!(codec.decode_generated(&ids[..cut]).unwrap(), head, "cut after {cut} tokens");
            // Streaming (generate --prompt) gives the same text.
            let mut sd = dustoff::tokenizer::StreamDecoder::new(tok);
            let mut streamed: String = ids[..cut].iter().map(|&i| sd.push(i).unwrap()).collect();
            streamed += &sd.finish().unwrap();
            assert_eq!(streamed, head);
        }
        assert_eq!(codec.decode_generated(&ids).unwrap(), format!("{head}{last}"));
    }
}
