//! Compressed input (issue 31): gzip (also several concatenated members) and zstd JSONL and
//! OpenAI batch files read as their plain text; other compressed formats refused by their
//! magic number with a message naming the file (exit 2), never read as text.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use dustoff::job::reader::{ReaderConfig, RecordReader};

use common::*;

fn items(files: Vec<PathBuf>, cfg: ReaderConfig) -> Vec<dustoff::job::record::Item> {
    RecordReader::new(files, cfg).map(|i| i.unwrap()).collect()
}

/// `text` gzip-compressed as two members (what `cat a.gz b.gz` makes).
fn gzip_two_members(text: &[u8]) -> Vec<u8> {
    let cut = text.len() / 2;
    let mut out = Vec::new();
    for part in [&text[..cut], &text[cut..]] {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(part).unwrap();
        out.extend(e.finish().unwrap());
    }
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn gzip_and_zstd_jsonl_and_openai_batch_read_as_the_plain_files() {
    let d = tmpdir("compressed");
    for (sample, cfg) in [
        ("samples/news.jsonl", ReaderConfig::new("id", &["text"])),
        ("samples/bad.jsonl", ReaderConfig::new("id", &["text"])),
        ("samples/openai-batch.jsonl", ReaderConfig::openai()),
    ] {
        let plain = repo().join(sample);
        let text = std::fs::read(&plain).unwrap();
        let name = plain.file_name().unwrap().to_str().unwrap();
        let gz = write(&d, &format!("{name}.gz"), &gzip_two_members(&text));
        let zst = write(&d, &format!("{name}.zst"), &zstd::stream::encode_all(&text[..], 3).unwrap());
        let want = items(vec![plain.clone()], cfg.clone());
        assert!(!want.is_empty());
        for f in [gz, zst] {
            let mut got = items(vec![f.clone()], cfg.clone());
            assert_eq!(got.len(), want.len(), "{}", f.display());
            for (g, w) in got.iter_mut().zip(&want) {
                // Error messages name the file they were read from.
                if let Err(e) = &mut g.body {
                    e.message = e.message.replace(s(&f), s(&plain));
                }
                assert_eq!((&g.id, &g.body, g.line), (&w.id, &w.body, w.line), "{}", f.display());
            }
        }
    }
}

#[test]
fn a_run_reads_compressed_input_and_refuses_other_compressed_formats_by_name() {
    let d = tmpdir("compressed-run");
    let text = std::fs::read(repo().join("samples/news.jsonl")).unwrap();
    let gz = write(&d, "news.jsonl.gz", &gzip_two_members(&text));
    let out = d.join("out.jsonl");
    let o = dustoff_cmd(&["run", "summarize", "--input", s(&gz), "--output", s(&out), "--dry-run", "--json"], &[])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["records"].as_u64(), v["errors"].as_u64()), (Some(12), Some(0)), "{v}");

    for (name, head, format) in [
        ("a.jsonl.bz2", &b"BZh91AY&SY"[..], "bzip2"),
        ("b.jsonl.xz", &[0xfd, b'7', b'z', b'X', b'Z', 0x00, 0, 4][..], "xz"),
        ("c.zip", &b"PK\x03\x04\x14\x00"[..], "zip"),
    ] {
        let f = write(&d, name, head);
        let o = dustoff_cmd(&["run", "summarize", "--input", s(&f), "--output", s(&out), "--dry-run"], &[])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {e}");
        assert!(e.contains(name) && e.contains(format) && !e.contains("invalid_utf8"), "{name}: {e}");
    }
}
