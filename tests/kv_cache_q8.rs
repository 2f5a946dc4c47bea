//! What the 8-bit KV cache (`--kv-cache q8`) costs on the sample model, measured as
//! `dustoff eval --model M --reference M --kv-cache q8` measures it: the same weights with the
//! full cache as reference, KL divergence and top-1 agreement over the built-in text; and the
//! command line refusing a type it does not know.

mod common;

use common::*;
use dustoff::backend::kv_type::KvType;
use dustoff::commands::eval::{self, EvalArgs};

#[test]
fn q8_kv_cache_stays_close_to_the_full_cache_on_the_sample_model() {
    let model = repo().join(dustoff::model::loader::SAMPLE_MODEL);
    let args = |kv| EvalArgs {
        models: vec![model.clone()],
        reference: Some(model.clone()),
        text: None,
        ctx: 128,
        max_tokens: 512,
        kv_type: kv,
        ..Default::default()
    };
    let q8 = eval::run(&args(KvType::Q8)).unwrap();
    print!("{}", q8.to_text());
    let s = &q8.models[0];
    let kl = s.kl_divergence.as_ref().unwrap();
    let top1 = s.top1_agreement.unwrap();
    // The cache is in effect (the logits moved) but close to the full one.
    assert!(kl.mean > 0.0 && kl.max > 0.0, "{kl:?}");
    assert!(kl.mean < 0.02 && top1 > 0.9, "mean KL {} top-1 {top1}", kl.mean);
    let full = eval::run(&args(KvType::F16)).unwrap();
    let f = &full.models[0];
    assert_eq!(f.kl_divergence.as_ref().unwrap().max, 0.0, "the same model and cache score as the reference");
    assert_eq!(f.top1_agreement, Some(1.0));
}

#[test]
fn an_unknown_kv_cache_type_is_a_usage_error() {
    let out = std::process::Command::new(bin())
        .args(["generate", "--prompt", "hi", "--device", "cpu", "--kv-cache", "q4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kv-cache 'q4': use f16, q8 or auto"), "{err}");
}

/// `run --dry-run` counts the KV cache's bytes per position in each type from the metadata:
/// SmolLM2-135M has 30 layers of 3 KV heads of 64, so K and V take 30 x 2 x 192 values a
/// position: 23,040 bytes in F16, 12,240 in 8 bits (192 int8 + 6 F16 scales each).
#[test]
fn dry_run_counts_the_kv_bytes_of_each_cache_type() {
    let dir = std::env::temp_dir().join(format!("dustoff-kvq8-dry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(bin())
        .args(["run", "summarize", "--dry-run", "--json", "--device", "cpu", "--input", "samples/news.jsonl"])
        .arg("--output")
        .arg(dir.join("out.jsonl"))
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kv = &report["kv_cache_bytes_per_position"];
    assert_eq!((kv["f16"].as_u64(), kv["q8"].as_u64()), (Some(23_040), Some(12_240)), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
