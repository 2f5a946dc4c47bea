//! CPU features and the CPU backend's kernel path (`scalar`, `avx2`, `avx512`).
//!
//! The path is the best one this CPU runs, unless `DUSTOFF_CPU_PATH` asks for a lower one (for
//! comparisons and for testing the AVX2 kernels on an AVX-512 machine). It is resolved once per
//! process: every kernel of a run takes the same path, which batch invariance needs (the GEMV
//! and the tiled GEMM must sum in the same order).

use std::fmt;
use std::sync::OnceLock;

/// Environment variable that caps the kernel path: `scalar`, `avx2` or `avx512`.
pub const CPU_PATH_ENV: &str = "DUSTOFF_CPU_PATH";

/// The CPU kernel families, in increasing order of what they need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuPath {
    /// Portable Rust (any CPU).
    Scalar,
    /// AVX2 + FMA + F16C (Haswell / Broadwell Xeons, Zen).
    Avx2,
    /// AVX-512F on top of the AVX2 set (Skylake-SP and later Xeons, Zen 4).
    Avx512,
}

impl CpuPath {
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(Self::Scalar),
            "avx2" => Some(Self::Avx2),
            "avx512" => Some(Self::Avx512),
            _ => None,
        }
    }

    /// The best path this CPU can run.
    pub fn detected() -> Self {
        let f = CpuFeatures::detect();
        if f.avx2 && f.fma && f.f16c {
            if f.avx512f {
                Self::Avx512
            } else {
                Self::Avx2
            }
        } else {
            Self::Scalar
        }
    }

    /// What the CPU backend computes with, with how it was chosen.
    pub fn describe(self) -> String {
        let detected = Self::detected();
        if self == detected {
            format!("{} kernels", self.name())
        } else {
            format!("{} kernels ({CPU_PATH_ENV}; the CPU runs {})", self.name(), detected.name())
        }
    }
}

impl fmt::Display for CpuPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum CpuPathError {
    #[error("{CPU_PATH_ENV}={value}: unknown path (use scalar, avx2 or avx512)")]
    Unknown { value: String },
    #[error("{CPU_PATH_ENV}={asked}: this CPU runs at most {detected}")]
    Unsupported { asked: CpuPath, detected: CpuPath },
}

/// The path for a requested value (`None`: not set) on a CPU that runs at most `detected`.
pub fn resolve_path(requested: Option<&str>, detected: CpuPath) -> Result<CpuPath, CpuPathError> {
    let Some(v) = requested.filter(|v| !v.trim().is_empty()) else { return Ok(detected) };
    let asked = CpuPath::parse(v).ok_or_else(|| CpuPathError::Unknown { value: v.to_string() })?;
    if asked > detected {
        return Err(CpuPathError::Unsupported { asked, detected });
    }
    Ok(asked)
}

fn resolved() -> &'static (CpuPath, Option<CpuPathError>) {
    static PATH: OnceLock<(CpuPath, Option<CpuPathError>)> = OnceLock::new();
    PATH.get_or_init(|| {
        let detected = CpuPath::detected();
        match resolve_path(super::env::get(CPU_PATH_ENV).as_deref(), detected) {
            Ok(p) => (p, None),
            Err(e) => (detected, Some(e)),
        }
    })
}

/// The kernel path of this process (the detected best when `DUSTOFF_CPU_PATH` is invalid; the
/// CLI refuses that case up front through [`check_path_env`]).
#[inline]
pub fn cpu_path() -> CpuPath {
    resolved().0
}

/// An invalid `DUSTOFF_CPU_PATH` as an error (for the CLI to refuse with a usage error).
pub fn check_path_env() -> Result<CpuPath, CpuPathError> {
    match &resolved().1 {
        Some(e) => Err(e.clone()),
        None => Ok(cpu_path()),
    }
}

/// The instruction-set extensions dustoff's CPU kernels care about (detected at run time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CpuFeatures {
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vnni: bool,
}

impl CpuFeatures {
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            CpuFeatures {
                avx2: is_x86_feature_detected!("avx2"),
                fma: is_x86_feature_detected!("fma"),
                f16c: is_x86_feature_detected!("f16c"),
                avx512f: is_x86_feature_detected!("avx512f"),
                avx512bw: is_x86_feature_detected!("avx512bw"),
                avx512vnni: is_x86_feature_detected!("avx512vnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            CpuFeatures::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_caps_at_the_detected_path() {
        assert_eq!(resolve_path(None, CpuPath::Avx2), Ok(CpuPath::Avx2));
        assert_eq!(resolve_path(Some(""), CpuPath::Avx512), Ok(CpuPath::Avx512));
        assert_eq!(resolve_path(Some("AVX2"), CpuPath::Avx512), Ok(CpuPath::Avx2));
        assert_eq!(resolve_path(Some("scalar"), CpuPath::Avx2), Ok(CpuPath::Scalar));
        assert_eq!(
            resolve_path(Some("avx512"), CpuPath::Avx2),
            Err(CpuPathError::Unsupported { asked: CpuPath::Avx512, detected: CpuPath::Avx2 })
        );
        let e = resolve_path(Some("sse"), CpuPath::Avx2).unwrap_err();
        assert!(e.to_string().contains("DUSTOFF_CPU_PATH=sse"), "{e}");
    }

    #[test]
    fn detected_path_matches_the_features() {
        let f = CpuFeatures::detect();
        let p = CpuPath::detected();
        assert_eq!(p >= CpuPath::Avx2, f.avx2 && f.fma && f.f16c);
        assert_eq!(p == CpuPath::Avx512, f.avx2 && f.fma && f.f16c && f.avx512f);
    }
}
