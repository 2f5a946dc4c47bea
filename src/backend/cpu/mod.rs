//! The CPU reference backend: f32 activations, quantized dot products on the packed weights,
//! rayon across output rows, a paged f32 KV cache.

pub mod matmul;
pub mod ops;

use crate::backend::{Backend, BackendError};
use crate::engine::plan::StepPlan;
use crate::model::config::ModelConfig;
use crate::model::weights::ModelWeights;

use matmul::matmul;
use ops::PagedKv;

pub struct CpuBackend {
    cfg: ModelConfig,
    w: ModelWeights,
    block_size: usize,
    num_blocks: usize,
    /// Per layer: `[num_blocks, block_size, n_kv_heads, head_dim]` f32.
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    /// `[head_dim / 2]`: RoPE inverse frequencies with the file's scaling applied.
    inv_freq: Vec<f32>,
}

impl CpuBackend {
    pub fn new(cfg: ModelConfig, w: ModelWeights, num_blocks: usize, block_size: usize) -> Self {
        let per_layer = num_blocks * block_size * cfg.kv_dim();
        let mut inv_freq = cfg.rope_inv_freq();
        if let Some(f) = &w.rope_freq_factors {
            inv_freq.iter_mut().zip(f).for_each(|(a, &b)| *a /= b);
        }
        CpuBackend {
            k_cache: (0..cfg.n_layers).map(|_| vec![0f32; per_layer]).collect(),
            v_cache: (0..cfg.n_layers).map(|_| vec![0f32; per_layer]).collect(),
            cfg,
            w,
            block_size,
            num_blocks,
            inv_freq,
        }
    }

    /// KV cache bytes per token position (all layers, K and V).
    pub fn kv_bytes_per_token(cfg: &ModelConfig) -> usize {
        cfg.n_layers * 2 * cfg.kv_dim() * 4
    }

    fn check_plan(&self, plan: &StepPlan) -> Result<(), BackendError> {
        let mut seen = std::collections::HashSet::new();
        for c in &plan.chunks {
            if !seen.insert(c.seq) {
                return Err(BackendError::Plan(format!("sequence {} appears twice in one step", c.seq)));
            }
            if c.tokens.is_empty() {
                return Err(BackendError::Plan(format!("sequence {} has an empty chunk", c.seq)));
            }
            let end = c.start_pos + c.tokens.len();
            if c.block_table.len() * self.block_size < end {
                return Err(BackendError::Plan(format!(
                    "sequence {}: block table covers {} positions, the chunk reaches {end}",
                    c.seq,
                    c.block_table.len() * self.block_size
                )));
            }
            if let Some(&b) = c.block_table.iter().find(|&&b| b as usize >= self.num_blocks) {
                return Err(BackendError::Plan(format!("sequence {}: block {b} is beyond the pool of {}", c.seq, self.num_blocks)));
            }
            if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
                return Err(BackendError::Plan(format!("sequence {}: token id {t} is beyond the vocabulary ({})", c.seq, self.cfg.vocab_size)));
            }
        }
        Ok(())
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
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn decode_weight_bytes(&self) -> u64 {
        let mut n = self.w.output.bytes().len() + self.w.token_embd.row_bytes();
        for l in &self.w.layers {
            for t in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                n += t.bytes().len();
            }
        }
        n as u64
    }

    fn kv_bytes_per_position(&self) -> u64 {
        Self::kv_bytes_per_token(&self.cfg) as u64
    }

    fn step(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        self.check_plan(plan)?;
        let c = &self.cfg;
        let (dim, qd, kvd, hd) = (c.dim, c.q_dim(), c.kv_dim(), c.head_dim);

        // Flatten the plan: token t belongs to chunk seq_of[t] at position pos[t].
        let mut ids = Vec::new();
        let mut pos = Vec::new();
        let mut tables: Vec<&[u32]> = Vec::new();
        for ch in &plan.chunks {
            for (i, &t) in ch.tokens.iter().enumerate() {
                ids.push(t);
                pos.push(ch.start_pos + i);
                tables.push(&ch.block_table);
            }
        }
        let n = ids.len();
        let (cos, sin) = ops::rope_table(&pos, &self.inv_freq);
        let half = hd / 2;

        let mut x = vec![0f32; n * dim]; // [n, dim] residual stream
        for (t, &id) in ids.iter().enumerate() {
            crate::model::quant::dequantize_row(self.w.token_embd.dtype, self.w.token_embd.row(id as usize), &mut x[t * dim..(t + 1) * dim]);
        }
        let mut h = vec![0f32; n * dim]; // [n, dim] normed input
        let mut q = vec![0f32; n * qd]; // [n, n_heads, head_dim]
        let mut k = vec![0f32; n * kvd]; // [n, n_kv_heads, head_dim]
        let mut v = vec![0f32; n * kvd];
        let mut att = vec![0f32; n * qd];
        let mut o = vec![0f32; n * dim];
        let mut gate = vec![0f32; n * c.ffn_dim]; // [n, ffn_dim]
        let mut up = vec![0f32; n * c.ffn_dim];

        for (l, lw) in self.w.layers.iter().enumerate() {
            ops::rmsnorm(&x, &lw.attn_norm, c.rms_eps, &mut h);
            matmul(&lw.wq, &h, n, &mut q);
            matmul(&lw.wk, &h, n, &mut k);
            matmul(&lw.wv, &h, n, &mut v);
            for (buf, bias, width) in [(&mut q, &lw.bq, qd), (&mut k, &lw.bk, kvd), (&mut v, &lw.bv, kvd)] {
                if let Some(b) = bias {
                    buf.chunks_exact_mut(width).for_each(|r| ops::add_inplace(r, b));
                }
            }
            if let Some(qn) = &lw.q_norm {
                ops::rmsnorm_heads_inplace(&mut q, qn, c.rms_eps);
            }
            if let Some(kn) = &lw.k_norm {
                ops::rmsnorm_heads_inplace(&mut k, kn, c.rms_eps);
            }
            for t in 0..n {
                let (cs, sn) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
                ops::rope_token(&mut q[t * qd..(t + 1) * qd], hd, cs, sn, c.rope_style);
                ops::rope_token(&mut k[t * kvd..(t + 1) * kvd], hd, cs, sn, c.rope_style);
            }
            // Write this step's K/V into the paged cache before attending (causal: a token reads
            // positions <= its own, all of which are now in the cache).
            let (kc, vc) = (&mut self.k_cache[l], &mut self.v_cache[l]);
            for t in 0..n {
                let blk = tables[t][pos[t] / self.block_size] as usize;
                let off = (blk * self.block_size + pos[t] % self.block_size) * kvd;
                kc[off..off + kvd].copy_from_slice(&k[t * kvd..(t + 1) * kvd]);
                vc[off..off + kvd].copy_from_slice(&v[t * kvd..(t + 1) * kvd]);
            }
            let kv = PagedKv { k: kc, v: vc, block_size: self.block_size, n_kv_heads: c.n_kv_heads, head_dim: hd };
            ops::attend_batch(&kv, &tables, &pos, &q, c.n_heads, &mut att);
            matmul(&lw.wo, &att, n, &mut o);
            ops::add_inplace(&mut x, &o);

            ops::rmsnorm(&x, &lw.ffn_norm, c.rms_eps, &mut h);
            matmul(&lw.w_gate, &h, n, &mut gate);
            matmul(&lw.w_up, &h, n, &mut up);
            ops::silu_mul_inplace(&mut gate, &up);
            matmul(&lw.w_down, &gate, n, &mut o);
            ops::add_inplace(&mut x, &o);
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
        let mut hn = vec![0f32; m * dim];
        for (i, &r) in rows.iter().enumerate() {
            ops::rmsnorm_row(&x[r * dim..(r + 1) * dim], &self.w.output_norm, c.rms_eps, &mut hn[i * dim..(i + 1) * dim]);
        }
        let mut logits = vec![0f32; m * c.vocab_size];
        if m > 0 {
            matmul(&self.w.output, &hn, m, &mut logits);
        }
        Ok(logits.chunks_exact(c.vocab_size).map(|r| r.to_vec()).collect())
    }
}
