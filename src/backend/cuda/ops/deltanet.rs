//! Launchers of `kernels/deltanet.cu`, the Gated DeltaNet layer of the hybrid models (its
//! gated attention layer: hybrid_attn.rs). Same conventions as `launch`: a struct of arguments,
//! shape checks, `#[repr(C)]` params mirroring the kernel's struct. CPU twin:
//! `backend::cpu::deltanet`.
//!
//! The step's tokens are grouped into chunks (one per sequence, consecutive tokens); the chunk
//! table `[1 + 3 * max_chunks]` i32 holds the chunk count, then per chunk (first token, tokens,
//! state slot). The host guarantees that the slots and tokens it names are in range.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{blocks_for, check, extent, grid_yz, i32_of, launch, need, Dev};
use super::qlaunch::q8x_planes;

/// Longest conv kernel `dn_conv_silu_f32` holds in registers (`DN_MAX_K`).
pub const DN_MAX_K: usize = 8;
/// Largest key head size of `dn_recur_f32` (`DN_LANES * DN_MAX_ROWS`).
pub const DN_MAX_DK: usize = 128;
/// Largest value head size of `dn_recur_f32` (a block of `4 d_v` threads, at most 512:
/// `DN_RECUR_MAX_THREADS`, the launch bound that keeps its registers within an SM's).
pub const DN_MAX_DV: usize = 128;

/// Where one linear layer's state lives in the pool `[n_slots, slot_stride]`.
#[derive(Clone, Copy, Debug)]
pub struct StatePool {
    pub state: Dev<f32>,
    pub slot_stride: usize,
    /// Start of this layer's conv state `[K - 1, C]` in a slot; its matrices follow.
    pub layer_off: usize,
    /// Chunk table and the most chunks a launch covers.
    pub chunks: Dev<i32>,
    pub max_chunks: usize,
}

impl StatePool {
    fn check(&self, kernel: &'static str, layer_len: usize) -> Result<(), CudaError> {
        need(kernel, "chunk table", self.chunks, 1 + 3 * self.max_chunks)?;
        check(kernel, self.layer_off + layer_len <= self.slot_stride, || {
            format!(
                "layer state {}..{} beyond the slot of {}",
                self.layer_off,
                self.layer_off + layer_len,
                self.slot_stride
            )
        })?;
        need(kernel, "state pool", self.state, self.slot_stride)?;
        grid_yz(kernel, self.max_chunks, "chunks").map(|_| ())
    }
}

// ---------------------------------------------------------------- deltanet.cu: conv
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DnConvParams {
    x: u64,
    out: u64,
    w: u64,
    state: u64,
    chunks: u64,
    slot_stride: i64,
    layer_off: i64,
    max_chunks: i32,
    channels: i32,
    kernel: i32,
    x_stride: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for DnConvParams {}

/// Causal depthwise conv1d + SiLU of the first `channels` columns of `x` (`[n_tok, x_stride]`)
/// into `out` (`[n_tok, channels]`), weights `[channels, kernel]`; each chunk starts from and
/// updates its slot's conv state.
pub struct DnConv {
    pub x: Dev<f32>,
    pub x_stride: usize,
    pub out: Dev<f32>,
    pub w: Dev<f32>,
    pub pool: StatePool,
    pub n_tok: usize,
    pub channels: usize,
    pub kernel: usize,
}

impl DnConv {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "dn_conv_silu_f32";
        let (c, kk) = (self.channels, self.kernel);
        check(K, (2..=DN_MAX_K).contains(&kk), || format!("conv kernel {kk} (2..={DN_MAX_K})"))?;
        check(K, c <= self.x_stride, || "channels overlap the input stride".into())?;
        need(K, "input", self.x, extent(self.n_tok, self.x_stride, c))?;
        need(K, "output", self.out, self.n_tok * c)?;
        need(K, "weights", self.w, c * kk)?;
        self.pool.check(K, (kk - 1) * c)?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = DnConvParams {
            x: self.x.ptr,
            out: self.out.ptr,
            w: self.w.ptr,
            state: self.pool.state.ptr,
            chunks: self.pool.chunks.ptr,
            slot_stride: self.pool.slot_stride as i64,
            layer_off: self.pool.layer_off as i64,
            max_chunks: i32_of(K, self.pool.max_chunks)?,
            channels: i32_of(K, c)?,
            kernel: kk as i32,
            x_stride: i32_of(K, self.x_stride)?,
        };
        launch(k, s, K, (blocks_for(K, c, 128)?, self.pool.max_chunks as u32, 1), 128, 0, &p)
    }
}

// ---------------------------------------------------------------- deltanet.cu: prep
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DnPrepParams {
    mixed: u64,
    proj: u64,
    neg_a: u64,
    dt_bias: u64,
    n_tok: i32,
    n_k: i32,
    d_k: i32,
    n_v: i32,
    channels: i32,
    proj_stride: i32,
    b_off: i32,
    a_off: i32,
    q_scale: f32,
    eps: f32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for DnPrepParams {}

/// L2 norm of the `n_k` q and `n_k` k heads (`d_k` each) at the start of every `mixed` row
/// (`[n_tok, channels]`; q also times `1/sqrt(d_k)`), and in place in `proj`
/// (`[n_tok, proj_stride]`): the `n_v` beta logits at `b_off` become `sigmoid(b)`, the decay
/// inputs at `a_off` become `g = neg_a * softplus(a + dt_bias)`.
pub struct DnPrep {
    pub mixed: Dev<f32>,
    pub proj: Dev<f32>,
    pub neg_a: Dev<f32>,
    pub dt_bias: Dev<f32>,
    pub n_tok: usize,
    pub n_k: usize,
    pub d_k: usize,
    pub n_v: usize,
    pub channels: usize,
    pub proj_stride: usize,
    pub b_off: usize,
    pub a_off: usize,
}

impl DnPrep {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "dn_prep_f32";
        check(K, 2 * self.n_k * self.d_k <= self.channels, || "q and k heads overlap the row".into())?;
        check(K, self.b_off + self.n_v <= self.proj_stride && self.a_off + self.n_v <= self.proj_stride, || {
            "gate columns beyond the projection row".into()
        })?;
        need(K, "mixed", self.mixed, self.n_tok * self.channels)?;
        need(K, "projection", self.proj, extent(self.n_tok, self.proj_stride, self.proj_stride))?;
        need(K, "decay rates", self.neg_a, self.n_v)?;
        need(K, "dt bias", self.dt_bias, self.n_v)?;
        grid_yz(K, self.n_tok, "tokens")?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = DnPrepParams {
            mixed: self.mixed.ptr,
            proj: self.proj.ptr,
            neg_a: self.neg_a.ptr,
            dt_bias: self.dt_bias.ptr,
            n_tok: self.n_tok as i32,
            n_k: i32_of(K, self.n_k)?,
            d_k: i32_of(K, self.d_k)?,
            n_v: i32_of(K, self.n_v)?,
            channels: i32_of(K, self.channels)?,
            proj_stride: i32_of(K, self.proj_stride)?,
            b_off: i32_of(K, self.b_off)?,
            a_off: i32_of(K, self.a_off)?,
            q_scale: 1.0 / (self.d_k as f32).sqrt(),
            eps: 1e-6,
        };
        launch(k, s, K, (i32_of(K, 2 * self.n_k + 1)? as u32, self.n_tok as u32, 1), 32, 0, &p)
    }
}

// ---------------------------------------------------------------- deltanet.cu: conv + prep
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DnConvPrepParams {
    x: u64,
    out: u64,
    w: u64,
    state: u64,
    chunks: u64,
    proj: u64,
    neg_a: u64,
    dt_bias: u64,
    slot_stride: i64,
    layer_off: i64,
    max_chunks: i32,
    channels: i32,
    kernel: i32,
    x_stride: i32,
    n_k: i32,
    d_k: i32,
    n_v: i32,
    b_off: i32,
    a_off: i32,
    q_scale: f32,
    eps: f32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (trailing padding included).
unsafe impl DeviceRepr for DnConvPrepParams {}

/// [`DnConv`] then [`DnPrep`] in one launch (`dn_conv_prep_f32`): the conv's output is the
/// prep's `mixed`, its input the prep's `proj` (the layer's projection), as in a layer step.
pub struct DnConvPrep<'a> {
    pub conv: &'a DnConv,
    pub prep: &'a DnPrep,
}

impl DnConvPrep<'_> {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "dn_conv_prep_f32";
        let (c, p) = (self.conv, self.prep);
        check(K, c.out.ptr == p.mixed.ptr && c.x.ptr == p.proj.ptr && c.x_stride == p.proj_stride, || {
            "the conv must write the prep's rows and read its projection".into()
        })?;
        check(K, c.channels == p.channels && c.n_tok == p.n_tok, || "conv and prep shapes differ".into())?;
        check(K, (1..=DN_MAX_K).contains(&c.kernel), || format!("conv kernel {} (1..=8)", c.kernel))?;
        check(K, p.d_k > 0 && p.d_k <= 128 && 2 * p.n_k * p.d_k <= c.channels, || {
            format!("{} q/k heads of {} in {} channels (heads of at most 128)", 2 * p.n_k, p.d_k, c.channels)
        })?;
        check(K, p.b_off + p.n_v <= p.proj_stride && p.a_off + p.n_v <= p.proj_stride, || {
            "gate columns beyond the projection row".into()
        })?;
        check(K, c.channels <= c.x_stride, || "channels beyond the input stride".into())?;
        need(K, "input", c.x, extent(c.n_tok, c.x_stride, c.x_stride))?;
        need(K, "output", c.out, c.n_tok * c.channels)?;
        need(K, "weights", c.w, c.channels * c.kernel)?;
        need(K, "decay rates", p.neg_a, p.n_v)?;
        need(K, "dt bias", p.dt_bias, p.n_v)?;
        c.pool.check(K, (c.kernel - 1) * c.channels)?;
        if c.n_tok == 0 {
            return Ok(());
        }
        let prm = DnConvPrepParams {
            x: c.x.ptr,
            out: c.out.ptr,
            w: c.w.ptr,
            state: c.pool.state.ptr,
            chunks: c.pool.chunks.ptr,
            proj: p.proj.ptr,
            neg_a: p.neg_a.ptr,
            dt_bias: p.dt_bias.ptr,
            slot_stride: c.pool.slot_stride as i64,
            layer_off: c.pool.layer_off as i64,
            max_chunks: i32_of(K, c.pool.max_chunks)?,
            channels: i32_of(K, c.channels)?,
            kernel: c.kernel as i32,
            x_stride: i32_of(K, c.x_stride)?,
            n_k: i32_of(K, p.n_k)?,
            d_k: p.d_k as i32,
            n_v: i32_of(K, p.n_v)?,
            b_off: i32_of(K, p.b_off)?,
            a_off: i32_of(K, p.a_off)?,
            q_scale: 1.0 / (p.d_k as f32).sqrt(),
            eps: 1e-6,
        };
        let blocks = 2 * p.n_k + (c.channels - 2 * p.n_k * p.d_k).div_ceil(128) + 1;
        launch(k, s, K, (i32_of(K, blocks)? as u32, c.pool.max_chunks as u32, 1), 128, 0, &prm)
    }
}

// ---------------------------------------------------------------- deltanet.cu: recurrence
/// The delta rule's inputs that [`DnRecur`] and [`DnChunked`] share: the C `DnHeads`, the first
/// member of both params structs (kernels/deltanet.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DnHeadsParams {
    mixed: u64,
    proj: u64,
    out: u64,
    state: u64,
    chunks: u64,
    slot_stride: i64,
    mats_off: i64,
    max_chunks: i32,
    n_k: i32,
    n_v: i32,
    d_k: i32,
    d_v: i32,
    channels: i32,
    proj_stride: i32,
    b_off: i32,
    a_off: i32,
    tiled: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DnRecurParams {
    heads: DnHeadsParams,
    z: u64,
    norm_w: u64,
    z_stride: i32,
    eps: f32,
    qx: u64,
    ql: u64,
    xs: u64,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (its DnHeads base first,
// trailing padding included).
unsafe impl DeviceRepr for DnRecurParams {}

/// The delta rule of every chunk's tokens in order, per value head, from and into the slot's
/// matrices `[n_v, d_k, d_v]` (at `pool.layer_off + conv_len`): q and k heads from `mixed`
/// (after [`DnPrep`]), v heads after them, beta and g from `proj`; output `[n_tok, n_v d_v]`.
/// One token per chunk is the decode step; a prompt chunk runs its tokens in one launch.
pub struct DnRecur {
    pub mixed: Dev<f32>,
    pub proj: Dev<f32>,
    pub out: Dev<f32>,
    pub pool: StatePool,
    /// Offset of the matrices after the layer's conv state: `(K - 1) * C`.
    pub conv_len: usize,
    pub n_tok: usize,
    pub n_k: usize,
    pub n_v: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub channels: usize,
    pub proj_stride: usize,
    pub b_off: usize,
    pub a_off: usize,
    /// Value head `h` reads key head `h % n_k` (else `h / (n_v / n_k)`).
    pub tiled: bool,
}

impl DnRecur {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        self.launch_as(k, s, "dn_recur_f32", None, None)
    }

    /// The checks both forms make of the heads and buffers: value heads over key heads, the
    /// q|k|v heads within the mixed row, every buffer long enough for the step (the head sizes'
    /// own limits differ by form and are checked before).
    fn check_heads(&self, kn: &'static str) -> Result<(), CudaError> {
        let (nk, nv, dk, dv) = (self.n_k, self.n_v, self.d_k, self.d_v);
        check(kn, nk > 0 && nv.is_multiple_of(nk), || format!("{nv} value heads over {nk} key heads"))?;
        check(kn, 2 * nk * dk + nv * dv <= self.channels, || "heads overlap the mixed row".into())?;
        need(kn, "mixed", self.mixed, self.n_tok * self.channels)?;
        need(kn, "projection", self.proj, extent(self.n_tok, self.proj_stride, self.proj_stride))?;
        need(kn, "output", self.out, self.n_tok * nv * dv)?;
        self.pool.check(kn, self.conv_len + nv * dk * dv)
    }

    /// The params both forms' kernels start with (C `DnHeads`).
    fn heads(&self, kn: &'static str) -> Result<DnHeadsParams, CudaError> {
        Ok(DnHeadsParams {
            mixed: self.mixed.ptr,
            proj: self.proj.ptr,
            out: self.out.ptr,
            state: self.pool.state.ptr,
            chunks: self.pool.chunks.ptr,
            slot_stride: self.pool.slot_stride as i64,
            mats_off: (self.pool.layer_off + self.conv_len) as i64,
            max_chunks: i32_of(kn, self.pool.max_chunks)?,
            n_k: i32_of(kn, self.n_k)?,
            n_v: i32_of(kn, self.n_v)?,
            d_k: i32_of(kn, self.d_k)?,
            d_v: i32_of(kn, self.d_v)?,
            channels: i32_of(kn, self.channels)?,
            proj_stride: i32_of(kn, self.proj_stride)?,
            b_off: i32_of(kn, self.b_off)?,
            a_off: i32_of(kn, self.a_off)?,
            tiled: i32::from(self.tiled),
        })
    }

    /// `dn_recur_f32`, or with `norm` (its `o` this launch's `out`) `dn_recur_norm_f32`.
    fn launch_as(
        &self,
        k: &mut Kernels,
        s: &CudaStream,
        kn: &'static str,
        norm: Option<&DnGatedNorm>,
        xq: Option<Dev<u8>>,
    ) -> Result<(), CudaError> {
        let (nv, dk, dv) = (self.n_v, self.d_k, self.d_v);
        check(kn, dk.is_multiple_of(4) && dk <= DN_MAX_DK, || format!("key head size {dk} (a multiple of 4, <= 128)"))?;
        check(kn, dv.is_multiple_of(8) && dv <= DN_MAX_DV, || {
            format!("value head size {dv} (a multiple of 8, <= 128)")
        })?;
        self.check_heads(kn)?;
        let q8 = match xq {
            Some(xq) => {
                // Each head's d_v values are whole blocks (the kernel quantizes a head at a time).
                check(kn, dv.is_multiple_of(32), || format!("value head size {dv}: not whole 32-value blocks"))?;
                q8x_planes(kn, "int8 output", xq, self.n_tok, nv * dv)?
            }
            None => (0, 0, 0),
        };
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = DnRecurParams {
            heads: self.heads(kn)?,
            z: norm.map_or(0, |n| n.z.ptr),
            norm_w: norm.map_or(0, |n| n.w.ptr),
            z_stride: norm.map_or(Ok(0), |n| i32_of(kn, n.z_stride))?,
            eps: norm.map_or(0.0, |n| n.eps),
            qx: q8.0,
            ql: q8.1,
            xs: q8.2,
        };
        let grid = (i32_of(kn, nv)? as u32, self.pool.max_chunks as u32, 1);
        launch(k, s, kn, grid, (4 * dv) as u32, (2 * dk * 4) as u32, &p)
    }
}

/// [`DnRecur`] then [`DnGatedNorm`] on its output in one launch (`dn_recur_norm_f32`): a block
/// holds a whole value head's `d_v` outputs of a token, so the norm's sum of squares is a block
/// sum and each output is stored once, normalized. The decode step's form (one launch a linear
/// layer less); the chunked prefill keeps the two. With `xq` the normalized output is also
/// written as the int8 planes of the out projection's GEMV (layout `q8x_bytes(n_tok, n_v d_v)`,
/// the codes `QuantizeX` would write), so that product needs no quantize launch.
pub struct DnRecurNorm<'a> {
    pub recur: &'a DnRecur,
    pub norm: &'a DnGatedNorm,
    pub xq: Option<Dev<u8>>,
}

impl DnRecurNorm<'_> {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "dn_recur_norm_f32";
        let (r, n) = (self.recur, self.norm);
        check(K, n.o.ptr == r.out.ptr && n.n_tok == r.n_tok && n.n_v == r.n_v && n.d_v == r.d_v, || {
            "the norm must cover the recurrence's output rows".into()
        })?;
        let vd = n.n_v * n.d_v;
        check(K, vd <= n.z_stride, || "gates overlap their stride".into())?;
        need(K, "gates", n.z, extent(n.n_tok, n.z_stride, vd))?;
        need(K, "weight", n.w, n.d_v)?;
        r.launch_as(k, s, K, Some(n), self.xq)
    }
}

// ---------------------------------------------------------------- deltanet.cu: chunked form
/// Tokens of one sub-chunk of the chunked delta rule (`DN_CH`).
pub const DN_CH: usize = 32;
/// State columns one block of `dn_chunk_scan_f32` holds (`DN_COLS`).
pub const DN_COLS: usize = 16;
/// f32 values per (token, value head) of the sub-chunk table (`DN_AB_ROW`: rows of A and B, G).
pub const DN_AB_ROW: usize = 2 * DN_CH + 1;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DnChunkParams {
    heads: DnHeadsParams,
    ab: u64,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (its DnHeads base first).
unsafe impl DeviceRepr for DnChunkParams {}

/// The delta rule of every chunk in the chunked (WY) form, the prefill path: the same inputs,
/// state and output as [`DnRecur`] (`recur`), plus the sub-chunk table `ab`
/// `[n_tok, n_v, DN_AB_ROW]` f32; `max_count`: the most tokens of one chunk (the host's
/// table says it). `dn_chunk_prep_f32` then `dn_chunk_scan_f32` (kernels/deltanet.cu).
pub struct DnChunked<'a> {
    pub recur: &'a DnRecur,
    pub ab: Dev<f32>,
    pub max_count: usize,
}

impl DnChunked<'_> {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "dn_chunk_scan_f32";
        let r = self.recur;
        let (nv, dk, dv) = (r.n_v, r.d_k, r.d_v);
        check(K, dk <= DN_MAX_DK && dk > 0, || format!("key head size {dk} (<= 128)"))?;
        check(K, dv.is_multiple_of(DN_COLS) && dv > 0, || format!("value head size {dv} (a multiple of {DN_COLS})"))?;
        r.check_heads(K)?;
        check(K, self.max_count <= r.n_tok, || {
            format!("a chunk of {} tokens in a step of {}", self.max_count, r.n_tok)
        })?;
        need(K, "sub-chunk table", self.ab, r.n_tok * nv * DN_AB_ROW)?;
        if r.n_tok == 0 || self.max_count == 0 {
            return Ok(());
        }
        let p = DnChunkParams { heads: r.heads(K)?, ab: self.ab.ptr };
        let (nv32, chunks) = (i32_of(K, nv)? as u32, r.pool.max_chunks as u32);
        let subs = grid_yz(K, self.max_count.div_ceil(DN_CH), "sub-chunks")?;
        let prep_smem = (2 * DN_CH * (dk + 1) * 4) as u32;
        launch(k, s, "dn_chunk_prep_f32", (nv32, subs, chunks), 256, prep_smem, &p)?;
        // S columns, X, A, B, G, P, R, U, E (kernels/deltanet.cu).
        let scan = dk * DN_COLS + DN_CH * (dk + 1) + 2 * DN_CH * DN_CH + 2 * DN_CH + 3 * DN_CH * DN_COLS;
        launch(k, s, K, (nv32, (dv / DN_COLS) as u32, chunks), 256, (scan * 4) as u32, &p)
    }
}

// ---------------------------------------------------------------- deltanet.cu: gated norm
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DnNormParams {
    o: u64,
    z: u64,
    w: u64,
    n_tok: i32,
    n_v: i32,
    d_v: i32,
    z_stride: i32,
    eps: f32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (trailing padding included).
unsafe impl DeviceRepr for DnNormParams {}

/// In place on `o` (`[n_tok, n_v d_v]`): per head `rmsnorm(o) * w * silu(z)`, `z` from
/// `[n_tok, z_stride]` (head `h` at column `h d_v`), weight `[d_v]`.
pub struct DnGatedNorm {
    pub o: Dev<f32>,
    pub z: Dev<f32>,
    pub z_stride: usize,
    pub w: Dev<f32>,
    pub n_tok: usize,
    pub n_v: usize,
    pub d_v: usize,
    pub eps: f32,
}

impl DnGatedNorm {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "dn_gated_norm_f32";
        let vd = self.n_v * self.d_v;
        check(K, vd <= self.z_stride, || "gates overlap their stride".into())?;
        need(K, "output", self.o, self.n_tok * vd)?;
        need(K, "gates", self.z, extent(self.n_tok, self.z_stride, vd))?;
        need(K, "weight", self.w, self.d_v)?;
        grid_yz(K, self.n_tok, "tokens")?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = DnNormParams {
            o: self.o.ptr,
            z: self.z.ptr,
            w: self.w.ptr,
            n_tok: self.n_tok as i32,
            n_v: i32_of(K, self.n_v)?,
            d_v: i32_of(K, self.d_v)?,
            z_stride: i32_of(K, self.z_stride)?,
            eps: self.eps,
        };
        launch(k, s, K, (i32_of(K, self.n_v)? as u32, self.n_tok as u32, 1), 32, 0, &p)
    }
}
