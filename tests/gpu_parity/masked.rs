//! The masked arg-max (constrained greedy decoding on the device) against its host twins
//! `sampler::masked_argmax` / `sampler::argmax`: the kernel on random logits and masks, and
//! the whole path (mask upload, device choice) in engine runs on the sample model, compared
//! with the same CUDA backend choosing on the host from downloaded logits.

use std::collections::BTreeMap;

use rand::Rng;
use serde_json::json;

use super::{gpu, opts};
use dustoff::backend::cuda::ops::argmax::MaskedArgmaxRows;
use dustoff::backend::cuda::CudaBackend;
use dustoff::backend::masks::NO_MASK;
use dustoff::backend::Backend;
use dustoff::commands::bench_constrained::HostChoice;
use dustoff::engine::batch::{Completion, Engine, EngineConfig, EngineMetrics, Request};
use dustoff::engine::constraint::{ConstraintFactory, OutputConstraint};
use dustoff::engine::sampler::{argmax, masked_argmax, SamplingParams};
use dustoff::model::loader::{load_model, LoadedModel};

/// Random rows of every kind the engine produces, over a vocabulary that is not a multiple of
/// 32: sparse masks (a grammar's usual), dense ones, all but one token masked, a single
/// allowed token that is NaN (the fallback: lowest allowed id), an empty mask (0), planted
/// ties (lowest id wins), allowed -inf only, and rows without a mask (the plain arg-max),
/// mixed in one launch.
#[test]
fn masked_argmax_rows_matches_host_masked_argmax() {
    let Some(mut g) = gpu("masked argmax") else { return };
    let s = g.dev.stream.clone();
    let n: usize = 49_155;
    let words = n.div_ceil(32);
    let rows = 12;
    let mut x = g.randn(rows * n, 8.0);
    // Mask of each row, or None (no mask).
    let mut masks: Vec<Option<Vec<u32>>> = Vec::new();
    for r in 0..rows {
        let row = &mut x[r * n..(r + 1) * n];
        let mut m = vec![0u32; words];
        let mut allow = |t: usize| m[t / 32] |= 1 << (t % 32);
        match r {
            0 | 6 => (0..n).filter(|_| g.rng.random_range(0..200) == 0).for_each(&mut allow), // sparse
            1 => (0..n).filter(|_| g.rng.random_range(0..3) != 0).for_each(&mut allow),       // dense
            2 => allow(n - 1),                                                                // all but one masked
            3 => {
                // Ties among allowed tokens, and a larger value that is masked.
                for t in [40_000, 123, 7_777] {
                    row[t] = 50.0;
                    allow(t);
                }
                row[5] = 99.0;
                allow(17);
            }
            4 => {
                row[300] = f32::NAN; // the only allowed token is NaN: its id
                allow(300);
            }
            5 => {} // nothing allowed: 0
            7 => {
                row.fill(f32::NEG_INFINITY); // allowed -inf only: the lowest allowed id
                allow(9_000);
                allow(31);
            }
            8 => {
                // NaN next to the allowed maximum; a larger value beyond the allowed ids.
                (0..n).step_by(5).for_each(&mut allow);
                row[10] = f32::NAN;
                row[15] = 60.0;
                row[16] = 70.0;
            }
            _ => {
                masks.push(None); // rows 9, 10, 11: unconstrained rows of a mixed step
                if r == 10 {
                    row[n / 2] = 80.0;
                    row[n - 3] = 80.0;
                }
                continue;
            }
        }
        masks.push(Some(m));
    }
    // The mask index table and the compact masks, as `MaskRows` lays them out (not in row order).
    let mut mask_of = vec![NO_MASK; rows];
    let mut bits = Vec::new();
    for r in (0..rows).rev() {
        if let Some(m) = &masks[r] {
            mask_of[r] = (bits.len() / words) as u32;
            bits.extend_from_slice(m);
        }
    }
    let used = bits.len() / words;
    let (xd, sd, bd, od) = (g.up(&x), g.up(&mask_of), g.up(&bits), g.zeros::<i32>(rows));
    let k = MaskedArgmaxRows { x: g.d(&xd), mask_of: g.d(&sd), bits: g.d(&bd), out: g.d(&od), rows, n, words };
    k.launch(used, &mut g.k, &s).unwrap();
    let got = g.down(&od);
    let want: Vec<i32> = (0..rows)
        .map(|r| {
            let l = &x[r * n..(r + 1) * n];
            masks[r].as_ref().map_or_else(|| argmax(l), |m| masked_argmax(l, m)) as i32
        })
        .collect();
    assert_eq!(got, want, "seed {}", g.seed);
    assert_eq!((want[2], want[3], want[4], want[5], want[7]), (n as i32 - 1, 123, 300, 0, 31));
    assert_eq!(want[8], 15);
    assert_eq!(want[10], n as i32 / 2);
    // A mask index table that points past the masks is refused before launch.
    assert!(k.launch(used + 1, &mut g.k, &s).is_err());
}

/// The schema of the constrained requests of [`mixed_run`].
fn city_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 24},
            "country": {"enum": ["France", "Norway", "Chile", "Brazil", "Japan", "Kenya"]}
        },
        "required": ["city", "country"],
        "additionalProperties": false
    })
}

const CITIES: [&str; 6] = ["Lyon", "Tromso", "Porto Alegre", "Santiago", "Osaka", "Mombasa"];
const FREE: [&str; 2] = ["Say hello.", "Count to three."];

/// Six constrained (ids 0..6) and two free (10, 11) greedy requests in the same steps (mixed
/// steps, forced tokens in multi-token chunks) through an engine with the prefix cache on.
fn mixed_run(m: &LoadedModel, b: Box<dyn Backend>) -> (BTreeMap<u64, Completion>, EngineMetrics) {
    let grammar =
        ConstraintFactory::new(&m.tokenizer).unwrap().compile(&OutputConstraint::Json(city_schema())).unwrap();
    let prompt = |q: &str| {
        let msgs = [
            dustoff::tokenizer::ChatMessage::new("system", "You answer with JSON."),
            dustoff::tokenizer::ChatMessage::new("user", q),
        ];
        let text = m.tokenizer.apply_chat_template(&msgs, true).unwrap();
        m.tokenizer.encode(&text, m.tokenizer.add_bos_default(), true).unwrap()
    };
    let req = |id: u64, q: &str, max_tokens: usize| Request {
        id,
        prompt: prompt(q),
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop_ids: m.tokenizer.eos_ids().to_vec(),
    };
    let cfg = EngineConfig { slots: 8, max_batch_tokens: 512, prefix_cache: true, model_fingerprint: m.fingerprint };
    let mut e = Engine::new(b, cfg).unwrap();
    for (i, c) in CITIES.iter().enumerate() {
        let q = format!("Where is {c}? Give the city and its country.");
        e.add_constrained(req(i as u64, &q, 40), Some(grammar.start())).unwrap();
    }
    for (i, q) in FREE.iter().enumerate() {
        e.add_request(req(10 + i as u64, q, 12)).unwrap();
    }
    let done = e.run_to_completion().unwrap().into_iter().map(|c| (c.id, c)).collect();
    (done, e.metrics())
}

/// Every constrained row of a [`mixed_run`] parses and follows the schema; the run counted
/// its masks and forced tokens.
fn check_constrained_rows(m: &LoadedModel, done: &BTreeMap<u64, Completion>, mt: &EngineMetrics) {
    assert_eq!(done.len(), CITIES.len() + FREE.len());
    assert_eq!(mt.constraint.constrained_requests, 6);
    assert!(mt.constraint.masks > 0 && mt.constraint.forced_tokens > 0, "{:?}", mt.constraint);
    assert_eq!(mt.constraint.grammar_errors, 0);
    let validator = jsonschema::validator_for(&city_schema()).unwrap();
    for id in 0..CITIES.len() as u64 {
        let out = m.tokenizer.decode(&done[&id].token_ids).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"));
        assert!(validator.is_valid(&v), "breaks the schema: {out}");
    }
}

/// Six constrained and two free greedy requests in the same steps on the sample model: the
/// device's masked choice gives the same tokens as the host's from the same backend's logits
/// (`HostChoice`: every constrained step's logits come down to `sampler::masked_argmax`),
/// every constrained row follows the schema (the free rows take the device arg-max in both).
#[test]
fn constrained_greedy_on_the_device_equals_the_host_choice() {
    let Some(g) = gpu("masked greedy engine") else { return };
    drop(g);
    let m = super::common::sample_model();
    let dev = CudaBackend::new(m.config.clone(), &m.weights, &opts(256)).expect("CUDA backend");
    let (on_device, mt) = mixed_run(&m, Box::new(dev));
    check_constrained_rows(&m, &on_device, &mt);
    let dev = CudaBackend::new(m.config.clone(), &m.weights, &opts(256)).expect("CUDA backend");
    let (on_host, _) = mixed_run(&m, Box::new(HostChoice(dev)));
    for (id, c) in &on_device {
        assert_eq!(c.token_ids, on_host[id].token_ids, "request {id}: device and host choices differ");
    }
}

/// The same mixed constrained run on a hybrid model (the qwen3_5_moe reference GGUF: Gated
/// DeltaNet layers and their recurrent states, prefix snapshots): the masked-choice step must
/// advance the recurrent states as the other steps do (a constrained extraction job on a
/// qwen35moe model failed at its second step before), and every constrained row follows the
/// schema. How many rows equal the CPU backend's is printed (random tiny model: near-ties).
#[test]
fn constrained_greedy_on_the_device_for_a_hybrid_model() {
    let Some(g) = gpu("masked greedy engine, hybrid") else { return };
    drop(g);
    let path = super::common::shared_testdata().join("arch/qwen3_5_moe/qwen3_5_moe-f16.gguf");
    let m = load_model(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dev = CudaBackend::new(m.config.clone(), &m.weights, &opts(256)).expect("CUDA backend");
    let (on_device, mt) = mixed_run(&m, Box::new(dev));
    check_constrained_rows(&m, &on_device, &mt);
    let cpu = dustoff::backend::cpu::CpuBackend::new(m.config.clone(), m.weights.clone(), 256, 16);
    let (on_cpu, _) = mixed_run(&m, Box::new(cpu));
    let same = on_device.iter().filter(|(id, c)| c.token_ids == on_cpu[id].token_ids).count();
    eprintln!("hybrid constrained run: {same} of {} requests equal to the CPU backend's tokens", on_device.len());
}
