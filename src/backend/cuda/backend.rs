//! `CudaBackend`: the forward pass on one GPU. F16 weights (QKV and gate/up stacked so one
//! launch reads the shared input once), f32 residual stream and activations, F16 paged KV cache,
//! own GEMV for steps of up to 8 tokens, cuBLAS (F16 in, f32 accumulate and out) above that.
//!
//! Per layer: rmsnorm -> qkv matmul (+bias) -> [q/k head norm] -> rope(q, k) -> store K/V ->
//! attention -> o matmul (+= residual) -> rmsnorm -> gate/up matmul -> silu*mul -> down matmul
//! (+= residual). Logits only for the last token of chunks that want them.

use std::path::PathBuf;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};

use super::device::CudaDevice;
use super::kernels::{Kernels, PtxSource};
use super::launch::{self as l, Dev};
use super::weights::{stack_f16, tensor_to_f16};
use super::CudaError;
use crate::backend::cpu::ops::rope_table;
use crate::backend::{Backend, BackendError};
use crate::engine::plan::StepPlan;
use crate::model::config::{ModelConfig, RopeStyle};
use crate::model::weights::ModelWeights;

/// How to place a model on a GPU.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub ordinal: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    /// Precompiled PTX folder (`--ptx-dir`); `None`: `DUSTOFF_PTX_DIR`, else NVRTC.
    pub ptx_dir: Option<PathBuf>,
    /// Positions the RoPE tables cover (the longest sequence a plan may reach).
    pub max_positions: usize,
}

struct LayerW {
    attn_norm: CudaSlice<f32>,      // [dim]
    wqkv: CudaSlice<u16>,           // [q_dim + 2 kv_dim, dim] f16
    bqkv: Option<CudaSlice<f32>>,   // [q_dim + 2 kv_dim]
    q_norm: Option<CudaSlice<f32>>, // [head_dim]
    k_norm: Option<CudaSlice<f32>>, // [head_dim]
    wo: CudaSlice<u16>,             // [dim, q_dim] f16
    ffn_norm: CudaSlice<f32>,       // [dim]
    wgu: CudaSlice<u16>,            // [2 ffn, dim] f16: gate rows then up rows
    wdown: CudaSlice<u16>,          // [dim, ffn] f16
    k_cache: CudaSlice<u16>,        // [num_blocks, block_size, n_kv, head_dim] f16
    v_cache: CudaSlice<u16>,        // same
}

/// Step buffers, grown on demand (never shrunk).
#[derive(Default)]
struct Work {
    cap_tok: usize,
    x: Option<CudaSlice<f32>>,       // [tok, dim] residual
    h: Option<CudaSlice<f32>>,       // [tok, dim] normed
    qkv: Option<CudaSlice<f32>>,     // [tok, q_dim + 2 kv_dim]
    att: Option<CudaSlice<f32>>,     // [tok, q_dim]
    gu: Option<CudaSlice<f32>>,      // [tok, 2 ffn]
    act: Option<CudaSlice<f32>>,     // [tok, ffn]
    x16: Option<CudaSlice<u16>>,     // [tok, max(dim, q_dim, ffn)] cuBLAS input
    ids: Option<CudaSlice<u32>>,     // [tok]
    pos: Option<CudaSlice<i32>>,     // [tok]
    slots: Option<CudaSlice<i32>>,   // [tok]
    tok_seq: Option<CudaSlice<i32>>, // [tok]
    rows: Option<CudaSlice<i32>>,    // [tok] logit rows
    cap_part: usize,
    part_o: Option<CudaSlice<f32>>,  // [tok * n_heads * splits * head_dim]
    part_ml: Option<CudaSlice<f32>>, // [tok * n_heads * splits * 2]
    cap_bt: usize,
    bt: Option<CudaSlice<i32>>, // [seqs, bt_stride]
    cap_logits: usize,
    hn: Option<CudaSlice<f32>>,     // [m, dim]
    logits: Option<CudaSlice<f32>>, // [m, vocab]
}

pub struct CudaBackend {
    cfg: ModelConfig,
    dev: CudaDevice,
    kernels: Kernels,
    blas: CudaBlas,
    layers: Vec<LayerW>,
    embd: CudaSlice<u16>,           // [vocab, dim] f16
    output: Option<CudaSlice<u16>>, // [vocab, dim] f16; None: tied to embd
    output_norm: CudaSlice<f32>,    // [dim]
    rope_cos: CudaSlice<f32>,       // [max_pos, head_dim / 2]
    rope_sin: CudaSlice<f32>,
    max_pos: usize,
    block_size: usize,
    num_blocks: usize,
    work: Work,
    /// Weight values clamped to the F16 range at load.
    pub clamped_weights: u64,
    /// Bytes of weights on the device.
    pub weight_bytes: usize,
    /// Bytes of weights one decode step reads (every matrix, the head, one embedding row).
    decode_bytes: u64,
    /// Most device memory seen in use (total - free) at the end of a step.
    peak_used: u64,
}

fn up<T: DeviceRepr>(s: &std::sync::Arc<CudaStream>, v: &[T], what: &str) -> Result<CudaSlice<T>, CudaError> {
    s.clone_htod(v).map_err(CudaError::driver(format!("uploading {what}")))
}

fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    s: &std::sync::Arc<CudaStream>,
    n: usize,
    what: &str,
) -> Result<CudaSlice<T>, CudaError> {
    s.alloc_zeros(n.max(1)).map_err(CudaError::driver(format!("allocating {what} ({n} elements)")))
}

/// Grows `buf` to at least `n` elements.
fn grow<T: DeviceRepr + ValidAsZeroBits>(
    s: &std::sync::Arc<CudaStream>,
    buf: &mut Option<CudaSlice<T>>,
    n: usize,
    what: &str,
) -> Result<(), CudaError> {
    if buf.as_ref().is_none_or(|b| b.len() < n) {
        *buf = None; // free first: the old buffer is not needed
        *buf = Some(zeros(s, n, what)?);
    }
    Ok(())
}

fn ptr<T>(b: &Option<CudaSlice<T>>, s: &CudaStream) -> Dev<T> {
    // Every buffer is grown before use; an absent one would be a bug in `ensure_work`.
    Dev::of(b.as_ref().expect("work buffer allocated by ensure_work"), s)
}

impl CudaBackend {
    pub fn new(cfg: ModelConfig, w: &ModelWeights, opts: &CudaOptions) -> Result<Self, CudaError> {
        let dev = CudaDevice::new(opts.ordinal)?;
        let kernels = Kernels::new(dev.ctx.clone(), dev.arch(), PtxSource::resolve(opts.ptx_dir.clone()));
        // SAFETY: only tries to dlopen the candidate names; CudaBlas::new would panic without one.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(CudaError::CublasMissing);
        }
        let blas = CudaBlas::new(dev.stream.clone())
            .map_err(|source| CudaError::Cublas { what: "creating a handle".into(), source })?;
        let s = &dev.stream;
        let mut clamped = 0u64;
        let mut bytes = 0usize;
        let mut put16 = |v: (Vec<u16>, u64), what: &str| -> Result<CudaSlice<u16>, CudaError> {
            clamped += v.1;
            bytes += v.0.len() * 2;
            up(s, &v.0, what)
        };
        let c = &cfg;
        let slots = opts.num_blocks * opts.block_size * c.kv_dim();
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, lw) in w.layers.iter().enumerate() {
            let name = |s: &str| format!("layer {i} {s}");
            let bqkv = match (&lw.bq, &lw.bk, &lw.bv) {
                (None, None, None) => None,
                (bq, bk, bv) => {
                    let mut b = bq.clone().unwrap_or_else(|| vec![0.0; c.q_dim()]);
                    b.extend(bk.clone().unwrap_or_else(|| vec![0.0; c.kv_dim()]));
                    b.extend(bv.clone().unwrap_or_else(|| vec![0.0; c.kv_dim()]));
                    Some(up(s, &b, &name("qkv bias"))?)
                }
            };
            layers.push(LayerW {
                attn_norm: up(s, &lw.attn_norm, &name("attn_norm"))?,
                wqkv: put16(stack_f16(&[&lw.wq, &lw.wk, &lw.wv])?, &name("wqkv"))?,
                bqkv,
                q_norm: lw.q_norm.as_ref().map(|v| up(s, v, &name("q_norm"))).transpose()?,
                k_norm: lw.k_norm.as_ref().map(|v| up(s, v, &name("k_norm"))).transpose()?,
                wo: put16(tensor_to_f16(&lw.wo)?, &name("wo"))?,
                ffn_norm: up(s, &lw.ffn_norm, &name("ffn_norm"))?,
                wgu: put16(stack_f16(&[&lw.w_gate, &lw.w_up])?, &name("gate/up"))?,
                wdown: put16(tensor_to_f16(&lw.w_down)?, &name("w_down"))?,
                k_cache: zeros(s, slots, &name("K cache"))?,
                v_cache: zeros(s, slots, &name("V cache"))?,
            });
        }
        let embd = put16(tensor_to_f16(&w.token_embd)?, "token_embd")?;
        let output = if c.tied_embeddings { None } else { Some(put16(tensor_to_f16(&w.output)?, "output")?) };
        let mut inv_freq = c.rope_inv_freq();
        if let Some(f) = &w.rope_freq_factors {
            inv_freq.iter_mut().zip(f).for_each(|(a, &b)| *a /= b);
        }
        let max_pos = opts.max_positions.max(1);
        let positions: Vec<usize> = (0..max_pos).collect();
        let (cos, sin) = rope_table(&positions, &inv_freq);
        let rope_cos = up(s, &cos, "RoPE cos table")?;
        let rope_sin = up(s, &sin, "RoPE sin table")?;
        let output_norm = up(s, &w.output_norm, "output_norm")?;
        let per_layer = (c.q_dim() + 2 * c.kv_dim()) * c.dim + c.dim * c.q_dim() + 3 * c.ffn_dim * c.dim;
        let decode_bytes = 2 * (c.n_layers * per_layer + c.vocab_size * c.dim + c.dim) as u64;
        Ok(CudaBackend {
            cfg,
            kernels,
            blas,
            layers,
            embd,
            output,
            output_norm,
            rope_cos,
            rope_sin,
            max_pos,
            block_size: opts.block_size,
            num_blocks: opts.num_blocks,
            work: Work::default(),
            clamped_weights: clamped,
            weight_bytes: bytes,
            decode_bytes,
            peak_used: 0,
            dev,
        })
    }

    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// Compiles (or loads) every kernel now, so that it stays out of timings.
    pub fn load_kernels(&mut self) -> Result<(), CudaError> {
        self.kernels.load_all()
    }

    /// KV cache bytes per token position (all layers, K and V, F16).
    pub fn kv_bytes_per_token(cfg: &ModelConfig) -> usize {
        cfg.n_layers * 2 * cfg.kv_dim() * 2
    }

    fn ensure_work(
        &mut self,
        n_tok: usize,
        n_seqs: usize,
        bt_stride: usize,
        splits: usize,
        m: usize,
    ) -> Result<(), CudaError> {
        let c = &self.cfg;
        let s = &self.dev.stream;
        let w = &mut self.work;
        if n_tok > w.cap_tok {
            let cap = n_tok.next_power_of_two();
            let qkv = c.q_dim() + 2 * c.kv_dim();
            grow(s, &mut w.x, cap * c.dim, "residual")?;
            grow(s, &mut w.h, cap * c.dim, "normed input")?;
            grow(s, &mut w.qkv, cap * qkv, "qkv")?;
            grow(s, &mut w.att, cap * c.q_dim(), "attention output")?;
            grow(s, &mut w.gu, cap * 2 * c.ffn_dim, "gate/up")?;
            grow(s, &mut w.act, cap * c.ffn_dim, "ffn activation")?;
            grow(s, &mut w.x16, cap * c.dim.max(c.q_dim()).max(c.ffn_dim), "f16 GEMM input")?;
            grow(s, &mut w.ids, cap, "token ids")?;
            grow(s, &mut w.pos, cap, "positions")?;
            grow(s, &mut w.slots, cap, "slots")?;
            grow(s, &mut w.tok_seq, cap, "token sequences")?;
            grow(s, &mut w.rows, cap, "logit rows")?;
            w.cap_tok = cap;
        }
        let part = n_tok * c.n_heads * splits;
        if part > w.cap_part {
            grow(s, &mut w.part_o, part * c.head_dim, "attention partials")?;
            grow(s, &mut w.part_ml, part * 2, "attention statistics")?;
            w.cap_part = part;
        }
        if n_seqs * bt_stride > w.cap_bt {
            grow(s, &mut w.bt, n_seqs * bt_stride, "block tables")?;
            w.cap_bt = n_seqs * bt_stride;
        }
        if m > w.cap_logits {
            grow(s, &mut w.hn, m * c.dim, "final norm")?;
            grow(s, &mut w.logits, m * c.vocab_size, "logits")?;
            w.cap_logits = m;
        }
        Ok(())
    }
}

/// The plan flattened to per-token arrays, as the kernels read them.
struct Flat {
    ids: Vec<u32>,     // [n_tok]
    pos: Vec<i32>,     // [n_tok]
    slots: Vec<i32>,   // [n_tok] cache slot of each new token
    tok_seq: Vec<i32>, // [n_tok] chunk index = block table row
    bt: Vec<i32>,      // [n_chunks, bt_stride]
    bt_stride: usize,
    rows: Vec<i32>, // [m] token rows whose logits are returned
    max_len: usize, // longest sequence after this step
}

impl CudaBackend {
    fn flatten(&self, plan: &StepPlan) -> Result<Flat, BackendError> {
        let mut seen = std::collections::HashSet::new();
        let bt_stride = plan.chunks.iter().map(|c| c.block_table.len()).max().unwrap_or(0).max(1);
        let n = plan.n_tokens();
        let mut f = Flat {
            ids: Vec::with_capacity(n),
            pos: Vec::with_capacity(n),
            slots: Vec::with_capacity(n),
            tok_seq: Vec::with_capacity(n),
            bt: vec![0; plan.chunks.len() * bt_stride],
            bt_stride,
            rows: Vec::new(),
            max_len: 1,
        };
        let bs = self.block_size;
        for (ci, c) in plan.chunks.iter().enumerate() {
            let err = |m: String| BackendError::Plan(format!("sequence {}: {m}", c.seq));
            if !seen.insert(c.seq) {
                return Err(err("appears twice in one step".into()));
            }
            if c.tokens.is_empty() {
                return Err(err("empty chunk".into()));
            }
            let end = c.start_pos + c.tokens.len();
            if c.block_table.len() * bs < end {
                return Err(err(format!(
                    "block table covers {} positions, the chunk reaches {end}",
                    c.block_table.len() * bs
                )));
            }
            if end > self.max_pos {
                return Err(err(format!(
                    "position {} is beyond the {} positions this backend was set up for",
                    end - 1,
                    self.max_pos
                )));
            }
            if let Some(&b) = c.block_table.iter().find(|&&b| b as usize >= self.num_blocks) {
                return Err(err(format!("block {b} is beyond the pool of {}", self.num_blocks)));
            }
            if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
                return Err(err(format!("token id {t} is beyond the vocabulary ({})", self.cfg.vocab_size)));
            }
            for (i, &b) in c.block_table.iter().enumerate() {
                f.bt[ci * bt_stride + i] = b as i32;
            }
            for (i, &t) in c.tokens.iter().enumerate() {
                let p = c.start_pos + i;
                f.ids.push(t);
                f.pos.push(p as i32);
                f.slots.push((c.block_table[p / bs] as usize * bs + p % bs) as i32);
                f.tok_seq.push(ci as i32);
            }
            if c.want_logits {
                f.rows.push((f.ids.len() - 1) as i32);
            }
            f.max_len = f.max_len.max(end);
        }
        Ok(f)
    }

    fn upload<T: DeviceRepr>(&self, host: &[T], buf: &mut Option<CudaSlice<T>>, what: &str) -> Result<(), CudaError> {
        let Some(b) = buf.as_mut() else { return Ok(()) };
        if host.is_empty() {
            return Ok(());
        }
        let mut view = b.slice_mut(0..host.len());
        self.dev.stream.memcpy_htod(host, &mut view).map_err(CudaError::driver(format!("uploading {what}")))
    }

    fn forward(&mut self, f: &Flat) -> Result<Vec<Vec<f32>>, CudaError> {
        let n = f.ids.len();
        let m = f.rows.len();
        let splits = l::attn_splits(f.max_len);
        self.ensure_work(n, f.bt.len() / f.bt_stride, f.bt_stride, splits, m)?;
        let mut w = std::mem::take(&mut self.work);
        let r = (|| {
            self.upload(&f.ids, &mut w.ids, "token ids")?;
            self.upload(&f.pos, &mut w.pos, "positions")?;
            self.upload(&f.slots, &mut w.slots, "slots")?;
            self.upload(&f.tok_seq, &mut w.tok_seq, "token sequences")?;
            self.upload(&f.bt, &mut w.bt, "block tables")?;
            self.upload(&f.rows, &mut w.rows, "logit rows")?;
            self.run_layers(&w, f, n, m)
        })();
        self.work = w;
        r
    }

    fn run_layers(&mut self, w: &Work, f: &Flat, n: usize, m: usize) -> Result<Vec<Vec<f32>>, CudaError> {
        let c = &self.cfg;
        let s: &CudaStream = &self.dev.stream;
        let (dim, qd, kvd, hd, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.head_dim, c.ffn_dim);
        let qkv_w = qd + 2 * kvd;
        let (x, h, qkv, att, gu, act) =
            (ptr(&w.x, s), ptr(&w.h, s), ptr(&w.qkv, s), ptr(&w.att, s), ptr(&w.gu, s), ptr(&w.act, s));
        let (pos, slots) = (ptr(&w.pos, s), ptr(&w.slots, s));
        let k = &mut self.kernels;
        let mut mm = Mm { s, blas: &self.blas, x16: ptr(&w.x16, s) };
        let n_slots = self.num_blocks * self.block_size;

        l::Embedding { table: Dev::of(&self.embd, s), ids: ptr(&w.ids, s), out: x, vocab: c.vocab_size, n_tok: n, dim }
            .launch(k, s)?;
        let norm = |x: Dev<f32>, wt: Dev<f32>, out: Dev<f32>, n_inner: usize, d: usize, stride: usize| l::RmsNorm {
            x,
            w: wt,
            out,
            rows: None,
            n_src_rows: n,
            n_outer: n,
            n_inner,
            dim: d,
            in_stride: stride,
            out_stride: stride,
            eps: c.rms_eps,
        };
        for lw in &self.layers {
            norm(x, Dev::of(&lw.attn_norm, s), h, 1, dim, dim).launch(k, s)?;
            let bias = lw.bqkv.as_ref().map(|b| Dev::of(b, s));
            mm.run(k, Lin { w: Dev::of(&lw.wqkv, s), rows: qkv_w, cols: dim, bias }, h, n, qkv, false)?;
            if let Some(qn) = &lw.q_norm {
                norm(qkv, Dev::of(qn, s), qkv, c.n_heads, hd, qkv_w).launch(k, s)?;
            }
            if let Some(kn) = &lw.k_norm {
                norm(qkv.offset(qd), Dev::of(kn, s), qkv.offset(qd), c.n_kv_heads, hd, qkv_w).launch(k, s)?;
            }
            l::Rope {
                x: qkv,
                pos,
                cos: Dev::of(&self.rope_cos, s),
                sin: Dev::of(&self.rope_sin, s),
                max_pos: self.max_pos,
                n_tok: n,
                n_heads: c.n_heads + c.n_kv_heads,
                head_dim: hd,
                stride: qkv_w,
                halves: c.rope_style == RopeStyle::Halves,
            }
            .launch(k, s)?;
            let (kc, vc) = (Dev::of(&lw.k_cache, s), Dev::of(&lw.v_cache, s));
            l::KvStore {
                qkv,
                k_cache: kc,
                v_cache: vc,
                slots,
                n_slots,
                n_tok: n,
                kv_dim: kvd,
                stride: qkv_w,
                k_off: qd,
                v_off: qd + kvd,
            }
            .launch(k, s)?;
            l::Attention {
                q: qkv,
                k_cache: kc,
                v_cache: vc,
                block_tables: ptr(&w.bt, s),
                tok_seq: ptr(&w.tok_seq, s),
                pos,
                part_o: ptr(&w.part_o, s),
                part_ml: ptr(&w.part_ml, s),
                out: att,
                n_slots,
                n_seqs: f.bt.len() / f.bt_stride,
                n_tok: n,
                n_heads: c.n_heads,
                n_kv: c.n_kv_heads,
                head_dim: hd,
                block_size: self.block_size,
                bt_stride: f.bt_stride,
                q_stride: qkv_w,
                out_stride: qd,
                max_len: f.max_len,
            }
            .launch(k, s)?;
            mm.run(k, Lin { w: Dev::of(&lw.wo, s), rows: dim, cols: qd, bias: None }, att, n, x, true)?;
            norm(x, Dev::of(&lw.ffn_norm, s), h, 1, dim, dim).launch(k, s)?;
            mm.run(k, Lin { w: Dev::of(&lw.wgu, s), rows: 2 * ffn, cols: dim, bias: None }, h, n, gu, false)?;
            l::SiluMul { gu, out: act, n_tok: n, ffn }.launch(k, s)?;
            mm.run(k, Lin { w: Dev::of(&lw.wdown, s), rows: dim, cols: ffn, bias: None }, act, n, x, true)?;
        }
        if m == 0 {
            return Ok(Vec::new());
        }
        let (hn, logits) = (ptr(&w.hn, s), ptr(&w.logits, s));
        l::RmsNorm {
            x,
            w: Dev::of(&self.output_norm, s),
            out: hn,
            rows: Some(ptr(&w.rows, s)),
            n_src_rows: n,
            n_outer: m,
            n_inner: 1,
            dim,
            in_stride: dim,
            out_stride: dim,
            eps: c.rms_eps,
        }
        .launch(k, s)?;
        let head = Dev::of(self.output.as_ref().unwrap_or(&self.embd), s);
        mm.run(k, Lin { w: head, rows: c.vocab_size, cols: dim, bias: None }, hn, m, logits, false)?;
        let all = w.logits.as_ref().map(|b| b.slice(0..m * c.vocab_size));
        let host = match all {
            Some(v) => self.dev.stream.clone_dtoh(&v).map_err(CudaError::driver("downloading logits"))?,
            None => Vec::new(),
        };
        Ok(host.chunks_exact(c.vocab_size).map(|r| r.to_vec()).collect())
    }
}

/// A weight matrix `[rows, cols]` F16 with an optional bias `[rows]`.
struct Lin {
    w: Dev<u16>,
    rows: usize,
    cols: usize,
    bias: Option<Dev<f32>>,
}

/// Matrix products of the step: GEMV for up to 8 tokens, cuBLAS above (input cast to F16).
struct Mm<'a> {
    s: &'a CudaStream,
    blas: &'a CudaBlas,
    x16: Dev<u16>,
}

impl Mm<'_> {
    /// `out[t, :rows] (+)= lin(x[t, :cols])` for `n` tokens; `x` `[n, cols]` and `out`
    /// `[n, rows]`, both contiguous.
    fn run(
        &mut self,
        k: &mut Kernels,
        lin: Lin,
        x: Dev<f32>,
        n: usize,
        out: Dev<f32>,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        if n <= l::GEMV_MAX_TOKENS {
            let g = l::Gemv {
                w: lin.w,
                x,
                out,
                bias: lin.bias,
                rows: lin.rows,
                cols: lin.cols,
                n_tok: n,
                x_stride: lin.cols,
                out_stride: lin.rows,
                accumulate,
            };
            return g.launch(k, self.s);
        }
        l::CastF16 { x, out: self.x16, n: n * lin.cols }.launch(k, self.s)?;
        l::Gemm {
            w: lin.w,
            x: self.x16,
            out,
            rows: lin.rows,
            cols: lin.cols,
            n_tok: n,
            out_stride: lin.rows,
            accumulate,
        }
        .launch(self.blas)?;
        if let Some(b) = lin.bias {
            l::BiasAdd { x: out, b, n_tok: n, n: lin.rows, stride: lin.rows }.launch(k, self.s)?;
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    fn describe(&self) -> String {
        format!("{} [{}]", self.dev.describe(), self.kernels.source().describe())
    }
    fn step(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        let f = self.flatten(plan)?;
        if f.ids.is_empty() {
            return Ok(Vec::new());
        }
        let out = self.forward(&f)?;
        if let Ok((free, total)) = self.dev.mem_info() {
            self.peak_used = self.peak_used.max(total.saturating_sub(free) as u64);
        }
        Ok(out)
    }
    fn decode_weight_bytes(&self) -> u64 {
        self.decode_bytes
    }
    fn kv_bytes_per_position(&self) -> u64 {
        Self::kv_bytes_per_token(&self.cfg) as u64
    }
    fn peak_memory_bytes(&self) -> Option<u64> {
        Some(self.peak_used)
    }
    fn measure_copy_bandwidth(&mut self) -> Option<f64> {
        // 1 GiB each way when there is room (several times any L2), else a quarter of the free memory.
        let free = self.dev.mem_info().ok()?.0;
        let bytes = (1usize << 30).min(free / 4);
        self.dev.copy_bandwidth(bytes, 10).ok()
    }
}
