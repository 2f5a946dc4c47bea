//! NVRTC libraries on this machine: `libnvrtc.so.*` files in the library path and the usual
//! CUDA folders, with the major version their name carries and whether that version can
//! target compute_70 (NVRTC 13 dropped the V100; 11.x and 12.x target it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NvrtcFile {
    pub path: String,
    /// From the file name (`libnvrtc.so.12.9.86` -> 12); `None` for an unversioned name.
    pub major: Option<u32>,
    pub targets_compute_70: Option<bool>,
    /// The GPUs of this machine (`cuda:N`) whose architecture this version can target.
    pub targets_gpus: Vec<String>,
    /// The version `nvrtcVersion` reports, or why the file did not load (filled by `doctor`).
    pub loaded_version: Option<String>,
}

/// Whether NVRTC of `major` can target compute capability `cc` (from the CUDA release notes:
/// 13.x dropped everything below 7.5; 12.x targets 5.0 and up (10.x / 12.x need 12.8, which
/// the major number alone cannot tell: counted as yes); 11.x targets 3.5 to 8.6 (9.0 needs
/// 11.8, counted as yes)). `None` for other versions.
pub fn can_target(major: u32, cc: (i32, i32)) -> Option<bool> {
    match major {
        13.. => Some(cc >= (7, 5)),
        12 => Some(cc >= (5, 0)),
        11 => Some(((3, 5)..=(9, 0)).contains(&cc)),
        _ => None,
    }
}

/// The folders searched, in order: `LD_LIBRARY_PATH`, the folders scripts/nvrtc12.sh and
/// scripts/nvrtc11.sh unpack the PyPI wheels into (`NVRTC12_DIR`, `~/.cache/nvrtc*`), pip's
/// wheel folders of Python installs (`nvidia/cuda_nvrtc/lib`, `nvidia/cu13/lib`), the CUDA
/// toolkits (`/usr/local/cuda*`), the folders of /etc/ld.so.conf.d and the system lib folders.
fn search_dirs() -> Vec<PathBuf> {
    let env = |k: &str| crate::sys::env::get_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut dirs: Vec<PathBuf> = crate::sys::env::get_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).collect())
        .unwrap_or_default();
    let home = env("HOME");
    if let Some(w) = env("NVRTC12_DIR") {
        dirs.push(w.join("nvidia/cuda_nvrtc/lib"));
    }
    if let Some(h) = &home {
        dirs.extend(sorted_children(&h.join(".cache"), "nvrtc").into_iter().map(|d| d.join("nvidia/cuda_nvrtc/lib")));
    }
    // pip's site-packages: a virtual environment, the user's, the system's.
    let mut lib_roots: Vec<PathBuf> = env("VIRTUAL_ENV").map(|v| v.join("lib")).into_iter().collect();
    lib_roots.extend(home.map(|h| h.join(".local/lib")));
    lib_roots.extend(["/usr/local/lib", "/usr/lib", "/usr/lib64"].map(PathBuf::from));
    for root in lib_roots {
        for py in sorted_children(&root, "python3") {
            for site in ["site-packages", "dist-packages"] {
                dirs.push(py.join(site).join("nvidia/cuda_nvrtc/lib"));
                dirs.push(py.join(site).join("nvidia/cu13/lib"));
            }
        }
    }
    dirs.extend(sorted_children(Path::new("/usr/local"), "cuda").into_iter().map(|d| d.join("lib64")));
    dirs.extend(ld_so_conf_dirs());
    dirs.extend(["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"].map(PathBuf::from));
    dirs
}

/// The entries of `dir` whose names start with `prefix`, sorted.
fn sorted_children(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<PathBuf> =
        entries.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(prefix)).map(|e| e.path()).collect();
    v.sort();
    v
}

/// The folders listed in /etc/ld.so.conf.d/*.conf (a toolkit installed from packages registers
/// its lib folder there).
fn ld_so_conf_dirs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for f in sorted_children(Path::new("/etc/ld.so.conf.d"), "") {
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        out.extend(text.lines().map(str::trim).filter(|l| l.starts_with('/')).map(PathBuf::from));
    }
    out
}

/// The major version in a `libnvrtc.so.MAJOR[.MINOR...]` file name.
pub fn major_of(name: &str) -> Option<u32> {
    name.strip_prefix("libnvrtc.so.")?.split('.').next()?.parse().ok()
}

fn scan_dir(dir: &Path, seen: &mut BTreeSet<PathBuf>, out: &mut Vec<NvrtcFile>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc.so")))
        .collect();
    names.sort();
    for p in names {
        // Symlinks (libnvrtc.so -> libnvrtc.so.12) count once, by the file they name.
        let real = std::fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
        if !seen.insert(real.clone()) {
            continue;
        }
        let major = real.file_name().and_then(|n| n.to_str()).and_then(major_of);
        out.push(NvrtcFile {
            path: p.display().to_string(),
            major,
            targets_compute_70: major.and_then(|m| can_target(m, (7, 0))),
            targets_gpus: Vec::new(),
            loaded_version: None,
        });
    }
}

pub fn scan_nvrtc() -> Vec<NvrtcFile> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for d in search_dirs() {
        scan_dir(&d, &mut seen, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_file_names_and_links_count_once() {
        assert_eq!(major_of("libnvrtc.so.12.9.86"), Some(12));
        assert_eq!(major_of("libnvrtc.so.13"), Some(13));
        assert_eq!(major_of("libnvrtc.so"), None);
        assert_eq!(can_target(13, (7, 0)), Some(false));
        assert_eq!(can_target(13, (9, 0)), Some(true));
        assert_eq!(can_target(12, (7, 0)), Some(true));
        let dir = std::env::temp_dir().join(format!("dustoff-nvrtc-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libnvrtc.so.13.0.48"), b"").unwrap();
        std::os::unix::fs::symlink(dir.join("libnvrtc.so.13.0.48"), dir.join("libnvrtc.so.13")).unwrap();
        std::fs::write(dir.join("libnvrtc.so.12"), b"").unwrap();
        std::fs::write(dir.join("libnvrtc-builtins.so.12"), b"").unwrap();
        let (mut seen, mut out) = (BTreeSet::new(), Vec::new());
        scan_dir(&dir, &mut seen, &mut out);
        std::fs::remove_dir_all(&dir).unwrap();
        let got: Vec<(Option<u32>, Option<bool>)> = out.iter().map(|f| (f.major, f.targets_compute_70)).collect();
        assert_eq!(got, vec![(Some(12), Some(true)), (Some(13), Some(false))], "{out:?}");
    }
}
