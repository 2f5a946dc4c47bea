//! Kernels from source to loaded modules: NVRTC (`nvrtc_lib` loads the library, `nvrtc`
//! compiles with a disk cache), `ptx_isa` (the PTX ISA version a driver accepts), `kernels` (the
//! table of kernel files with every entry name and the lazy per-device registry), `entries`
//! (the per-format entry tables and the typed handles launchers pick them with), `model_entries`
//! (the block format and head size an entry serves; what a backend holds) and `prune` (a file's PTX cut
//! to the entries a backend launches).

pub mod entries;
pub mod kernels;
pub mod model_entries;
pub mod nvrtc;
pub mod nvrtc_lib;
pub mod prune;
pub mod ptx_isa;
