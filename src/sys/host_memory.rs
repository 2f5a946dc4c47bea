//! Host memory this process may still take: the kernel's `MemAvailable`, held to the room left
//! under the process's cgroup limit (a container's `--memory`, a systemd unit's `MemoryMax`),
//! where one is set. The CPU backend's KV cache is host memory, and the kernel does not refuse
//! an allocation past it: the pages are handed out as the cache fills, and the OOM killer ends
//! the job hours later. So the CPU memory plan checks against this before it allocates.

use std::path::Path;

/// What the host can still give this process, in bytes, with what limited it (for messages);
/// `None` where `/proc/meminfo` cannot be read (not Linux).
pub fn available() -> Option<Available> {
    let mem = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| meminfo_field(&t, "MemAvailable:"))?;
    let cgroup =
        std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|t| cgroup_room(Path::new("/sys/fs/cgroup"), &t));
    Some(match cgroup {
        Some(room) if room < mem => Available { bytes: room, source: "room under this process's cgroup memory limit" },
        _ => Available { bytes: mem, source: "MemAvailable" },
    })
}

/// Host memory still available, and its source (`MemAvailable` or the cgroup limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Available {
    pub bytes: u64,
    pub source: &'static str,
}

/// A `/proc/meminfo` field (`MemTotal:`, `MemAvailable:`; the file gives kB) in bytes.
pub fn meminfo_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Bytes left under the memory limit of the cgroup that `/proc/self/cgroup` (`self_cgroup`)
/// names, under the cgroup file system mounted at `root`: v2 (`0::/path`: `memory.max` less
/// `memory.current`) or v1 (`N:memory:/path`: `memory.limit_in_bytes` less
/// `memory.usage_in_bytes`). `None` without a limit ("max", or v1's near-2^63 "unlimited").
fn cgroup_room(root: &Path, self_cgroup: &str) -> Option<u64> {
    let read = |p: &Path| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    let room = |dir: &Path, limit: &str, usage: &str, inactive: &str| -> Option<u64> {
        let limit = read(&dir.join(limit))?.parse::<u64>().ok()?;
        // v1 writes "no limit" as the largest page-aligned i64.
        if limit >= 1 << 62 {
            return None;
        }
        let used = read(&dir.join(usage)).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0);
        // The usage counts file pages the kernel drops under pressure (the inputs and the
        // model just read): not taken, as container runtimes count it.
        let cache = read(&dir.join("memory.stat"))
            .and_then(|t| {
                t.lines().find_map(|l| l.strip_prefix(inactive)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
            })
            .unwrap_or(0);
        Some(limit.saturating_sub(used.saturating_sub(cache)))
    };
    for line in self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        let (base, limit, usage, inactive) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max", "memory.current", "inactive_file")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        } else {
            continue;
        };
        // Inside a container the named path may not exist in its view: the mount's root is
        // then the process's own cgroup.
        let dir = if base.join(rel).is_dir() { base.join(rel) } else { base };
        if let Some(r) = room(&dir, limit, usage, inactive) {
            return Some(r);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_read_in_bytes() {
        let t = "MemTotal:       32768000 kB\nMemFree:  100 kB\nMemAvailable:   24192936 kB\n";
        assert_eq!(meminfo_field(t, "MemAvailable:"), Some(24_192_936 * 1024));
        assert_eq!(meminfo_field(t, "MemTotal:"), Some(32_768_000 * 1024));
        assert_eq!(meminfo_field(t, "SwapFree:"), None);
    }

    #[test]
    fn cgroup_limits_give_the_room_left() {
        let root = std::env::temp_dir().join(format!("dustoff-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let v2 = root.join("system.slice/job.service");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.max"), "8589934592\n").unwrap();
        std::fs::write(v2.join("memory.current"), "1073741824\n").unwrap();
        assert_eq!(cgroup_room(&root, "0::/system.slice/job.service\n"), Some(7 << 30));
        // Reclaimable file pages in the usage are room.
        std::fs::write(v2.join("memory.stat"), "anon 1\ninactive_file 536870912\nactive_file 5\n").unwrap();
        assert_eq!(cgroup_room(&root, "0::/system.slice/job.service\n"), Some((7 << 30) + (1 << 29)));
        // No limit.
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_room(&root, "0::/system.slice/job.service\n"), None);
        // v1: the memory controller's own hierarchy; its "unlimited" is no limit.
        let v1 = root.join("memory/docker/abc");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "4294967296\n").unwrap();
        std::fs::write(v1.join("memory.usage_in_bytes"), "5368709120\n").unwrap();
        let v1_line = "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n";
        assert_eq!(cgroup_room(&root, v1_line), Some(0), "usage past the limit leaves nothing");
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_room(&root, v1_line), None);
        // A cgroup file system that is not there.
        assert_eq!(cgroup_room(&root.join("none"), "0::/\n"), None);
        // A container's view: the named path is not under the mount, whose root is the cgroup.
        std::fs::write(root.join("memory/memory.limit_in_bytes"), "2147483648\n").unwrap();
        std::fs::write(root.join("memory/memory.usage_in_bytes"), "1073741824\n").unwrap();
        assert_eq!(cgroup_room(&root, "4:memory:/process_api/x\n"), Some(1 << 30));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
