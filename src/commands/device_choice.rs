//! Which device a command runs on: `--device` parsed (`cpu`, `cuda`, `cuda:N`, `auto`), where
//! calibration runs, and the rates a GPU job's steps are tallied against.

use std::path::PathBuf;

use anyhow::Result;

use crate::job::exit::UsageError;

/// Where to run the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

impl Device {
    pub fn is_gpu(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

/// Parses `cpu`, `cuda`, `cuda:N` or `auto`. `auto` is the first GPU when one is usable, else
/// the CPU (said in the log by the caller). Anything else is a usage error.
pub fn parse_device(s: &str) -> Result<Device> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        "auto" => Ok(if cuda_usable() { Device::Cuda(0) } else { Device::Cpu }),
        _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Ok(Device::Cuda(n)),
            _ => Err(UsageError::new(format!("unknown device '{s}': use cpu, cuda, cuda:N or auto")).into()),
        },
    }
}

/// Where `quantize` calibrates and `eval` runs its windows, from `--device`: `auto` is the first
/// GPU when one is usable, else the CPU; `cuda`/`cuda:N` without a usable GPU is a usage error.
/// The GPU tap sees the input of every matrix of every layer kind (attention, Gated DeltaNet,
/// dense FFN, each routed expert, the shared expert), as the CPU's. `ptx_dir`: `--ptx-dir`.
pub fn calibration_device(
    device: &str,
    ptx_dir: Option<PathBuf>,
) -> Result<crate::quantize::calibrate::CalibrationDevice> {
    use crate::quantize::calibrate::CalibrationDevice;
    let cuda = |ordinal| CalibrationDevice::Cuda { ordinal, ptx_dir: ptx_dir.clone() };
    Ok(match parse_device(device)? {
        Device::Cpu => CalibrationDevice::Cpu,
        Device::Cuda(n) if device != "auto" => {
            if !cuda_usable() {
                return Err(UsageError::new(format!(
                    "--device {device}: no usable CUDA device here; use --device cpu or auto"
                ))
                .into());
            }
            cuda(n)
        }
        Device::Cuda(n) => cuda(n),
    })
}

/// The rates a job's steps are tallied against (`engine::step_cost`): on a GPU its copy rate,
/// measured here before the model is placed (256 MiB each way, several times any L2; the
/// buffers are freed before the weights arrive, so they count in no plan or peak), and its
/// data-sheet tensor-core rate; `None` on the CPU or when the device cannot be measured (the
/// job then runs without the tally, said in the log).
pub fn step_bound_rates(device: &Device) -> Option<crate::engine::step_cost::BoundRates> {
    let Device::Cuda(ordinal) = device else { return None };
    let measured = crate::backend::cuda::device::CudaDevice::new(*ordinal).and_then(|d| {
        let flops = crate::backend::cuda::device::tensor_flops(&d.name, d.cc);
        d.copy_bandwidth(256 << 20, 10).map(|bandwidth| crate::engine::step_cost::BoundRates { bandwidth, flops })
    });
    match measured {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("step bound: not tallied ({e})");
            None
        }
    }
}

/// Whether a CUDA device can be used (a driver is loadable and reports a device).
pub fn cuda_usable() -> bool {
    crate::backend::cuda::device::device_count() > 0
}
