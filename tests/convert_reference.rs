//! `dustoff convert` of the tiny reference models (`../shared/testdata/arch/<arch>/hf`, BF16)
//! against llama.cpp's converter output of the same weights (`<arch>-f16.gguf`): the same
//! tensors (names, shapes, types, values within F16 rounding) and the same metadata, then the
//! converted file through `dustoff generate` on the CPU against the transformers greedy tokens.
//! The official vision-language layout (nested `text_config`, `model.language_model.` prefix,
//! vision and MTP tensors, sharded, BF16 or F32) converts to the same file.

mod common;
#[path = "hybrid_refs/mod.rs"]
mod hybrid_refs;

use std::path::{Path, PathBuf};

use common::{bin, tmpdir};
use dustoff::model::gguf::{GgufFile, Value};
use dustoff::model::quant::{dequantize_row, GgmlType};
use hybrid_refs::{generate_cli, write_vision_language_layout, Fixture};

const QWEN35: Fixture = Fixture { dir: "qwen3_5", gguf: "qwen3_5-f16.gguf" };
const QWEN35_MOE: Fixture = Fixture { dir: "qwen3_5_moe", gguf: "qwen3_5_moe-f16.gguf" };
const QWEN3_NEXT: Fixture = Fixture { dir: "qwen3_next", gguf: "qwen3_next-f16.gguf" };
const QWEN3_MOE: Fixture = Fixture { dir: "qwen3_moe", gguf: "qwen3_moe-f16.gguf" };

/// Keys dustoff writes that llama.cpp's converter does not (harmless to llama.cpp, read by
/// dustoff): `general.alignment` (the default, explicit), `{arch}.vocab_size`,
/// `{arch}.expert_weights_norm`, and qwen3moe's `rope.dimension_count` (the head size).
fn extra_key_allowed(k: &str, arch: &str) -> bool {
    k == "general.alignment"
        || k == format!("{arch}.vocab_size")
        || k == format!("{arch}.expert_weights_norm")
        || (arch == "qwen3moe" && k == "qwen3moe.rope.dimension_count")
}

/// Runs `dustoff convert --model model --output out`, returning stderr.
fn convert(model: &Path, out: &Path) -> String {
    let o = std::process::Command::new(bin())
        .args(["convert", "--model"])
        .arg(model)
        .arg("--output")
        .arg(out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "convert {}: {err}", model.display());
    err
}

fn values(g: &GgufFile, name: &str) -> (GgmlType, Vec<f32>) {
    let info = g.require_tensor(name).unwrap();
    let mut v = vec![0f32; info.n_elements() as usize];
    dequantize_row(info.dtype, g.tensor_data(info), &mut v);
    (info.dtype, v)
}

/// Ours against llama.cpp's file: every tensor and every metadata key that matters.
fn matches_reference(ours: &Path, reference: &Path) {
    let (a, r) = (GgufFile::open(ours).unwrap(), GgufFile::open(reference).unwrap());
    let arch = r.get_str("general.architecture").unwrap().unwrap().to_string();
    let names = |g: &GgufFile| g.tensors.iter().map(|t| t.name.clone()).collect::<std::collections::BTreeSet<_>>();
    assert_eq!(names(&a), names(&r), "{arch}: tensor names");
    let mut identical = 0;
    for t in &r.tensors {
        let mine = a.tensor_info(&t.name).unwrap();
        assert_eq!(mine.dims, t.dims, "{arch}: dims of {}", t.name);
        let ((ty_a, va), (ty_r, vr)) = (values(&a, &t.name), values(&r, &t.name));
        assert_eq!(ty_a, ty_r, "{arch}: type of {}", t.name);
        // Within one F16 rounding step of the reference (relative 2^-11, subnormals 2^-24).
        for (i, (x, y)) in va.iter().zip(&vr).enumerate() {
            let tol = y.abs().max(x.abs()) * 2f32.powi(-11) + 6e-8;
            assert!((x - y).abs() <= tol, "{arch}: {}[{i}] = {x}, llama.cpp {y}", t.name);
        }
        identical += usize::from(a.tensor_data(mine) == r.tensor_data(t));
    }
    println!("{arch}: {identical} of {} tensors bit-identical to llama.cpp's", r.tensors.len());
    for k in &r.metadata_order {
        if matches!(k.as_str(), "general.name" | "general.size_label") {
            continue;
        }
        assert_eq!(a.get(k), r.get(k), "{arch}: metadata '{k}'");
    }
    for k in &a.metadata_order {
        assert!(r.get(k).is_some() || extra_key_allowed(k, &arch), "{arch}: key '{k}' is not llama.cpp's");
    }
}

/// Converts the fixture's HF directory, compares with llama.cpp's file and runs `generate`.
fn converts_like_llama_cpp(f: &Fixture) -> PathBuf {
    let dir = tmpdir(&format!("convert-ref-{}", f.dir));
    let out = dir.join(format!("{}.gguf", f.dir));
    convert(&f.hf_path(), &out);
    assert!(dir.join(format!("{}.gguf.report.json", f.dir)).is_file(), "the report follows the output's name");
    matches_reference(&out, &f.gguf_path());
    generate_cli(bin(), &out, &f.refs(), &dir, "converted");
    out
}

/// Two GGUF files with the same tensors (bytes) and metadata, `general.name` aside.
fn same_file(a: &Path, b: &Path) {
    let (a, b) = (GgufFile::open(a).unwrap(), GgufFile::open(b).unwrap());
    assert_eq!(a.metadata_order, b.metadata_order);
    for k in a.metadata_order.iter().filter(|k| *k != "general.name") {
        assert_eq!(a.get(k), b.get(k), "metadata '{k}'");
    }
    assert_eq!(a.tensors.len(), b.tensors.len());
    for (x, y) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!((&x.name, &x.dims, x.dtype), (&y.name, &y.dims, y.dtype));
        assert!(a.tensor_data(x) == b.tensor_data(y), "tensor {}", x.name);
    }
}

/// The vision-language layout of `f` (`as_f32`: stored F32), converted: the same file as the
/// flat directory's conversion `flat`; the vision and MTP tensors are skipped and counted.
fn vision_language_converts_alike(f: &Fixture, class: &str, model_type: &str, as_f32: bool, flat: &Path) {
    let dir = tmpdir(&format!("convert-vl-{}-{as_f32}", f.dir));
    let src = dir.join("vl");
    std::fs::create_dir_all(&src).unwrap();
    let extras = ["model.visual.blocks.0.attn.qkv.weight", "mtp.fc.weight", "mtp.layers.0.input_layernorm.weight"];
    write_vision_language_layout(f, &src, &extras, 2, class, model_type, as_f32);
    assert!(src.join("model.safetensors.index.json").is_file(), "a sharded checkpoint");
    let out = dir.join("vl.gguf");
    let err = convert(&src, &out);
    assert!(err.contains("skipped 1 vision-tower tensors (model.visual.*) and 2 multi-token-prediction"), "{err}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("vl.gguf.report.json")).unwrap()).unwrap();
    assert_eq!(report["skipped"], serde_json::json!({"vision_tower": 1, "mtp": 2}));
    same_file(&out, flat);
}

#[test]
fn qwen35_converts_like_llama_cpp_and_its_vision_language_layout_too() {
    let flat = converts_like_llama_cpp(&QWEN35);
    vision_language_converts_alike(&QWEN35, "Qwen3_5ForConditionalGeneration", "qwen3_5", false, &flat);
}

#[test]
fn qwen35_moe_converts_like_llama_cpp_and_its_vision_language_layout_too() {
    let flat = converts_like_llama_cpp(&QWEN35_MOE);
    vision_language_converts_alike(&QWEN35_MOE, "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", true, &flat);
}

#[test]
fn qwen3_next_converts_like_llama_cpp() {
    converts_like_llama_cpp(&QWEN3_NEXT);
}

#[test]
fn qwen3_moe_converts_like_llama_cpp() {
    converts_like_llama_cpp(&QWEN3_MOE);
}

/// The key types llama.cpp's loader reads for the hybrids: sections I32, recurrent layers bool.
#[test]
fn hybrid_array_keys_have_llama_cpp_element_types() {
    let dir = tmpdir("convert-ref-keys");
    let out = dir.join("m.gguf");
    convert(&QWEN35.hf_path(), &out);
    let g = GgufFile::open(&out).unwrap();
    match g.get("qwen35.rope.dimension_sections") {
        Some(Value::Array(v)) => assert_eq!(v, &[Value::I32(3), Value::I32(3), Value::I32(2), Value::I32(0)]),
        other => panic!("rope.dimension_sections: {other:?}"),
    }
    match g.get("qwen35.attention.recurrent_layers") {
        Some(Value::Array(v)) => assert!(v.iter().all(|x| matches!(x, Value::Bool(_))) && v.len() == 6),
        other => panic!("recurrent_layers: {other:?}"),
    }
}

/// An architecture dustoff does not run is refused before anything is written, with exit
/// code 2, by both commands; the message names it and lists the supported classes.
#[test]
fn an_unsupported_architecture_exits_2() {
    let dir = tmpdir("convert-ref-unsupported");
    let src = dir.join("gpt2");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("config.json"), r#"{"architectures": ["GPT2LMHeadModel"], "hidden_size": 8}"#).unwrap();
    for cmd in ["convert", "quantize"] {
        let out = dir.join(format!("{cmd}.gguf"));
        let o = std::process::Command::new(bin())
            .args([cmd, "--model"])
            .arg(&src)
            .arg("--output")
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {err}");
        assert!(err.contains("architecture GPT2LMHeadModel is not supported"), "{cmd}: {err}");
        assert!(err.contains("Qwen3_5MoeForConditionalGeneration"), "{cmd}: {err}");
        assert!(!out.exists(), "{cmd}");
    }
}
