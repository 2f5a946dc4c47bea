//! What the CUDA driver says about the GPUs, without opening a context: name, compute
//! capability, memory, PCI bus id (for the NUMA node in sysfs), driver version and the PTX ISA
//! it accepts. The driver numbers devices after `CUDA_VISIBLE_DEVICES`, so `cuda:N` here is
//! the `cuda:N` of every other command.

use cudarc::driver::result::device;
use cudarc::driver::sys::CUdevice_attribute as Attr;

use crate::backend::cuda::device::{device_count, driver_available};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GpuInfo {
    /// `cuda:N` ordinal (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    pub memory_bytes: u64,
    /// `0000:86:00.0`, as sysfs names the device.
    pub pci_bus_id: Option<String>,
}

/// The GPUs the driver reports (empty without a driver or a device).
pub fn gpus() -> Vec<GpuInfo> {
    (0..device_count()).filter_map(gpu).collect()
}

/// One GPU by ordinal; `None` when the driver cannot describe it.
pub fn gpu(ordinal: usize) -> Option<GpuInfo> {
    if !driver_available() {
        return None;
    }
    let dev = device::get(i32::try_from(ordinal).ok()?).ok()?;
    // SAFETY: `dev` was returned by cuDeviceGet above (the driver is initialized by
    // device_count, which the callers went through); attribute queries only read.
    let attr = |a: Attr| unsafe { device::get_attribute(dev, a) }.ok();
    let cc = (
        attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    let bus = match (
        attr(Attr::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
        attr(Attr::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
        attr(Attr::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
    ) {
        (Some(dom), Some(bus), Some(dev)) => Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.0")),
        _ => None,
    };
    Some(GpuInfo {
        ordinal,
        name: device::get_name(dev).unwrap_or_else(|_| "unknown GPU".into()),
        compute_capability: cc,
        // SAFETY: as above.
        memory_bytes: unsafe { device::total_mem(dev) }.map(|b| b as u64).unwrap_or(0),
        pci_bus_id: bus,
    })
}

pub use crate::backend::cuda::device::driver_version;

/// The newest PTX ISA version a driver of CUDA version `cuda` JIT-compiles (PTX ISA release
/// notes: CUDA 11.x -> 7.x, 12.0-12.5 -> 8.0-8.5, 12.6 -> 8.5, 12.7/12.8 -> 8.7, 12.9 -> 8.8,
/// 13.0 -> 9.0). PTX from a newer NVRTC than the driver fails to load.
pub fn ptx_isa_for_driver(cuda: (i32, i32)) -> (i32, i32) {
    let isa = crate::backend::cuda::compile::ptx_isa::isa_of_cuda(cuda);
    (isa.0 as i32, isa.1 as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_isa_follows_the_driver_version() {
        assert_eq!(ptx_isa_for_driver((12, 2)), (8, 2));
        assert_eq!(ptx_isa_for_driver((12, 8)), (8, 7));
        assert_eq!(ptx_isa_for_driver((12, 9)), (8, 8));
        assert_eq!(ptx_isa_for_driver((13, 0)), (9, 0));
    }

    #[test]
    fn every_device_the_backend_counts_is_described() {
        // No driver (CI): both 0. With a driver: each ordinal gets a name and a capability.
        assert_eq!(gpus().len(), device_count());
    }
}
