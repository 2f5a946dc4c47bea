//! The human-readable rendering of `dustoff doctor`.

use std::fmt::Write;

use super::doctor::Report;
use super::topology::format_cpu_list;

fn gb(b: u64) -> String {
    format!("{:.2} GB", b as f64 / 1e9)
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

impl Report {
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let c = &self.cpu;
        let _ = writeln!(s, "dustoff {}", self.version);
        let _ = writeln!(s, "\nCPU");
        let _ = writeln!(s, "  {}", c.model_name);
        let _ = writeln!(
            s,
            "  {} socket(s), {} core(s), {} logical CPU(s), {} NUMA node(s)",
            c.sockets,
            c.cores,
            c.logical_cpus,
            c.numa_nodes.len()
        );
        for n in &c.numa_nodes {
            let mem = n.mem_total_bytes.map(|b| format!(", {}", gb(b))).unwrap_or_default();
            let _ = writeln!(s, "    node {}: CPUs {}{mem}", n.id, format_cpu_list(&n.cpus));
        }
        let f = &c.features;
        let _ = writeln!(
            s,
            "  AVX2 {} FMA {} F16C {} AVX-512F {} AVX-512BW {} AVX-512 VNNI {}",
            yes(f.avx2),
            yes(f.fma),
            yes(f.f16c),
            yes(f.avx512f),
            yes(f.avx512bw),
            yes(f.avx512vnni)
        );
        let lowered = if c.kernel_path != c.kernel_path_best {
            format!(" (lowered by DUSTOFF_CPU_PATH; the CPU runs {})", c.kernel_path_best)
        } else {
            String::new()
        };
        let _ = writeln!(s, "  dot-product kernels: {}{lowered}", c.kernel_path);
        if let (Some(t), Some(a)) = (c.memory_total_bytes, c.memory_available_bytes) {
            let _ = writeln!(s, "  memory: {} total, {} available", gb(t), gb(a));
        }
        if let Some(bw) = c.copy_bandwidth_gb_s {
            let _ = writeln!(s, "  host copy bandwidth: {bw:.1} GB/s (read + written, all threads)");
        }
        let _ = writeln!(s, "  {}", self.threads.describe());

        let g = &self.cuda;
        let _ = writeln!(s, "\nCUDA");
        match &g.driver_cuda_version {
            Some(v) => {
                let isa = g.driver_ptx_isa.as_deref().unwrap_or("?");
                let _ = writeln!(s, "  driver: CUDA {v}, accepts PTX ISA up to {isa}");
            }
            None if g.driver_loaded => {
                let _ = writeln!(s, "  driver: loaded, version unknown");
            }
            None => {
                let _ = writeln!(s, "  driver: not found (no libcuda): CPU only");
            }
        }
        let _ = writeln!(s, "  supported drivers: {}", g.supported_drivers);
        if let Some(v) = &g.cuda_visible_devices {
            let _ = writeln!(s, "  CUDA_VISIBLE_DEVICES={v}");
        }
        for d in &g.gpus {
            let (ma, mi) = d.info.compute_capability;
            let _ = writeln!(
                s,
                "  cuda:{} {} (compute {ma}.{mi}, {}, PCI {}, NUMA node {})",
                d.info.ordinal,
                d.info.name,
                gb(d.info.memory_bytes),
                d.info.pci_bus_id.as_deref().unwrap_or("?"),
                d.numa_node.map(|n| n.to_string()).unwrap_or_else(|| "unknown".into())
            );
            let nv = match d.nvrtc_compiles_arch {
                Some(true) => format!("NVRTC compiles {}", d.arch),
                Some(false) => format!("NVRTC cannot compile {}", d.arch),
                None => "no NVRTC".into(),
            };
            let _ = writeln!(s, "    {nv}; usable: {}", yes(d.usable));
            if let Some(bw) = d.copy_bandwidth_gb_s {
                let hint = d.bandwidth_hint.as_deref().map(|h| format!(" ({h})")).unwrap_or_default();
                let _ = writeln!(s, "    copy bandwidth: {bw:.0} GB/s{hint}");
            }
            if let Some(e) = &d.error {
                let _ = writeln!(s, "    error: {e}");
            }
        }
        if g.gpus.is_empty() {
            let _ = writeln!(s, "  no GPU");
        }
        if !g.links.is_empty() {
            let _ = writeln!(s, "  GPU links (from {}):", g.links[0].source);
            for l in &g.links {
                let _ = writeln!(s, "    {}", l.describe());
            }
        }
        for (ordinal, n) in g.nvlinks_active.iter().filter(|(_, n)| *n > 0) {
            let _ = writeln!(s, "  cuda:{ordinal}: {n} active NVLink(s)");
        }
        let n = &g.nvrtc;
        for c in &n.choices {
            let _ = match &c.library {
                Ok((path, version)) => {
                    let isa = c.ptx_isa.as_deref().unwrap_or("?");
                    let probe = match c.compiles {
                        Some(true) => "compiles",
                        Some(false) => "FAILS to compile a probe",
                        None => "not tried",
                    };
                    writeln!(s, "  NVRTC for {}: {version} ({path}), PTX ISA {isa}, {probe}", c.arch)
                        .and_then(|_| writeln!(s, "    why: {}", c.reason))
                }
                Err(e) => writeln!(s, "  NVRTC for {}: none fits: {e}", c.arch),
            };
        }
        if n.files.is_empty() {
            let _ = writeln!(s, "  NVRTC: none found");
        }
        for file in &n.files {
            let t = match file.targets_compute_70 {
                Some(true) => "can target compute_70",
                Some(false) => "cannot target compute_70",
                None => "version unknown",
            };
            let gpus = if g.gpus.is_empty() {
                String::new()
            } else if file.targets_gpus.is_empty() {
                ", none of the GPUs here".to_string()
            } else {
                format!(", targets {}", file.targets_gpus.join(", "))
            };
            let loaded = file.loaded_version.as_deref().map(|v| format!("version {v}, ")).unwrap_or_default();
            let _ = writeln!(s, "    {} ({loaded}{t}{gpus})", file.path);
        }
        let _ = writeln!(s, "  kernels: {}", g.kernels);
        let _ = writeln!(
            s,
            "  cuBLAS: {}",
            if g.cublas_loadable {
                "found (prefill products)"
            } else {
                "not found: optional, prefill products run on dustoff's own tensor-core GEMM (slower prompts)"
            }
        );
        let _ = match &g.nccl {
            Ok(v) => writeln!(s, "  NCCL: {v} (--tensor-parallel over several GPUs)"),
            Err(e) => {
                writeln!(s, "  NCCL: not loadable ({e}); single-GPU runs and --tensor-parallel on one GPU still work")
            }
        };

        if let Some(m) = self.model.as_ref().filter(|m| m.error.is_some()) {
            let _ = writeln!(s, "\nModel {}: cannot be read (see the problem below)", m.path);
        }
        if let Some(m) = self.model.as_ref().filter(|m| m.error.is_none()) {
            let _ = writeln!(
                s,
                "\nModel {} ({}, {} layers), {} slots x {} context",
                m.path, m.arch, m.layers, m.slots, m.context
            );
            for p in &m.plans {
                let avail = p.available_bytes.map(|a| format!(" of {} available", gb(a))).unwrap_or_default();
                let state = if p.state_bytes > 0 {
                    format!(
                        " + state {} ({:.2} MB/sequence)",
                        gb(p.state_bytes),
                        p.state_bytes_per_sequence as f64 / 1e6
                    )
                } else {
                    String::new()
                };
                let _ = writeln!(
                    s,
                    "  {}: weights {} + KV {}{state} + workspace {} = {}{avail}: {}",
                    p.device,
                    gb(p.weights_bytes),
                    gb(p.kv_bytes),
                    gb(p.workspace_bytes),
                    gb(p.total_bytes),
                    if p.fits { "fits" } else { "does NOT fit" }
                );
                let _ = writeln!(s, "    {}", p.note);
                if let Some(t) = p.projected_decode_tok_s {
                    let _ = writeln!(s, "    projected decode: ~{t:.0} tok/s ({})", p.projection);
                }
            }
        }

        let _ = writeln!(
            s,
            "\nUsable devices: {} (--device auto picks {})",
            self.usable_devices.join(", "),
            self.default_device
        );
        for p in &self.problems {
            let _ = writeln!(s, "problem: {p}");
        }
        for h in &self.hints {
            let _ = writeln!(s, "hint: {h}");
        }
        s
    }
}
