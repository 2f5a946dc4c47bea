//! The machine dustoff runs on: CPU features and kernel path, NUMA topology and thread
//! placement, the links between GPUs, and `dustoff doctor`'s report.

pub mod cpu;
pub mod doctor;
mod doctor_model;
mod doctor_report;
mod doctor_text;
pub mod env;
pub mod gpu;
pub mod gpu_links;
pub mod host_memory;
pub mod interrupt;
pub mod nvrtc_scan;
pub mod threads;
pub mod topology;
