//! The CPU reference backend: f32 activations, quantized dot products on the packed weights,
//! rayon across output rows, a paged f32 KV cache (holding the values an 8-bit cache reads
//! back when made with [`CpuBackend::with_kv_type`] `Q8`: the twin of the GPU's `--kv-cache q8`).
//! The forward pass embeds the step's tokens,
//! walks the layers (`layers`: one file per mixer and FFN kind) and computes the logits.

mod attn;
#[cfg(test)]
mod bench_tests;
pub mod deltanet;
mod gemv;
pub mod hybrid;
mod layers;
pub mod matmul;
pub mod moe;
pub mod ops;
mod paged;
pub mod route_stats;
pub mod tap;
pub mod tensor_parallel;

use crate::backend::kv_type::KvType;
use crate::backend::{Backend, BackendError};
use crate::engine::plan::{PlanLimits, StepPlan};
use crate::model::config::ModelConfig;
use crate::model::layer::Ffn;
use crate::model::weights::ModelWeights;

use layers::{Hooks, KvCaches, LayerScratch, Rope, StepCtx};
use matmul::matmul;
use tap::ActivationTap;

pub struct CpuBackend {
    cfg: ModelConfig,
    w: ModelWeights,
    block_size: usize,
    num_blocks: usize,
    /// Per layer: `[num_blocks, block_size, n_kv_heads, head_dim]` f32.
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    /// RoPE of the attention layers (partial in hybrid models).
    rope: Rope,
    /// The cache type whose values the caches hold (`kv_type::store_row` on every write).
    kv_type: KvType,
    /// Cached K/V rounded to F16 as the GPU's F16 cache stores them (diagnosis: the GPU's
    /// differences apart from its cache); off, the F16 cache's values stay f32 here.
    round_f16_cache: bool,
    scratch: Scratch,
    /// Observer of matrix inputs (calibration, eval); `None` in normal runs.
    tap: Option<Box<dyn ActivationTap>>,
    /// Hybrid models: the recurrent-state slots of the linear-attention layers.
    states: hybrid::RecurrentStates,
    /// A tensor-parallel rank: its place and the all-reduce it shares (`tensor_parallel`).
    rank: Option<tensor_parallel::RankLink>,
}

impl CpuBackend {
    pub fn new(cfg: ModelConfig, w: ModelWeights, num_blocks: usize, block_size: usize) -> Self {
        let per_layer = num_blocks * block_size * cfg.kv_dim();
        let (inv_freq, rotary_dim) = cfg.rope_rotation(w.rope_freq_factors.as_deref());
        let rope = Rope { inv_freq, rotary_dim, style: cfg.rope_style };
        // Linear-attention layers of hybrid models keep no K/V.
        let kv = |l: usize| if cfg.has_kv(l) { vec![0f32; per_layer] } else { Vec::new() };
        CpuBackend {
            k_cache: (0..cfg.n_layers).map(kv).collect(),
            v_cache: (0..cfg.n_layers).map(kv).collect(),
            states: hybrid::RecurrentStates::new(&cfg),
            cfg,
            w,
            block_size,
            num_blocks,
            rope,
            kv_type: KvType::F16,
            round_f16_cache: false,
            scratch: Scratch::default(),
            tap: None,
            rank: None,
        }
    }

    /// The backend with caches that hold what a cache of type `kv` reads back (`Q8`: every
    /// group of 32 values of a head vector through `kv_type::q8_round_trip`, as the GPU's 8-bit
    /// cache stores and loads them); refused for head sizes the type cannot take.
    pub fn with_kv_type(mut self, kv: KvType) -> Result<Self, BackendError> {
        if let Some(why) = kv.refusal(self.cfg.head_dim) {
            return Err(BackendError::Plan(why));
        }
        self.kv_type = kv;
        Ok(self)
    }

    /// The backend with an F16 cache that holds F16 values (each cached K/V value rounded to
    /// the nearest F16, as the GPU stores it), not the f32 values of the reference.
    pub fn with_rounded_f16_cache(mut self) -> Self {
        self.round_f16_cache = true;
        self
    }

    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Installs an activation observer (replacing any previous one).
    pub fn set_tap(&mut self, tap: Box<dyn ActivationTap>) {
        self.tap = Some(tap);
    }

    /// Removes the observer and gives it back.
    pub fn take_tap(&mut self) -> Option<Box<dyn ActivationTap>> {
        self.tap.take()
    }

    /// Hybrid models: offers the engine at most `n` slots for prefix snapshots of recurrent
    /// states (as a GPU's planned pool does; unbounded by default).
    pub fn set_state_snapshot_capacity(&mut self, n: usize) {
        self.states.set_max_snapshots(n);
    }

    /// KV cache bytes per token position (all layers, K and V).
    pub fn kv_bytes_per_token(cfg: &ModelConfig) -> usize {
        cfg.n_kv_layers() * 2 * cfg.kv_dim() * 4
    }

    /// Bytes of one sequence's recurrent state (hybrid models; 0 for others).
    pub fn state_bytes_per_seq(&self) -> usize {
        self.cfg.state_bytes_per_seq()
    }

    fn check_plan(&self, plan: &StepPlan) -> Result<(), BackendError> {
        let lim = PlanLimits {
            block_size: self.block_size,
            num_blocks: self.num_blocks,
            vocab_size: self.cfg.vocab_size,
            max_pos: None,
        };
        Ok(plan.validate(&lim)?)
    }
}

impl Backend for CpuBackend {
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
        let kv = if self.kv_type == KvType::F16 { String::new() } else { format!(", KV cache {}", self.kv_type) };
        format!("cpu ({} threads, {}{kv})", rayon::current_num_threads(), crate::sys::cpu::cpu_path().describe())
    }

    fn decode_weight_bytes(&self) -> u64 {
        let mut n = self.w.output.bytes().len() + self.w.token_embd.row_bytes();
        for l in &self.w.layers {
            let l = l.typed();
            n += l.mixer.matrices().iter().map(|t| t.bytes().len()).sum::<usize>();
            n += match l.ffn {
                Ffn::Dense(d) => d.gate.bytes().len() + d.up.bytes().len() + d.down.bytes().len(),
                // The router and the experts one token uses (of average size), the shared expert.
                Ffn::Moe(m) => {
                    let (router, expert) = m.bytes_router_and_expert();
                    router + m.n_used * expert + m.shared.as_ref().map_or(0, |s| s.bytes())
                }
            };
        }
        n as u64
    }

    fn kv_bytes_per_position(&self) -> u64 {
        Self::kv_bytes_per_token(&self.cfg) as u64
    }

    fn step(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        self.check_plan(plan)?;
        self.states.begin_step(plan)?;
        // Run the whole step on a pool worker: the parallel regions inside then fork from a
        // worker's own deque (cheap, the other workers are still spinning) instead of being
        // injected from outside the pool and waking sleeping threads ~200 times per token.
        let this = &mut *self;
        let logits = rayon::scope(|_| this.forward(plan));
        self.states.end_step(plan);
        Ok(logits)
    }

    fn state_slots(&self) -> crate::backend::StateSlots {
        self.states.slots()
    }
}

/// Activation buffers kept across steps (grown on demand, never shrunk): a decode step
/// allocates nothing but its returned logits.
#[derive(Default)]
struct Scratch {
    ids: Vec<u32>,
    pos: Vec<usize>,
    x: Vec<f32>,      // [n, dim] residual stream
    logits: Vec<f32>, // [m, vocab]
    layers: LayerScratch,
}

/// The first `n` elements of `buf`, growing it if needed (contents unspecified).
fn take(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

impl CpuBackend {
    /// The forward pass of a checked plan; logits of the chunks that want them, in plan order.
    fn forward(&mut self, plan: &StepPlan) -> Vec<Vec<f32>> {
        let c = &self.cfg;
        let dim = c.dim;
        let s = &mut self.scratch;

        // Flatten the plan: token t belongs to chunk tables[t] at position pos[t].
        s.ids.clear();
        s.pos.clear();
        let mut tables: Vec<&[u32]> = Vec::with_capacity(plan.n_tokens());
        for ch in &plan.chunks {
            for (i, &t) in ch.tokens.iter().enumerate() {
                s.ids.push(t);
                s.pos.push(ch.start_pos + i);
                tables.push(&ch.block_table);
            }
        }
        let n = s.ids.len();
        let (ids, pos) = (&s.ids, &s.pos);
        let (cos, sin) = ops::rope_table(pos, &self.rope.inv_freq);

        let x = take(&mut s.x, n * dim);
        for (t, &id) in ids.iter().enumerate() {
            crate::model::quant::dequantize_row(
                self.w.token_embd.dtype,
                self.w.token_embd.row(id as usize),
                &mut x[t * dim..(t + 1) * dim],
            );
        }
        let cx = StepCtx {
            c,
            plan,
            tables: &tables,
            pos,
            cos: &cos,
            sin: &sin,
            rope: &self.rope,
            block_size: self.block_size,
            kv_type: self.kv_type,
            round_f16_cache: self.round_f16_cache,
        };
        let kv = KvCaches { k: &mut self.k_cache, v: &mut self.v_cache };
        let mut hooks = Hooks { tap: self.tap.as_deref_mut(), rank: &self.rank };
        layers::run(&cx, &self.w.layers, kv, self.states.layers(), &mut s.layers, &mut hooks, x);

        if let Some(t) = self.tap.as_mut() {
            let mut all = vec![0f32; n * dim]; // [n, dim] final-normed, every token
            ops::rmsnorm(x, &self.w.output_norm, c.rms_eps, &mut all);
            t.matmul_input(&[&self.w.output.name], &all, n);
        }
        if self.rank.as_ref().is_some_and(|r| r.rank > 0) {
            return Vec::new(); // the output head is replicated: rank 0 computes the logits
        }
        // Logits only for the last token of chunks that want them.
        let mut rows = Vec::new();
        let mut t0 = 0;
        for ch in &plan.chunks {
            let last = t0 + ch.tokens.len() - 1;
            if ch.want_logits {
                rows.push(last);
            }
            t0 += ch.tokens.len();
        }
        let m = rows.len();
        if m == 0 {
            return Vec::new();
        }
        // The final-normed rows reuse the layers' normed-input buffer (`m <= n` rows of `dim`).
        let hn = take(&mut s.layers.h, m * dim);
        for (i, &r) in rows.iter().enumerate() {
            ops::rmsnorm_row(
                &x[r * dim..(r + 1) * dim],
                &self.w.output_norm,
                c.rms_eps,
                &mut hn[i * dim..(i + 1) * dim],
            );
        }
        let logits = take(&mut s.logits, m * c.vocab_size);
        matmul(&self.w.output, hn, m, logits);
        logits.chunks_exact(c.vocab_size).map(|r| r.to_vec()).collect()
    }
}
