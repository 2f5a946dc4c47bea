//! `--tensor-parallel N` (`generate`, `run`): which devices the N ranks take, the usage checks
//! (N dividing the KV heads, GPUs enough), and the rank group built as one backend.
//!
//! On the CPU the ranks are N threads of one process. On GPUs rank `r` takes the `r`-th GPU of
//! `--devices` (which must then list N), else GPUs `K..K+N` for `--device cuda:K` (0 for `cuda`
//! or `auto`). Listing a GPU more than once (`--devices 0,0`) puts several ranks on it: a test of
//! the split on one GPU (host-staged all-reduce), not a way to go faster.

use anyhow::{Context, Result};

use super::backend_setup;
use super::device_choice::Device;
use super::placement;
use super::slots;
use crate::backend::Backend;
use crate::job::exit::UsageError;
use crate::model::config::ModelConfig;
use crate::model::tensor_parallel::{check, shard, Rank};
use crate::model::weights::ModelWeights;

/// The device of each rank.
pub fn rank_devices(device: &Device, devices: Option<&str>, n: usize, gpus: usize) -> Result<Vec<Device>, UsageError> {
    if n == 0 {
        return Err(UsageError::new("--tensor-parallel 0: give 1 or more ranks"));
    }
    let first = match device {
        Device::Cpu if devices.is_some() => {
            return Err(UsageError::new("--devices lists GPUs, but --device is cpu: CPU ranks are threads"))
        }
        Device::Cpu => return Ok(vec![Device::Cpu; n]),
        Device::Cuda(k) => *k,
    };
    if let Some(list) = devices.map(str::trim).filter(|l| *l != "all") {
        let devs = super::devices::engine_devices(device, "cuda", Some(list), 1, gpus)?;
        if devs.len() != n {
            return Err(UsageError::new(format!(
                "--tensor-parallel {n} needs one GPU per rank, but --devices {list} lists {}",
                devs.len()
            )));
        }
        return Ok(devs);
    }
    if first + n > gpus {
        return Err(UsageError::new(format!(
            "--tensor-parallel {n}: needs {n} GPUs from cuda:{first}, but {gpus} CUDA device(s) are usable here; \
             to test the split on one GPU, list it once per rank (--devices {})",
            vec!["0"; n].join(",")
        )));
    }
    Ok((first..first + n).map(Device::Cuda).collect())
}

/// The usage checks of `n` ranks for this model on these devices (before anything loads).
pub fn check_split(cfg: &ModelConfig, devs: &[Device]) -> Result<(), UsageError> {
    check(cfg, devs.len()).map_err(|e| UsageError::new(e.to_string()))
}

/// Rank 0's shard: what one GPU holds (for `--slots auto`'s memory plan).
pub fn rank0_shard(cfg: &ModelConfig, w: &ModelWeights, n: usize) -> Result<(ModelConfig, ModelWeights)> {
    Ok(shard(cfg, w, Rank { rank: 0, n })?)
}

/// The N ranks on `devs` as one backend, each with room for `tokens` cached positions of its
/// own KV heads.
pub fn make_tp_backend(
    cfg: &ModelConfig,
    w: &ModelWeights,
    devs: &[Device],
    tokens: usize,
    (max_batch_tokens, seqs): (usize, usize),
    place: &placement::Placement,
) -> Result<Box<dyn Backend>> {
    check_split(cfg, devs)?;
    let blocks = tokens.div_ceil(crate::engine::batch::BLOCK_SIZE).max(1);
    let n = devs.len();
    let b: Box<dyn Backend> = if devs.iter().all(|d| *d == Device::Cpu) {
        if place.kv_type != crate::backend::kv_type::KvType::F16 {
            return Err(
                UsageError::new("--tensor-parallel on the CPU keeps an f32 KV cache: leave out --kv-cache q8").into()
            );
        }
        let bs = crate::engine::batch::BLOCK_SIZE;
        Box::new(crate::backend::cpu::tensor_parallel::tp_cpu_group(cfg, w, n, blocks, bs)?)
    } else {
        let ordinals: Vec<usize> = devs.iter().map(|d| if let Device::Cuda(k) = d { *k } else { 0 }).collect();
        let opts = backend_setup::cuda_options(ordinals[0], blocks, (max_batch_tokens, seqs), place);
        let p = plan_per_gpu(cfg, w, n, tokens, (max_batch_tokens, seqs))?;
        eprintln!(
            "tensor parallel: {n} ranks on {ordinals:?}; per rank: weights {:.2} GB, KV {:.2} GB, workspace {:.2} GB",
            p.weights as f64 / 1e9,
            p.kv as f64 / 1e9,
            p.workspace as f64 / 1e9
        );
        let b = crate::backend::cuda::tp::group::TpCudaBackend::new(cfg, w, &ordinals, &opts)
            .with_context(|| format!("placing {n} tensor-parallel ranks on {ordinals:?}"))?;
        Box::new(b)
    };
    Ok(crate::backend::fault::FaultInjector::wrap_from_env(b)?)
}

/// The backend of a one-engine command: the plain one without `--tensor-parallel`, else the
/// rank group (`devices`: `--devices` where the command has it).
#[allow(clippy::too_many_arguments)]
pub fn backend_for(
    cfg: &ModelConfig,
    w: &ModelWeights,
    device: &Device,
    tp: Option<usize>,
    devices: Option<&str>,
    tokens: usize,
    step: (usize, usize),
    place: &placement::Placement,
) -> Result<Box<dyn Backend>> {
    match tp {
        None => backend_setup::make_backend(cfg, w, device, tokens, step, place),
        Some(n) => {
            let devs = rank_devices(device, devices, n, gpu_count(device))?;
            make_tp_backend(cfg, w, &devs, tokens, step, place)
        }
    }
}

/// `--slots` for a one-engine command: with `--tensor-parallel N`, sized by the memory plan of
/// rank 0's shard (what one GPU holds), after the split is checked; within `cap` on each GPU.
pub fn slots_for(
    slots: slots::Slots,
    device: &Device,
    (cfg, w): (&ModelConfig, &ModelWeights),
    tp: Option<usize>,
    sizes: (usize, usize),
    flags: placement::MemoryFlags,
) -> Result<(usize, crate::backend::kv_type::KvType)> {
    match tp {
        None => slots::resolve_slots(slots, device, (cfg, w), sizes, flags),
        Some(n) => {
            check(cfg, n).map_err(|e| UsageError::new(e.to_string()))?;
            let (sc, sw) = rank0_shard(cfg, w, n)?;
            slots::resolve_slots(slots, device, (&sc, &sw), sizes, flags)
        }
    }
}

/// The memory plan of one GPU's rank (rank 0's shard: the largest, as all ranks hold equal
/// parts): its 1/N of the split matrices plus the replicated ones, its 1/N of the KV cache.
pub fn plan_per_gpu(
    cfg: &ModelConfig,
    w: &ModelWeights,
    n: usize,
    tokens: usize,
    (max_batch_tokens, seqs): (usize, usize),
) -> Result<crate::backend::cuda::MemoryPlan> {
    let (sc, sw) = rank0_shard(cfg, w, n)?;
    let bytes = crate::backend::cuda::plan::memory::device_weight_bytes(&sc, &sw, false);
    let bs = crate::engine::batch::BLOCK_SIZE;
    let seqs = crate::backend::cuda::plan::memory::SeqPlan::new(seqs);
    let blocks = tokens.div_ceil(bs).max(1);
    Ok(crate::backend::cuda::plan_memory(&sc, bytes.matrices, bytes.wide_scratch, blocks, bs, max_batch_tokens, seqs))
}

fn gpu_count(device: &Device) -> usize {
    match device {
        Device::Cpu => 0,
        Device::Cuda(_) => crate::backend::cuda::device::device_count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_holds_a_third_of_the_split_weights_and_of_the_kv_cache() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(crate::model::loader::SAMPLE_MODEL);
        let m = crate::model::loader::load_model(&path).expect("the sample model (samples/fetch-model.sh)");
        let (c, w) = (&m.config, &m.weights);
        let one = plan_per_gpu(c, w, 1, 4096, (512, 8)).unwrap();
        let three = plan_per_gpu(c, w, 3, 4096, (512, 8)).unwrap();
        assert_eq!(three.kv * 3, one.kv, "each rank caches a third of the KV heads");
        // Replicated: the (tied) embedding table and the final norm: a model of no layers.
        let (mut c0, mut w0) = (c.clone(), w.clone());
        c0.n_layers = 0;
        w0.layers.clear();
        let repl = plan_per_gpu(&c0, &w0, 1, 16, (512, 8)).unwrap().weights as f64;
        let want = repl + (one.weights as f64 - repl) / 3.0;
        let got = three.weights as f64;
        // Within 1%: the layer norms (replicated, 0.1 MB) are counted as split here.
        assert!((got - want).abs() < 0.01 * want, "per-GPU weights {got} vs {want} (one GPU: {})", one.weights);
    }

    #[test]
    fn ranks_take_the_listed_or_the_next_gpus() {
        assert_eq!(rank_devices(&Device::Cpu, None, 3, 0).unwrap(), vec![Device::Cpu; 3]);
        assert_eq!(rank_devices(&Device::Cuda(0), None, 2, 2).unwrap(), vec![Device::Cuda(0), Device::Cuda(1)]);
        assert_eq!(rank_devices(&Device::Cuda(1), None, 1, 2).unwrap(), vec![Device::Cuda(1)]);
        assert_eq!(rank_devices(&Device::Cuda(0), Some("0,0"), 2, 1).unwrap(), vec![Device::Cuda(0); 2]);
        for (dev, list, n, gpus, says) in [
            (Device::Cuda(0), None, 2, 1, "--devices 0,0"),
            (Device::Cuda(1), None, 2, 2, "from cuda:1"),
            (Device::Cuda(0), Some("0,1,1"), 2, 2, "lists 3"),
            (Device::Cpu, Some("0"), 2, 0, "CPU ranks are threads"),
            (Device::Cpu, None, 0, 0, "--tensor-parallel 0"),
        ] {
            let e = rank_devices(&dev, list, n, gpus).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }
}
