//! The reference checks shared by the hybrid-architecture tests (`arch_qwen35`,
//! `arch_qwen35_moe`, `arch_qwen3_next`): a tiny random model of `../shared/testdata/arch/<arch>/` (HF directory
//! and llama.cpp's F16 GGUF) against the transformers float32 outputs in its `refs.jsonl`.
//!
//! Tolerances follow the data's README: argmax equal wherever the reference margin is >= 0.02
//! (smaller ones are near-ties), logits within 2e-3 absolute (they reach about +-30), all 32
//! greedy tokens equal (smallest greedy margin 0.05; 0.06 for qwen3_5). MoE routing is not compared directly:
//! every expert choice in these prompts has a router gap >= 3e-4, so a wrong choice would show
//! in the logits.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dustoff::backend::cpu::CpuBackend;
use dustoff::engine::batch::{Completion, Engine, EngineConfig, EngineMetrics, Request};
use dustoff::engine::sampler::{argmax, SamplingParams};
use dustoff::engine::single::SingleSeq;
use dustoff::model::loader::{load_model, LoadedModel};

pub use crate::common::{arch_dir, floats, ids, max_abs_diff};

pub const NEAR_TIE: f64 = 0.02;
pub const LOGIT_TOL: f64 = 2e-3;

/// One architecture's fixture: `../shared/testdata/arch/<dir>/` with its HF directory `hf/`
/// and llama.cpp's F16 GGUF `<gguf>` of the same weights.
pub struct Fixture {
    pub dir: &'static str,
    pub gguf: &'static str,
}

impl Fixture {
    pub fn data_dir(&self) -> PathBuf {
        arch_dir(self.dir)
    }
    pub fn hf_path(&self) -> PathBuf {
        self.data_dir().join("hf")
    }
    pub fn gguf_path(&self) -> PathBuf {
        self.data_dir().join(self.gguf)
    }
    pub fn hf(&self) -> LoadedModel {
        load_model(&self.hf_path()).unwrap_or_else(|e| panic!("load the {} HF directory: {e}", self.dir))
    }
    pub fn gguf(&self) -> LoadedModel {
        load_model(&self.gguf_path()).unwrap_or_else(|e| panic!("load {}: {e}", self.gguf))
    }
    pub fn refs(&self) -> Vec<serde_json::Value> {
        refs(&self.data_dir())
    }
    /// [`generate_cli`] on both forms, in a fresh folder `dir_name`.
    pub fn generate_cli_both_forms(&self, dir_name: &str) {
        let (dir, r) = (crate::common::tmpdir(dir_name), self.refs());
        generate_cli(crate::common::bin(), &self.hf_path(), &r, &dir, "hf");
        generate_cli(crate::common::bin(), &self.gguf_path(), &r, &dir, "gguf");
    }
    /// [`tokenizes_refs`] on both forms.
    pub fn both_forms_tokenize_refs(&self) {
        let r = self.refs();
        tokenizes_refs(&self.hf(), &r);
        tokenizes_refs(&self.gguf(), &r);
    }
}

pub fn refs(dir: &Path) -> Vec<serde_json::Value> {
    crate::common::read_jsonl(&dir.join("refs.jsonl"))
}

pub fn backend(m: &LoadedModel, blocks: usize) -> CpuBackend {
    CpuBackend::new(m.config.clone(), m.weights.clone(), blocks, 16)
}

/// Prefill of the prompt in one chunk, then the 32 reference tokens one decode step at a time:
/// the logits after the prompt and after every decoded token.
pub fn prefill_then_decode(m: &LoadedModel, r: &serde_json::Value) -> Vec<Vec<f32>> {
    let (prompt, greedy) = (ids(r, "prompt_ids"), ids(r, "greedy_ids"));
    let mut b = backend(m, 16);
    let mut seq = SingleSeq::new(&b, 0, prompt.len() + greedy.len()).unwrap();
    let mut out = vec![seq.feed(&mut b, &prompt).unwrap()];
    for &t in &greedy {
        out.push(seq.feed(&mut b, &[t]).unwrap());
    }
    out
}

/// Every assertion of the README that fits an f32 engine, for every prompt of `refs`: logits
/// after the one-chunk prefill and at the end, 32 greedy tokens from the engine's own state,
/// and teacher forcing one token per step (the decode path) with top-5 logits where given.
/// A few near-ties per file (README): at least 19 positions in 20 have a usable margin.
pub fn check_against_refs(m: &LoadedModel, refs: &[serde_json::Value], form: &str) {
    check_against_refs_with(m, refs, form, |checked, len| checked * 20 >= len * 19);
}

/// [`check_against_refs`] with the data's own bound on near-ties: `enough(checked, prompt
/// length)` holds when enough positions had a usable margin (far more near-ties would make
/// the teacher-forcing check meaningless).
pub fn check_against_refs_with(
    m: &LoadedModel,
    refs: &[serde_json::Value],
    form: &str,
    enough: impl Fn(usize, usize) -> bool,
) {
    let mut worst = 0f64;
    for r in refs {
        let name = r["name"].as_str().unwrap().to_string();
        let (prompt, greedy) = (ids(r, "prompt_ids"), ids(r, "greedy_ids"));
        let tf_argmax = ids(r, "argmax_ids");
        let tf_margin = floats(r, "margins");
        let logits = prefill_then_decode(m, r);
        let d = max_abs_diff(&logits[0], &floats(r, "prompt_last_logits"));
        assert!(d < LOGIT_TOL, "{form} {name}: prompt_last_logits differ by {d}");
        worst = worst.max(d);
        let d = max_abs_diff(&logits[32], &floats(r, "last_logits"));
        assert!(d < LOGIT_TOL, "{form} {name}: last_logits differ by {d}");
        worst = worst.max(d);
        let margins = floats(r, "greedy_margins");
        for (i, &want) in greedy.iter().enumerate() {
            // Checked so that a regenerated file cannot silently weaken the test.
            assert!(margins[i] >= NEAR_TIE, "{name}: near-tie in the greedy reference");
            let n = prompt.len() + i - 1;
            assert_eq!(argmax(&logits[i]), want, "{form} {name}: greedy token {i} (position {n})");
        }
        let mut b = backend(m, 16);
        let mut seq = SingleSeq::new(&b, 0, prompt.len()).unwrap();
        let top5: BTreeMap<u64, &serde_json::Value> =
            r["top5"].as_array().unwrap().iter().map(|e| (e["pos"].as_u64().unwrap(), e)).collect();
        let mut checked = 0;
        for (p, &t) in prompt.iter().enumerate() {
            let l = seq.feed(&mut b, &[t]).unwrap();
            if tf_margin[p] >= NEAR_TIE {
                assert_eq!(argmax(&l), tf_argmax[p], "{form} {name}: teacher-forced argmax at position {p}");
                checked += 1;
            }
            if let Some(e) = top5.get(&(p as u64)) {
                for (id, want) in ids(e, "ids").iter().zip(floats(e, "logits")) {
                    let d = (l[*id as usize] as f64 - want).abs();
                    assert!(d < LOGIT_TOL, "{form} {name}: top-5 logit of {id} at position {p} differs by {d}");
                }
            }
            if p + 1 == prompt.len() {
                // Step-by-step and one-chunk prefill reach the same logits.
                let d = max_abs_diff(&l, &floats(r, "prompt_last_logits"));
                assert!(d < LOGIT_TOL, "{form} {name}: token-by-token prompt logits differ by {d}");
            }
        }
        assert!(enough(checked, prompt.len()), "{form} {name}: only {checked} positions had usable margins");
    }
    println!("{form}: largest |logit - transformers|: {worst:.2e}");
}

/// The HF and GGUF forms hold the same values (BF16 -> F16 is exact here), so their logits
/// agree far more closely than either does with the reference.
pub fn forms_agree(a: &LoadedModel, b: &LoadedModel, refs: &[serde_json::Value]) {
    assert_eq!(
        a.config.hybrid.as_ref().map(|h| h.state_bytes_per_seq()),
        b.config.hybrid.as_ref().map(|h| h.state_bytes_per_seq())
    );
    for r in refs.iter().take(3) {
        let (la, lb) = (prefill_then_decode(a, r), prefill_then_decode(b, r));
        for (x, y) in la.iter().zip(&lb) {
            let y: Vec<f64> = y.iter().map(|&v| v as f64).collect();
            let d = max_abs_diff(x, &y);
            assert!(d < 2e-4, "{}: HF and GGUF logits differ by {d}", r["name"]);
        }
    }
}

#[derive(Clone, Copy)]
pub struct Run {
    pub slots: usize,
    pub max_batch_tokens: usize,
    pub blocks: usize,
    pub prefix_cache: bool,
    pub reverse: bool,
}

/// The reference prompts, then prompt 1 (the chat prompt) twice more: the second copy finds
/// the first's blocks cached without a state snapshot and computes the shared prefix again,
/// stopping there to snapshot it; the third resumes from that snapshot. 8 tokens each.
pub fn engine_run(m: &LoadedModel, refs: &[serde_json::Value], r: &Run) -> (BTreeMap<u64, Completion>, EngineMetrics) {
    let cfg = EngineConfig {
        slots: r.slots,
        max_batch_tokens: r.max_batch_tokens,
        prefix_cache: r.prefix_cache,
        model_fingerprint: m.fingerprint,
    };
    let mut e = Engine::new(backend(m, r.blocks), cfg).unwrap();
    let mut prompts: Vec<Vec<u32>> = refs.iter().map(|r| ids(r, "prompt_ids")).collect();
    prompts.push(prompts[1].clone());
    prompts.push(prompts[1].clone());
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    if r.reverse {
        order.reverse();
    }
    for i in order {
        let req = Request {
            id: i as u64,
            prompt: prompts[i].clone(),
            max_tokens: 8,
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
        };
        e.add_request(req).unwrap();
    }
    let done = e.run_to_completion().unwrap();
    (done.into_iter().map(|c| (c.id, c)).collect(), e.metrics())
}

/// The engine's greedy outputs equal the reference with 1 slot and stay the same with 8 slots,
/// the prefix cache, chunked prefill, reversed order and preemption.
pub fn engine_equivalence(m: &LoadedModel, refs: &[serde_json::Value]) {
    let base = Run { slots: 1, max_batch_tokens: 512, blocks: 64, prefix_cache: false, reverse: false };
    let (want, _) = engine_run(m, refs, &base);
    assert_eq!(want.len(), refs.len() + 2);
    for (&i, c) in &want {
        let src = if i as usize >= refs.len() { 1 } else { i as usize };
        assert_eq!(c.token_ids, ids(&refs[src], "greedy_ids")[..8], "request {i}: 1 slot vs transformers");
    }
    let variants = [
        ("8 slots, prefix cache", Run { slots: 8, prefix_cache: true, ..base }),
        ("8 slots, prefix cache, chunked prefill", Run { slots: 8, prefix_cache: true, max_batch_tokens: 24, ..base }),
        ("8 slots, prefix cache, reversed order", Run { slots: 8, prefix_cache: true, reverse: true, ..base }),
        // The longest request needs 13 blocks; 7 slots in 16 blocks preempt.
        ("7 slots, 16 blocks, prefix cache", Run { slots: 7, blocks: 16, prefix_cache: true, ..base }),
    ];
    for (name, run) in &variants {
        let (got, mt) = engine_run(m, refs, run);
        let strip =
            |x: &BTreeMap<u64, Completion>| x.iter().map(|(k, c)| (*k, c.token_ids.clone())).collect::<Vec<_>>();
        assert_eq!(strip(&got), strip(&want), "{name}: outputs differ from 1 slot: {mt:?}");
        if run.blocks == 64 {
            // The third copy of the chat prompt resumes after its first 2 blocks.
            assert!(mt.prompt_tokens_cached >= 32, "{name}: no prefix reuse: {mt:?}");
        } else {
            assert!(mt.preemptions > 0, "{name}: expected preemptions: {mt:?}");
        }
    }
}

/// `dustoff generate` on a model path: the first 8 greedy reference tokens of prompt 0.
pub fn generate_cli(bin: &Path, model: &Path, refs: &[serde_json::Value], dir: &Path, form: &str) {
    let input = dir.join(format!("{form}-in.jsonl"));
    let r = &refs[0];
    let prompt: Vec<u32> = ids(r, "prompt_ids");
    std::fs::write(&input, format!("{}\n", serde_json::json!({"id": "a", "prompt_ids": prompt}))).unwrap();
    let out = dir.join(format!("{form}.jsonl"));
    let st = std::process::Command::new(bin)
        .args(["generate", "--device", "cpu", "--max-tokens", "8", "--model"])
        .arg(model)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    assert!(st.status.success(), "{form}: {}", String::from_utf8_lossy(&st.stderr));
    let line: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
    let want: Vec<u32> = ids(r, "greedy_ids").into_iter().take(8).collect();
    assert_eq!(ids(&line, "token_ids"), want, "{form}: generate output");
}

/// Both forms tokenize every reference text to (a prefix starting with) its prompt ids.
pub fn tokenizes_refs(m: &LoadedModel, refs: &[serde_json::Value]) {
    for r in refs {
        let got = m.tokenizer.encode(r["source_text"].as_str().unwrap(), false, true).unwrap();
        let want = ids(r, "prompt_ids");
        assert_eq!(&got[..want.len().min(got.len())], &want[..], "{}: {}", m.path.display(), r["name"]);
    }
}

/// The official releases of these families are vision-language checkpoints: a nested
/// `text_config` under `class` / `model_type`, tensors under `model.language_model.` (a
/// top-level `lm_head.weight` stays), plus `model.visual.*` and `mtp.*` tensors (`extras`, 2 x 2
/// BF16 each). The fixture's HF tensors rewritten in that layout (`shards` files, in `dir`)
/// load as the same text model and give the same logits for reference prompt 1.
pub fn vision_language_layout_matches(
    f: &Fixture,
    dir: &Path,
    extras: &[&str],
    shards: usize,
    class: &str,
    model_type: &str,
) {
    write_vision_language_layout(f, dir, extras, shards, class, model_type, false);
    let (vl, flat) = (load_model(dir).unwrap(), f.hf());
    assert_eq!(vl.config, flat.config);
    let r = &f.refs()[1];
    let (a, b) = (prefill_then_decode(&vl, r), prefill_then_decode(&flat, r));
    assert_eq!(a, b, "the same weights under another layout give the same logits");
}

/// Writes the fixture's HF directory in the vision-language layout (see
/// [`vision_language_layout_matches`]) into `dir`; with `as_f32` every tensor is stored F32
/// (the BF16 values widened exactly) instead of BF16.
pub fn write_vision_language_layout(
    f: &Fixture,
    dir: &Path,
    extras: &[&str],
    shards: usize,
    class: &str,
    model_type: &str,
    as_f32: bool,
) {
    use dustoff::model::safetensors::{write_checkpoint, SafetensorsDir, StMeta, StWriteTensor};
    let src = f.hf_path();
    let st = SafetensorsDir::open(&src).unwrap();
    let dtype = if as_f32 { "F32" } else { "BF16" };
    let widen = |b: &[u8]| -> Vec<u8> {
        if as_f32 {
            b.chunks_exact(2).flat_map(|h| [0, 0, h[0], h[1]]).collect()
        } else {
            b.to_vec()
        }
    };
    let mut tensors = Vec::new();
    for name in st.names() {
        let (_, shape, bytes) = st.read(name).unwrap();
        let (_, info) = st.get(name).unwrap();
        assert_eq!(info.dtype, "BF16");
        let renamed = match name.strip_prefix("model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => name.to_string(),
        };
        let meta = StMeta { name: renamed, dtype, shape: shape.to_vec() };
        tensors.push(StWriteTensor { meta, data: widen(bytes).into() });
    }
    for extra in extras {
        let meta = StMeta { name: extra.to_string(), dtype, shape: vec![2, 2] };
        tensors.push(StWriteTensor { meta, data: widen(&[0u8; 8]).into() });
    }
    write_checkpoint(dir, &tensors, shards).unwrap();
    let mut text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let o = text.as_object_mut().unwrap();
    o.remove("architectures");
    let tied = o.remove("tie_word_embeddings").unwrap();
    let vl = serde_json::json!({
        "architectures": [class], "model_type": model_type,
        "tie_word_embeddings": tied, "text_config": text, "vision_config": {"depth": 2, "hidden_size": 16},
    });
    std::fs::write(dir.join("config.json"), vl.to_string()).unwrap();
    for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(name), dir.join(name)).unwrap();
    }
}
