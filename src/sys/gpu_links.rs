//! How the GPUs of this machine connect to each other, for `dustoff doctor`: NVLink or PCIe,
//! and how far a PCIe path goes (one switch, several, the host bridge, across NUMA nodes).
//!
//! Source: NVML (`libnvidia-ml.so.1`, installed with the driver), opened with `dlopen` so the
//! binary needs nothing at build time; without NVML, the PCIe tree in sysfs
//! (`/sys/bus/pci/devices/<bus id>` links into `/sys/devices/pci<domain>:<bus>/...`), which
//! cannot see NVLink. Tensor parallel exchanges activations every block, so a pair of GPUs
//! without NVLink whose PCIe path leaves one switch gets a warning (the seed article's advice).

use std::path::{Path, PathBuf};

use serde::Serialize;

/// The closest common point of two GPUs' PCIe paths (the `nvidia-smi topo -m` levels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PcieLevel {
    /// One board (a dual-GPU card).
    SameBoard,
    /// Below one PCIe switch (PIX).
    SingleSwitch,
    /// Through several switches, not the host bridge (PXB).
    MultipleSwitches,
    /// Through one CPU's host bridge (PHB).
    HostBridge,
    /// Across host bridges within one NUMA node (NODE).
    SameNode,
    /// Across the CPU interconnect between NUMA nodes (SYS).
    CrossNode,
}

impl PcieLevel {
    /// The `nvidia-smi topo -m` name.
    pub fn short(self) -> &'static str {
        match self {
            PcieLevel::SameBoard => "same board",
            PcieLevel::SingleSwitch => "PIX: one PCIe switch",
            PcieLevel::MultipleSwitches => "PXB: several PCIe switches",
            PcieLevel::HostBridge => "PHB: through the CPU host bridge",
            PcieLevel::SameNode => "NODE: across host bridges of one NUMA node",
            PcieLevel::CrossNode => "SYS: across the CPU interconnect",
        }
    }

    /// NVML's `nvmlGpuTopologyLevel_t` (0, 10, ..., 50).
    fn from_nvml(v: u32) -> Option<Self> {
        Some(match v {
            0 => PcieLevel::SameBoard,
            10 => PcieLevel::SingleSwitch,
            20 => PcieLevel::MultipleSwitches,
            30 => PcieLevel::HostBridge,
            40 => PcieLevel::SameNode,
            50 => PcieLevel::CrossNode,
            _ => return None,
        })
    }
}

/// The link between GPUs `a` and `b` (`cuda:N` ordinals, `a < b`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuLink {
    pub a: usize,
    pub b: usize,
    /// Peer-to-peer over NVLink; `None`: unknown (no NVML).
    pub nvlink: Option<bool>,
    pub pcie: Option<PcieLevel>,
    /// `nvml` or `sysfs`.
    pub source: &'static str,
}

impl GpuLink {
    /// Whether tensor parallel over this pair would send its all-reduces beyond one PCIe switch.
    pub fn crosses_switch(&self) -> bool {
        self.nvlink != Some(true) && self.pcie.is_some_and(|l| l > PcieLevel::SingleSwitch)
    }

    pub fn describe(&self) -> String {
        let pcie = self.pcie.map_or("PCIe path unknown", PcieLevel::short);
        match self.nvlink {
            Some(true) => format!("cuda:{} <-> cuda:{}: NVLink (PCIe {pcie})", self.a, self.b),
            Some(false) => format!("cuda:{} <-> cuda:{}: PCIe only ({pcie})", self.a, self.b),
            None => format!("cuda:{} <-> cuda:{}: {pcie}; NVLink unknown (no NVML)", self.a, self.b),
        }
    }
}

/// One GPU as this module needs it: its `cuda:N` ordinal and PCI bus id (`0000:86:00.0`).
#[derive(Clone, Debug)]
pub struct GpuAt {
    pub ordinal: usize,
    pub bus_id: String,
}

/// The links of every pair of `gpus`: from NVML when it loads, else from sysfs under
/// `sys_root`. Also returns the active NVLink count of each GPU (NVML only).
pub fn links(gpus: &[GpuAt], sys_root: &Path) -> (Vec<GpuLink>, Vec<(usize, u32)>) {
    if gpus.len() < 2 {
        let counts = nvml::Nvml::open().map(|n| nvlink_counts(&n, gpus)).unwrap_or_default();
        return (Vec::new(), counts);
    }
    let mut out = sysfs_links(gpus, sys_root);
    let Some(n) = nvml::Nvml::open() else { return (out, Vec::new()) };
    // NVML where it answers; a pair it cannot place keeps the sysfs level.
    for l in &mut out {
        let bus = |o: usize| gpus.iter().find(|g| g.ordinal == o).and_then(|g| n.device(&g.bus_id));
        if let (Some(da), Some(db)) = (bus(l.a), bus(l.b)) {
            l.nvlink = n.nvlink_p2p(da, db);
            if let Some(level) = n.common_ancestor(da, db) {
                l.pcie = Some(level);
            }
            l.source = "nvml";
        }
    }
    let counts = nvlink_counts(&n, gpus);
    (out, counts)
}

fn nvlink_counts(n: &nvml::Nvml, gpus: &[GpuAt]) -> Vec<(usize, u32)> {
    gpus.iter().filter_map(|g| n.device(&g.bus_id).map(|d| (g.ordinal, n.active_nvlinks(d)))).collect()
}

/// The PCIe levels of every pair from the sysfs tree alone (NVLink unknown).
pub fn sysfs_links(gpus: &[GpuAt], sys_root: &Path) -> Vec<GpuLink> {
    let paths: Vec<Option<Vec<String>>> = gpus.iter().map(|g| pci_chain(sys_root, &g.bus_id)).collect();
    let node = |g: &GpuAt| super::topology::pci_numa_node(sys_root, &g.bus_id);
    let mut out = Vec::new();
    for i in 0..gpus.len() {
        for j in i + 1..gpus.len() {
            let pcie = match (&paths[i], &paths[j]) {
                (Some(p), Some(q)) => Some(pcie_level(p, q, node(&gpus[i]), node(&gpus[j]))),
                _ => None,
            };
            out.push(GpuLink { a: gpus[i].ordinal, b: gpus[j].ordinal, nvlink: None, pcie, source: "sysfs" });
        }
    }
    out
}

/// The device's path from its root complex: `["pci0000:85", "0000:85:00.0", ..., bus_id]`,
/// from the `bus/pci/devices/<bus id>` link; `None` when sysfs does not have it.
pub fn pci_chain(sys_root: &Path, bus_id: &str) -> Option<Vec<String>> {
    let link: PathBuf = sys_root.join("bus/pci/devices").join(bus_id.to_ascii_lowercase());
    let real = std::fs::canonicalize(link).ok()?;
    let parts: Vec<String> = real.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let root = parts.iter().position(|c| c.starts_with("pci") && c.contains(':'))?;
    Some(parts[root..].to_vec())
}

/// The level of two chains from [`pci_chain`]: different root complexes are a NUMA question;
/// under one, no shared bridge means the host bridge; a shared bridge with one port below it on
/// each side is one switch; anything deeper is several switches.
pub fn pcie_level(p: &[String], q: &[String], node_p: Option<usize>, node_q: Option<usize>) -> PcieLevel {
    if p.first() != q.first() {
        return match (node_p, node_q) {
            (Some(a), Some(b)) if a == b => PcieLevel::SameNode,
            _ => PcieLevel::CrossNode,
        };
    }
    // Bridges between the root complex and the device (the device itself left out).
    let bridges = |c: &[String]| if c.len() > 2 { c[1..c.len() - 1].to_vec() } else { Vec::new() };
    let (bp, bq) = (bridges(p), bridges(q));
    let shared = bp.iter().zip(&bq).take_while(|(a, b)| a == b).count();
    if shared == 0 {
        return PcieLevel::HostBridge;
    }
    if shared == bp.len() || shared == bq.len() {
        // One device below the other's bridge chain: both sit on one board or switch.
        return PcieLevel::SameBoard;
    }
    if bp.len() - shared <= 1 && bq.len() - shared <= 1 {
        PcieLevel::SingleSwitch
    } else {
        PcieLevel::MultipleSwitches
    }
}

/// The doctor's warning for tensor-parallel pairs whose traffic would leave one PCIe switch
/// without NVLink; `None` when every pair is fine (or there is no pair).
pub fn tensor_parallel_warning(links: &[GpuLink]) -> Option<String> {
    let bad: Vec<String> = links
        .iter()
        .filter(|l| l.crosses_switch())
        .map(|l| format!("cuda:{}+cuda:{} ({})", l.a, l.b, l.pcie.map_or("?", PcieLevel::short)))
        .collect();
    if bad.is_empty() {
        return None;
    }
    let unknown = if links.iter().any(|l| l.nvlink.is_none()) { " (NVLink not checked: no NVML)" } else { "" };
    Some(format!(
        "tensor parallel over {} would send every block's all-reduce across PCIe beyond one switch{unknown}: \
         pair GPUs on NVLink or one switch, or run them data parallel (--devices), which exchanges nothing",
        bad.join(", ")
    ))
}

mod nvml {
    //! The few NVML calls the doctor needs, through `dlopen`.

    use std::ffi::{c_char, c_int, c_uint, c_void, CString};

    use super::PcieLevel;

    type Device = *mut c_void;
    type InitFn = unsafe extern "C" fn() -> c_int;
    type ByBusFn = unsafe extern "C" fn(*const c_char, *mut Device) -> c_int;
    type AncestorFn = unsafe extern "C" fn(Device, Device, *mut c_uint) -> c_int;
    type P2pFn = unsafe extern "C" fn(Device, Device, c_int, *mut c_int) -> c_int;
    type LinkStateFn = unsafe extern "C" fn(Device, c_uint, *mut c_uint) -> c_int;

    /// `NVML_P2P_CAPS_INDEX_NVLINK` and `NVML_P2P_STATUS_OK`.
    const CAPS_NVLINK: c_int = 2;
    const P2P_OK: c_int = 0;
    /// More links than any GPU has (NVML_NVLINK_MAX_LINKS is 18 in CUDA 12).
    const MAX_LINKS: c_uint = 18;

    pub struct Nvml {
        lib: *mut c_void,
        by_bus: ByBusFn,
        ancestor: Option<AncestorFn>,
        p2p: Option<P2pFn>,
        link_state: Option<LinkStateFn>,
    }

    impl Nvml {
        /// Loads and initializes NVML; `None` when it is not installed or does not initialize.
        pub fn open() -> Option<Self> {
            // SAFETY: dlopen with a constant NUL-terminated name; a null result is handled.
            let lib = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if lib.is_null() {
                return None;
            }
            let sym = |name: &std::ffi::CStr| {
                // SAFETY: `lib` is a live handle from dlopen; the name is NUL-terminated.
                let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
                (!p.is_null()).then_some(p)
            };
            // SAFETY (all transmutes below): each symbol is NVML's exported function of that
            // name, whose C signature is the fn type it is cast to (nvml.h, CUDA 12).
            let init: Option<InitFn> = sym(c"nvmlInit_v2").map(|p| unsafe { std::mem::transmute(p) });
            let by_bus: Option<ByBusFn> =
                sym(c"nvmlDeviceGetHandleByPciBusId_v2").map(|p| unsafe { std::mem::transmute(p) });
            let (Some(init), Some(by_bus)) = (init, by_bus) else {
                // SAFETY: closing the handle opened above; nothing from it is kept.
                unsafe { libc::dlclose(lib) };
                return None;
            };
            // SAFETY: nvmlInit_v2 takes no arguments and may be called more than once.
            if unsafe { init() } != 0 {
                // SAFETY: as above.
                unsafe { libc::dlclose(lib) };
                return None;
            }
            Some(Nvml {
                lib,
                by_bus,
                ancestor: sym(c"nvmlDeviceGetTopologyCommonAncestor").map(|p| unsafe { std::mem::transmute(p) }),
                p2p: sym(c"nvmlDeviceGetP2PStatus").map(|p| unsafe { std::mem::transmute(p) }),
                link_state: sym(c"nvmlDeviceGetNvLinkState").map(|p| unsafe { std::mem::transmute(p) }),
            })
        }

        pub fn device(&self, bus_id: &str) -> Option<Device> {
            let id = CString::new(bus_id).ok()?;
            let mut d: Device = std::ptr::null_mut();
            // SAFETY: `id` is NUL-terminated and outlives the call; NVML writes one handle.
            (unsafe { (self.by_bus)(id.as_ptr(), &mut d) } == 0 && !d.is_null()).then_some(d)
        }

        pub fn common_ancestor(&self, a: Device, b: Device) -> Option<PcieLevel> {
            let f = self.ancestor?;
            let mut level: c_uint = 0;
            // SAFETY: both handles came from `device`; NVML writes one enum value.
            (unsafe { f(a, b, &mut level) } == 0).then(|| PcieLevel::from_nvml(level)).flatten()
        }

        pub fn nvlink_p2p(&self, a: Device, b: Device) -> Option<bool> {
            let f = self.p2p?;
            let mut status: c_int = -1;
            // SAFETY: as above; NVML writes one status value.
            (unsafe { f(a, b, CAPS_NVLINK, &mut status) } == 0).then_some(status == P2P_OK)
        }

        pub fn active_nvlinks(&self, d: Device) -> u32 {
            let Some(f) = self.link_state else { return 0 };
            let mut n = 0;
            for link in 0..MAX_LINKS {
                let mut active: c_uint = 0;
                // SAFETY: as above; an out-of-range link returns an error and writes nothing.
                if unsafe { f(d, link, &mut active) } != 0 {
                    break;
                }
                n += u32::from(active == 1);
            }
            n
        }
    }

    impl Drop for Nvml {
        fn drop(&mut self) {
            // SAFETY: nvmlShutdown balances the nvmlInit_v2 of `open`; then the handle from
            // dlopen is closed and no function pointer from it is used again.
            unsafe {
                let shutdown = libc::dlsym(self.lib, c"nvmlShutdown".as_ptr());
                if !shutdown.is_null() {
                    let f: unsafe extern "C" fn() -> c_int = std::mem::transmute(shutdown);
                    f();
                }
                libc::dlclose(self.lib);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::topology::tests::TempTree;

    /// A sysfs tree: devices under `devices/<path>` and `bus/pci/devices/<bus>` links to them.
    fn device(root: &Path, path: &str, numa: &str) {
        let dir = root.join("devices").join(path);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("numa_node"), numa).unwrap();
        let bus = path.rsplit('/').next().unwrap();
        let links = root.join("bus/pci/devices");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(&dir, links.join(bus)).unwrap();
    }

    fn gpu(ordinal: usize, bus: &str) -> GpuAt {
        GpuAt { ordinal, bus_id: bus.into() }
    }

    #[test]
    fn sysfs_pcie_levels_of_a_two_socket_box() {
        let t = TempTree::new("gpu-links");
        let r = t.path();
        // Socket 0: one PLX switch (upstream 02:00.0, downstream 03:08.0 / 03:10.0) with GPUs 0
        // and 1; GPU 2 behind a second switch cascaded below the first; GPU 3 on another root
        // port; socket 1: GPU 4 on another root complex.
        device(r, "pci0000:00/0000:00:02.0/0000:02:00.0/0000:03:08.0/0000:04:00.0", "0");
        device(r, "pci0000:00/0000:00:02.0/0000:02:00.0/0000:03:10.0/0000:05:00.0", "0");
        device(r, "pci0000:00/0000:00:02.0/0000:02:00.0/0000:03:18.0/0000:06:00.0/0000:07:08.0/0000:08:00.0", "0");
        device(r, "pci0000:00/0000:00:03.0/0000:09:00.0", "0");
        device(r, "pci0000:80/0000:80:02.0/0000:81:00.0", "1");
        let gpus = [
            gpu(0, "0000:04:00.0"),
            gpu(1, "0000:05:00.0"),
            gpu(2, "0000:08:00.0"),
            gpu(3, "0000:09:00.0"),
            gpu(4, "0000:81:00.0"),
        ];
        let l = sysfs_links(&gpus, r);
        let level = |a: usize, b: usize| l.iter().find(|x| x.a == a && x.b == b).unwrap().pcie;
        assert_eq!(l.len(), 10);
        assert_eq!(level(0, 1), Some(PcieLevel::SingleSwitch));
        assert_eq!(level(0, 2), Some(PcieLevel::MultipleSwitches));
        assert_eq!(level(0, 3), Some(PcieLevel::HostBridge));
        assert_eq!(level(3, 4), Some(PcieLevel::CrossNode));
        assert!(l.iter().all(|x| x.nvlink.is_none() && x.source == "sysfs"));
        assert!(!l[0].crosses_switch());
        let w = tensor_parallel_warning(&l).unwrap();
        assert!(w.contains("cuda:0+cuda:2") && w.contains("cuda:3+cuda:4") && !w.contains("cuda:0+cuda:1"), "{w}");
        assert!(w.contains("no NVML"), "{w}");
        // A GPU sysfs does not know: its pairs have no level, and no warning is made up.
        let l = sysfs_links(&[gpu(0, "0000:04:00.0"), gpu(1, "0000:99:00.0")], r);
        assert_eq!(l[0].pcie, None);
        assert_eq!(tensor_parallel_warning(&l), None);
    }

    #[test]
    fn nvlink_pairs_never_warn_and_levels_order_by_distance() {
        let nv = GpuLink { a: 0, b: 1, nvlink: Some(true), pcie: Some(PcieLevel::CrossNode), source: "nvml" };
        assert!(!nv.crosses_switch());
        assert!(nv.describe().contains("NVLink"));
        let pcie = GpuLink { nvlink: Some(false), ..nv.clone() };
        assert!(pcie.crosses_switch());
        assert!(tensor_parallel_warning(&[nv, pcie.clone()]).unwrap().contains("cuda:0+cuda:1"));
        assert!(!tensor_parallel_warning(&[pcie]).unwrap().contains("no NVML"));
        assert!(PcieLevel::SingleSwitch < PcieLevel::HostBridge && PcieLevel::HostBridge < PcieLevel::CrossNode);
        assert_eq!(PcieLevel::from_nvml(30), Some(PcieLevel::HostBridge));
        assert_eq!(PcieLevel::from_nvml(7), None);
    }
}
