//! CPU and NUMA topology from sysfs (`/sys/devices/system/{cpu,node}`), and the NUMA node a
//! PCI device (a GPU) hangs off (`/sys/bus/pci/devices/<bus id>/numa_node`).
//!
//! Every reader takes the sysfs root as a parameter so tests run on a fake tree in a temp dir.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The default sysfs root.
pub const SYS_ROOT: &str = "/sys";

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: '{text}' is not a CPU list (like 0-3,8,10-11)")]
    BadList { path: PathBuf, text: String },
    #[error("{path}: '{text}' is not a number")]
    BadNumber { path: PathBuf, text: String },
}

/// One online logical CPU.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Cpu {
    pub id: usize,
    /// Socket (`topology/physical_package_id`).
    pub package: usize,
    /// Core within the socket (`topology/core_id`); hyper-threads share it.
    pub core: usize,
}

/// One NUMA node and its online CPUs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Node {
    pub id: usize,
    pub cpus: Vec<usize>,
    /// `MemTotal` of `nodeN/meminfo`, when readable.
    pub mem_total_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Topology {
    pub cpus: Vec<Cpu>,
    pub nodes: Vec<Node>,
}

/// Parses a kernel CPU list (`0-3,8,10-11`; empty means none).
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut out = BTreeSet::new();
    for part in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.trim().parse::<usize>().ok()?, b.trim().parse::<usize>().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(part.parse::<usize>().ok()?);
            }
        }
    }
    Some(out.into_iter().collect())
}

fn read(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path).map_err(|source| TopologyError::Io { path: path.to_path_buf(), source })
}

fn read_list(path: &Path) -> Result<Vec<usize>, TopologyError> {
    let text = read(path)?;
    parse_cpu_list(&text).ok_or_else(|| TopologyError::BadList { path: path.to_path_buf(), text: text.trim().into() })
}

fn read_num(path: &Path) -> Result<usize, TopologyError> {
    let text = read(path)?;
    text.trim().parse().map_err(|_| TopologyError::BadNumber { path: path.to_path_buf(), text: text.trim().into() })
}

/// `Node N MemTotal:  131072 kB` from a node's meminfo, in bytes.
fn node_mem_total(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.contains("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().rev().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl Topology {
    /// Reads the online CPUs and NUMA nodes under `sys_root`. A kernel without NUMA support
    /// (no `devices/system/node`) is one node holding every online CPU.
    pub fn read(sys_root: &Path) -> Result<Self, TopologyError> {
        let cpu_dir = sys_root.join("devices/system/cpu");
        let online = read_list(&cpu_dir.join("online"))?;
        let mut cpus = Vec::with_capacity(online.len());
        for &id in &online {
            let t = cpu_dir.join(format!("cpu{id}/topology"));
            // A CPU without a topology directory (some containers) counts as its own core.
            let package = read_num(&t.join("physical_package_id")).unwrap_or(0);
            let core = read_num(&t.join("core_id")).unwrap_or(id);
            cpus.push(Cpu { id, package, core });
        }
        let node_dir = sys_root.join("devices/system/node");
        let mut nodes = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&node_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(id) = name.strip_prefix("node").and_then(|n| n.parse::<usize>().ok()) else { continue };
                let listed = read_list(&e.path().join("cpulist"))?;
                let cpus_on: Vec<usize> = listed.into_iter().filter(|c| online.contains(c)).collect();
                nodes.push(Node { id, cpus: cpus_on, mem_total_bytes: node_mem_total(&e.path().join("meminfo")) });
            }
        }
        nodes.sort_by_key(|n| n.id);
        if nodes.is_empty() {
            nodes.push(Node { id: 0, cpus: online.clone(), mem_total_bytes: None });
        }
        Ok(Topology { cpus, nodes })
    }

    /// Sockets with at least one online CPU.
    pub fn sockets(&self) -> usize {
        self.cpus.iter().map(|c| c.package).collect::<BTreeSet<_>>().len()
    }

    /// Physical cores (distinct (socket, core) pairs).
    pub fn cores(&self) -> usize {
        self.cpus.iter().map(|c| (c.package, c.core)).collect::<BTreeSet<_>>().len()
    }

    pub fn node(&self, id: usize) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

/// The NUMA node of a PCI device (`0000:3b:00.0`), or `None` where sysfs does not say (-1 on
/// single-node machines, or no such device).
pub fn pci_numa_node(sys_root: &Path, bus_id: &str) -> Option<usize> {
    let text =
        std::fs::read_to_string(sys_root.join("bus/pci/devices").join(bus_id.to_ascii_lowercase()).join("numa_node"))
            .ok()?;
    let v: i64 = text.trim().parse().ok()?;
    usize::try_from(v).ok()
}

/// Renders a sorted CPU list compactly (`0-3,8`), for logs.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if j > i { format!("{}-{}", cpus[i], cpus[j]) } else { cpus[i].to_string() });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh directory under the system temp dir (removed by the caller's `TempTree`).
    pub(crate) struct TempTree(pub PathBuf);
    impl TempTree {
        pub(crate) fn new(name: &str) -> Self {
            // Tests run in parallel in one process: a counter keeps their trees apart.
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("dustoff-sysfs-{name}-{}-{k}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempTree(p)
        }
        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for TempTree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A fake sysfs tree of a dual-socket Broadwell box: 2 sockets x 2 cores x 2 threads, cores
    /// 0-1 + threads 4-5 on node 0, cores 2-3 + threads 6-7 on node 1, CPU 7 offline, one GPU on
    /// node 1 and one device that does not know its node.
    pub(crate) fn fake_dual_socket(root: &Path) {
        write(root, "devices/system/cpu/online", "0-6\n");
        for (cpu, pkg, core) in [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1), (4, 0, 0), (5, 0, 1), (6, 1, 0), (7, 1, 1)]
        {
            write(root, &format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id"), &format!("{pkg}\n"));
            write(root, &format!("devices/system/cpu/cpu{cpu}/topology/core_id"), &format!("{core}\n"));
        }
        write(root, "devices/system/node/node0/cpulist", "0-1,4-5\n");
        write(root, "devices/system/node/node0/meminfo", "Node 0 MemTotal:       65536 kB\nNode 0 MemFree: 1 kB\n");
        write(root, "devices/system/node/node1/cpulist", "2-3,6-7\n");
        write(root, "devices/system/node/online", "0-1\n");
        write(root, "bus/pci/devices/0000:86:00.0/numa_node", "1\n");
        write(root, "bus/pci/devices/0000:3b:00.0/numa_node", "-1\n");
    }

    #[test]
    fn cpu_lists_parse_and_print() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    }

    #[test]
    fn reads_a_fake_dual_socket_tree() {
        let dir = TempTree::new("dual");
        fake_dual_socket(dir.path());
        let t = Topology::read(dir.path()).unwrap();
        assert_eq!(t.cpus.len(), 7);
        assert_eq!(t.sockets(), 2);
        assert_eq!(t.cores(), 4);
        assert_eq!(t.nodes.len(), 2);
        assert_eq!(t.node(0).unwrap().cpus, vec![0, 1, 4, 5]);
        assert_eq!(t.node(0).unwrap().mem_total_bytes, Some(65536 * 1024));
        // CPU 7 is offline: listed by the node, left out.
        assert_eq!(t.node(1).unwrap().cpus, vec![2, 3, 6]);
        assert_eq!(pci_numa_node(dir.path(), "0000:86:00.0"), Some(1));
        assert_eq!(pci_numa_node(dir.path(), "0000:86:00.0".to_uppercase().as_str()), Some(1));
        assert_eq!(pci_numa_node(dir.path(), "0000:3b:00.0"), None);
        assert_eq!(pci_numa_node(dir.path(), "0000:00:00.0"), None);
    }

    #[test]
    fn no_numa_directory_means_one_node_and_bad_files_are_named() {
        let dir = TempTree::new("flat");
        write(dir.path(), "devices/system/cpu/online", "0-1\n");
        let t = Topology::read(dir.path()).unwrap();
        assert_eq!(t.nodes, vec![Node { id: 0, cpus: vec![0, 1], mem_total_bytes: None }]);
        assert_eq!((t.sockets(), t.cores()), (1, 2));
        write(dir.path(), "devices/system/node/node0/cpulist", "zero\n");
        let e = Topology::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("node0/cpulist") && e.contains("zero"), "{e}");
    }
}
