//! `dustoff run --devices/--engines`: which engines a job runs (data parallel), the slots of
//! each, and the engine pool built from them (see `crate::job::parallel`).

use std::sync::Arc;

use anyhow::{Context, Result};

use super::backend_setup;
use super::device_choice::Device;
use super::placement;
use super::slots::{self, Slots};
use crate::backend::Backend;
use crate::engine::batch::{Engine, EngineConfig};
use crate::engine::constraint::Grammar;
use crate::job::adapters::EngineGenerate;
use crate::job::exit::UsageError;
use crate::job::parallel::{EnginePool, EngineSpec};
use crate::job::runner::{Generate, StopFlag};
use crate::model::config::ModelConfig;
use crate::model::weights::ModelWeights;

/// The devices of a job's engines, one entry an engine (a device may appear more than once:
/// `--devices 0,0` runs two engines on cuda:0).
///
/// `device` is `--device` resolved (auto already became cpu or cuda:0) and `device_flag` what
/// the user wrote: with `auto` or `cuda` a GPU run uses every GPU, with `cuda:N` only that one.
/// `devices`: `all` or a list of GPU ordinals (`0,1`, `cuda:0,cuda:1`). `engines`: engines per
/// device (on the CPU, N CPU engines in one process).
pub fn engine_devices(
    device: &Device,
    device_flag: &str,
    devices: Option<&str>,
    engines: usize,
    gpu_count: usize,
) -> Result<Vec<Device>, UsageError> {
    if engines == 0 {
        return Err(UsageError::new("--engines 0: at least one engine must run"));
    }
    let ordinals: Vec<usize> = match (devices.map(str::trim), device) {
        (Some(_), Device::Cpu) if device_flag == "cpu" => {
            return Err(UsageError::new(
                "--devices lists GPUs, but --device is cpu: for several CPU engines use --engines N",
            ))
        }
        (Some(_), Device::Cpu) => {
            return Err(UsageError::new("--devices lists GPUs, but no CUDA device is usable here; use --device cpu"))
        }
        (Some("all"), _) => (0..gpu_count).collect(),
        (Some(list), _) => {
            let mut v = Vec::new();
            for part in list.split(',').map(str::trim) {
                let n = part.strip_prefix("cuda:").unwrap_or(part).parse::<usize>().map_err(|_| {
                    UsageError::new(format!("--devices '{list}': give all, or GPU ordinals like 0,1 (or 0,0)"))
                })?;
                if n >= gpu_count {
                    return Err(UsageError::new(format!(
                        "--devices {list}: cuda:{n} requested, but {gpu_count} CUDA device(s) are usable here"
                    )));
                }
                v.push(n);
            }
            v
        }
        (None, Device::Cpu) => return Ok(vec![Device::Cpu; engines]),
        (None, Device::Cuda(_)) if matches!(device_flag, "auto" | "cuda") => (0..gpu_count.max(1)).collect(),
        (None, Device::Cuda(n)) => vec![*n],
    };
    if ordinals.is_empty() {
        return Err(UsageError::new("--devices all: no CUDA device is usable here; use --device cpu"));
    }
    Ok(ordinals.iter().flat_map(|&n| std::iter::repeat_n(Device::Cuda(n), engines)).collect())
}

/// A label for logs and the report: `cpu#0`, `cuda:0#1` (the engine's index on its device).
pub fn engine_labels(devs: &[Device]) -> Vec<String> {
    let mut out = Vec::with_capacity(devs.len());
    for (i, d) in devs.iter().enumerate() {
        let nth = devs[..i].iter().filter(|e| *e == d).count();
        let name = match d {
            Device::Cpu => "cpu".to_string(),
            Device::Cuda(n) => format!("cuda:{n}"),
        };
        out.push(format!("{name}#{nth}"));
    }
    out
}

/// The slots of each engine: a given count for every engine; `auto` on the CPU the CPU default
/// for each, on a GPU what the memory plan fits in the device's free memory (within `cap`)
/// divided among the engines that share it (`--devices 0,0`: half each).
pub fn engine_slots(
    slots: Slots,
    devs: &[Device],
    cfg: &ModelConfig,
    weights: &ModelWeights,
    per_seq: usize,
    max_batch_tokens: usize,
    flags: placement::MemoryFlags,
) -> Result<Vec<usize>> {
    // One type for every engine: the given one, F16 for auto.
    let kv = flags.kv_cache.or_f16();
    let mut out = Vec::with_capacity(devs.len());
    for d in devs {
        let n = match (slots, d) {
            (Slots::Count(n), _) => n,
            (Slots::Auto, Device::Cpu) => slots::CPU_AUTO_SLOTS,
            (Slots::Auto, Device::Cuda(ordinal)) => {
                let share = devs.iter().filter(|e| *e == d).count() as u64;
                let dev = crate::backend::cuda::device::CudaDevice::new(*ordinal)
                    .with_context(|| format!("opening cuda:{ordinal} to size --slots auto"))?;
                let (free, _) = dev.mem_info()?;
                let avail = crate::backend::cuda::plan::budget::available(flags.max_gpu_memory, free as u64);
                let bytes = crate::backend::cuda::plan::memory::device_weight_bytes(cfg, weights, false);
                slots::fit_slots(cfg, bytes, avail / share, (per_seq, max_batch_tokens), kv).max(1)
            }
        };
        out.push(n);
    }
    if slots == Slots::Auto {
        eprintln!("slots: {out:?} per engine (--slots auto; engines on one GPU share its free memory)");
    }
    Ok(out)
}

/// What every engine of a pool is made from.
pub struct PoolConfig {
    pub model: Arc<(ModelConfig, ModelWeights)>,
    pub model_fingerprint: [u8; 32],
    /// KV positions per sequence.
    pub per_seq: usize,
    pub max_batch_tokens: usize,
    pub prefix_cache: bool,
    /// `--ptx-dir`, `--max-gpu-memory` (each engine's share of its GPU: see [`start_pool`]).
    pub place: placement::Placement,
    pub eos: Vec<u32>,
    pub grammar: Option<Grammar>,
    pub stop: StopFlag,
}

/// Starts one engine per entry of `devs` (with `slots[i]` slots), each built in its own thread.
pub fn start_pool(pc: &PoolConfig, devs: &[Device], slots: &[usize]) -> Result<EnginePool> {
    let labels = engine_labels(devs);
    let mut specs = Vec::with_capacity(devs.len());
    for ((device, &slots), label) in devs.iter().zip(slots).zip(&labels) {
        let (model, device, label_t) = (pc.model.clone(), device.clone(), label.clone());
        let (eos, grammar, stop) = (pc.eos.clone(), pc.grammar.clone(), pc.stop.clone());
        // Engines that share a GPU share its cap.
        let share = devs.iter().filter(|e| **e == device).count() as u64;
        let cap =
            pc.place.max_gpu_memory.map(|c| crate::backend::cuda::plan::budget::MemoryCap { bytes: c.bytes / share });
        let place = placement::Placement { max_gpu_memory: cap, ..pc.place.clone() };
        let cfg = EngineConfig::new(slots, pc.max_batch_tokens, pc.prefix_cache, pc.model_fingerprint);
        let tokens = slots * pc.per_seq;
        let make = move || -> Result<Box<dyn Generate>> {
            let step = cfg.max_batch_tokens;
            let backend = backend_setup::make_backend(&model.0, &model.1, &device, tokens, (step, slots), &place)?;
            eprintln!("engine {label_t}: {}; {slots} slots, KV room for {tokens} tokens", backend.describe());
            let engine = Engine::new(backend, cfg)?;
            Ok(Box::new(EngineGenerate::new(engine, eos).with_stop(stop).with_grammar(grammar)))
        };
        specs.push(EngineSpec { label: label.clone(), make: Box::new(make) });
    }
    EnginePool::start(specs, crate::engine::batch::BLOCK_SIZE, pc.stop.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_follow_the_flags() {
        let cpu = Device::Cpu;
        let c0 = Device::Cuda(0);
        assert_eq!(engine_devices(&cpu, "cpu", None, 3, 0).unwrap(), vec![Device::Cpu; 3]);
        // auto/cuda on a GPU run: every GPU; cuda:N only that one.
        assert_eq!(engine_devices(&c0, "auto", None, 1, 2).unwrap(), vec![Device::Cuda(0), Device::Cuda(1)]);
        assert_eq!(engine_devices(&Device::Cuda(1), "cuda:1", None, 2, 2).unwrap(), vec![Device::Cuda(1); 2]);
        assert_eq!(engine_devices(&c0, "auto", Some("0,0"), 1, 1).unwrap(), vec![Device::Cuda(0); 2]);
        assert_eq!(
            engine_devices(&c0, "cuda", Some("all"), 2, 2).unwrap(),
            vec![Device::Cuda(0), Device::Cuda(0), Device::Cuda(1), Device::Cuda(1)]
        );
        assert_eq!(engine_devices(&c0, "cuda", Some("cuda:1, 0"), 1, 2).unwrap(), vec![Device::Cuda(1), c0.clone()]);
        for (dev, flag, list, engines, gpus, says) in [
            (&cpu, "cpu", Some("0"), 1, 1, "--engines N"),
            (&cpu, "auto", Some("0"), 1, 0, "no CUDA device"),
            (&c0, "auto", Some("2"), 1, 2, "cuda:2 requested"),
            (&c0, "auto", Some("x"), 1, 2, "ordinals"),
            (&cpu, "cpu", None, 0, 0, "--engines 0"),
        ] {
            let e = engine_devices(dev, flag, list, engines, gpus).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        let labels = engine_labels(&[Device::Cuda(0), Device::Cuda(0), Device::Cuda(1), Device::Cpu]);
        assert_eq!(labels, vec!["cuda:0#0", "cuda:0#1", "cuda:1#0", "cpu#0"]);
    }
}
