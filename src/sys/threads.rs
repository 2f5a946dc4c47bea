//! Where dustoff's CPU threads run (`--numa auto|off|N`, `--threads N`).
//!
//! On a multi-socket server the GPU hangs off one socket; host work (tokenization, sampling,
//! constraint masks, the CPU side of every step) is faster and steadier on that socket's cores
//! with its local memory (the seed article: 28 threads on the GPU's socket beat 56 across
//! both). So by default (`auto`) a run on a GPU whose NUMA node sysfs names is pinned there;
//! a CPU-only run, a one-node machine or an unknown node is left unpinned.
//!
//! Pinning is `sched_setaffinity` on the main thread before the rayon pool starts (threads
//! inherit the mask), and memory is *preferred* on that node (`set_mempolicy(MPOL_PREFERRED)`,
//! also inherited): allocations land there while it has room and fall back otherwise, never
//! an out-of-memory. Memory already in the page cache (a model file read before) stays where it
//! is.

use std::path::Path;

use super::topology::{format_cpu_list, Topology, TopologyError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaMode {
    /// The GPU's node on a multi-node machine, else no pinning.
    Auto,
    Off,
    Node(usize),
}

#[derive(Debug, thiserror::Error)]
pub enum ThreadsError {
    #[error("--numa {0}: use auto, off or a node number")]
    BadMode(String),
    #[error("--numa {node}: this machine has NUMA node(s) {have}")]
    NoSuchNode { node: usize, have: String },
    #[error("--numa {node}: node {node} has no online CPU")]
    EmptyNode { node: usize },
    #[error("--threads 0: give at least 1")]
    ZeroThreads,
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("pinning threads to CPUs {cpus}: {source}")]
    Pin {
        cpus: String,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the thread pool: {0}")]
    Pool(String),
}

impl NumaMode {
    pub fn parse(s: &str) -> Result<Self, ThreadsError> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            n => n.parse().map(Self::Node).map_err(|_| ThreadsError::BadMode(s.to_string())),
        }
    }
}

/// What was chosen: pinned CPUs (`None`: not pinned), the preferred memory node, the thread
/// count, and why (for the log).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    pub cpus: Option<Vec<usize>>,
    pub node: Option<usize>,
    pub threads: usize,
    pub reason: String,
}

impl Placement {
    /// One log line: `threads: 28 on NUMA node 1 (CPUs 14-27,42-55): the node of cuda:0`.
    pub fn describe(&self) -> String {
        match (&self.cpus, self.node) {
            (Some(c), Some(n)) => {
                format!("threads: {} on NUMA node {n} (CPUs {}): {}", self.threads, format_cpu_list(c), self.reason)
            }
            _ => format!("threads: {}, not pinned: {}", self.threads, self.reason),
        }
    }
}

/// Chooses the placement. `gpu_node`: the NUMA node of the GPU the run uses (`None`: a CPU
/// run, or sysfs does not know); `gpu`: its name for the log; `allowed`: the CPUs this process
/// may run on now (its affinity mask; `None`: all online CPUs).
pub fn plan(
    topo: &Topology,
    mode: NumaMode,
    gpu_node: Option<usize>,
    gpu: &str,
    threads: Option<usize>,
    allowed: Option<&[usize]>,
) -> Result<Placement, ThreadsError> {
    if threads == Some(0) {
        return Err(ThreadsError::ZeroThreads);
    }
    let usable = |cpus: &[usize]| -> Vec<usize> {
        cpus.iter().copied().filter(|c| allowed.is_none_or(|a| a.contains(c))).collect()
    };
    let all = usable(&topo.cpus.iter().map(|c| c.id).collect::<Vec<_>>());
    let unpinned =
        |reason: String| Placement { cpus: None, node: None, threads: threads.unwrap_or(all.len().max(1)), reason };
    let pinned = |node: usize, reason: String| -> Result<Placement, ThreadsError> {
        let n = topo.node(node).ok_or_else(|| ThreadsError::NoSuchNode {
            node,
            have: format_cpu_list(&topo.nodes.iter().map(|n| n.id).collect::<Vec<_>>()),
        })?;
        let cpus = usable(&n.cpus);
        if cpus.is_empty() {
            return Err(ThreadsError::EmptyNode { node });
        }
        Ok(Placement { threads: threads.unwrap_or(cpus.len()), cpus: Some(cpus), node: Some(node), reason })
    };
    let mut p = match mode {
        NumaMode::Off => Ok(unpinned("--numa off".into())),
        NumaMode::Node(n) => pinned(n, format!("--numa {n}")),
        NumaMode::Auto if topo.nodes.len() < 2 => Ok(unpinned("one NUMA node".into())),
        NumaMode::Auto => match gpu_node {
            Some(n) if topo.node(n).is_some_and(|node| !usable(&node.cpus).is_empty()) => {
                pinned(n, format!("the node of {gpu} (--numa off to use every socket)"))
            }
            Some(n) => Ok(unpinned(format!("{gpu} is on node {n}, which has no CPU this process may use"))),
            None if gpu.is_empty() => Ok(unpinned("a CPU run uses every socket".into())),
            None => Ok(unpinned(format!("sysfs does not say which node {gpu} is on (--numa N to choose)"))),
        },
    }?;
    // More threads than CPUs run, but take turns on the cores: every step waits for the last.
    let cpus = p.cpus.as_ref().map_or(all.len(), Vec::len);
    if cpus > 0 && p.threads > cpus {
        p.reason.push_str(&format!(
            "; --threads {} is more than the {cpus} CPUs they may use: threads beyond them share cores and slow each step",
            p.threads
        ));
    }
    Ok(p)
}

/// The CPUs this process may run on now (`sched_getaffinity`), `None` where unknown.
pub fn current_affinity() -> Option<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set, and the kernel writes at
        // most size_of::<cpu_set_t>() bytes into it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 is this thread; the pointer and size describe `set`.
        let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return None;
        }
        // SAFETY: CPU_ISSET only reads `set` for indexes below CPU_SETSIZE.
        Some((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Pins the calling thread (and the threads it starts afterwards) to `cpus`, and prefers
/// memory on `node`. Linux only; elsewhere a no-op.
fn pin(cpus: &[usize], node: usize) -> Result<(), ThreadsError> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: as in `current_affinity`; CPU_SET writes only inside `set` for c < CPU_SETSIZE.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            // SAFETY: c < CPU_SETSIZE (filtered above).
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        // SAFETY: pid 0 is this thread; the pointer and size describe `set`.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            return Err(ThreadsError::Pin { cpus: format_cpu_list(cpus), source: std::io::Error::last_os_error() });
        }
        // MPOL_PREFERRED = 1: allocate on `node` while it has memory. A failure here (a kernel
        // without NUMA, a seccomp filter) only loses the memory preference, not the pinning.
        if node < 64 {
            let mask: libc::c_ulong = 1 << node;
            // SAFETY: the mask pointer is valid for one c_ulong; maxnode 65 makes the kernel read
            // exactly its 64 bits (it counts maxnode - 1).
            let _ =
                unsafe { libc::syscall(libc::SYS_set_mempolicy, 1 as libc::c_int, &mask as *const libc::c_ulong, 65) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (cpus, node);
    Ok(())
}

/// Plans and applies the placement for this process, then starts rayon's global pool with the
/// chosen thread count. Call once, before any parallel work. `gpu`: `Some((name, PCI bus id))`
/// for a GPU run.
pub fn setup(
    sys_root: &Path,
    mode: NumaMode,
    threads: Option<usize>,
    gpu: Option<(&str, Option<&str>)>,
) -> Result<Placement, ThreadsError> {
    let topo = Topology::read(sys_root)?;
    let (gpu_name, gpu_node) = match gpu {
        Some((name, bus)) => (name, bus.and_then(|b| super::topology::pci_numa_node(sys_root, b))),
        None => ("", None),
    };
    let allowed = current_affinity();
    let p = plan(&topo, mode, gpu_node, gpu_name, threads, allowed.as_deref())?;
    if let (Some(cpus), Some(node)) = (&p.cpus, p.node) {
        pin(cpus, node)?;
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(p.threads)
        .build_global()
        .map_err(|e| ThreadsError::Pool(e.to_string()))?;
    Ok(p)
}

impl ThreadsError {
    /// A bad flag value (exit code 2), not a failure of the machine.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::BadMode(_) | Self::NoSuchNode { .. } | Self::EmptyNode { .. } | Self::ZeroThreads)
    }
}

/// [`setup`] from the CLI's `--numa` text, `--threads` and the run's CUDA ordinal (`None`: a
/// CPU run), on the real sysfs.
pub fn setup_cli(numa: &str, threads: Option<usize>, cuda_ordinal: Option<usize>) -> Result<Placement, ThreadsError> {
    let mode = NumaMode::parse(numa)?;
    let info = cuda_ordinal.map(|n| (format!("cuda:{n}"), super::gpu::gpu(n).and_then(|g| g.pci_bus_id)));
    let gpu = info.as_ref().map(|(name, bus)| (name.as_str(), bus.as_deref()));
    setup(Path::new(super::topology::SYS_ROOT), mode, threads, gpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::topology::tests::{fake_dual_socket, TempTree};

    fn dual() -> (TempTree, Topology) {
        let dir = TempTree::new("threads");
        fake_dual_socket(dir.path());
        let t = Topology::read(dir.path()).unwrap();
        (dir, t)
    }

    #[test]
    fn auto_pins_to_the_gpus_node_on_two_sockets() {
        let (_d, t) = dual();
        let p = plan(&t, NumaMode::Auto, Some(1), "cuda:0", None, None).unwrap();
        assert_eq!((p.cpus.as_deref(), p.node, p.threads), (Some(&[2, 3, 6][..]), Some(1), 3));
        assert!(
            p.describe().contains("NUMA node 1 (CPUs 2-3,6)") && p.describe().contains("cuda:0"),
            "{}",
            p.describe()
        );
        // --threads overrides the count, not the CPUs.
        let p = plan(&t, NumaMode::Auto, Some(1), "cuda:0", Some(2), None).unwrap();
        assert_eq!((p.cpus.as_deref(), p.threads), (Some(&[2, 3, 6][..]), 2));
        assert!(!p.describe().contains("share cores"), "{}", p.describe());
        // More threads than the node's CPUs: said in the log line.
        let p = plan(&t, NumaMode::Auto, Some(1), "cuda:0", Some(8), None).unwrap();
        assert!(p.describe().contains("--threads 8 is more than the 3 CPUs they may use"), "{}", p.describe());
    }

    #[test]
    fn auto_leaves_cpu_runs_and_unknown_nodes_unpinned() {
        let (_d, t) = dual();
        let p = plan(&t, NumaMode::Auto, None, "", None, None).unwrap();
        assert_eq!((p.cpus, p.threads), (None, 7));
        let p = plan(&t, NumaMode::Auto, None, "cuda:0", None, None).unwrap();
        assert!(p.cpus.is_none() && p.reason.contains("does not say"), "{}", p.reason);
        let p = plan(&t, NumaMode::Off, Some(1), "cuda:0", Some(4), None).unwrap();
        assert_eq!((p.cpus, p.threads), (None, 4));
    }

    #[test]
    fn explicit_nodes_respect_the_affinity_mask_and_refuse_bad_input() {
        let (_d, t) = dual();
        let p = plan(&t, NumaMode::Node(0), None, "", None, Some(&[0, 1, 2])).unwrap();
        assert_eq!(p.cpus.as_deref(), Some(&[0, 1][..]));
        assert!(matches!(
            plan(&t, NumaMode::Node(5), None, "", None, None),
            Err(ThreadsError::NoSuchNode { node: 5, .. })
        ));
        assert!(matches!(
            plan(&t, NumaMode::Node(1), None, "", None, Some(&[0])),
            Err(ThreadsError::EmptyNode { node: 1 })
        ));
        assert!(matches!(plan(&t, NumaMode::Auto, None, "", Some(0), None), Err(ThreadsError::ZeroThreads)));
        assert_eq!(NumaMode::parse("2").unwrap(), NumaMode::Node(2));
        assert_eq!(NumaMode::parse("off").unwrap(), NumaMode::Off);
        assert!(NumaMode::parse("socket").is_err());
    }

    #[test]
    fn one_node_machines_are_not_pinned() {
        let dir = TempTree::new("one");
        std::fs::create_dir_all(dir.path().join("devices/system/cpu")).unwrap();
        std::fs::write(dir.path().join("devices/system/cpu/online"), "0-3\n").unwrap();
        let t = Topology::read(dir.path()).unwrap();
        let p = plan(&t, NumaMode::Auto, Some(0), "cuda:0", None, None).unwrap();
        assert_eq!((p.cpus, p.threads, p.reason.as_str()), (None, 4, "one NUMA node"));
    }

    #[test]
    fn pinning_this_thread_to_its_own_mask_works() {
        // Real sched_setaffinity on the CPUs this test may already use (changes nothing else).
        let Some(mine) = current_affinity() else { return };
        pin(&mine, 0).unwrap();
        assert_eq!(current_affinity().unwrap(), mine);
    }
}
