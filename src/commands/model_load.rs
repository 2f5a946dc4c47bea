//! Loading a model or its tokenizer alone, with a log line.

use std::path::Path;

use anyhow::{Context, Result};

use crate::model::loader::{load_model, LoadedModel};

/// The tokenizer alone (vocab-only GGUFs work): for commands that run no model.
pub fn load_tokenizer(path: &Path) -> Result<crate::model::loader::LoadedTokenizer> {
    let t = crate::model::loader::load_tokenizer(path).context("loading the tokenizer")?;
    eprintln!("tokenizer: {} (vocab {})", path.display(), t.tokenizer.vocab_size());
    Ok(t)
}

pub fn load(path: &Path) -> Result<LoadedModel> {
    let t = std::time::Instant::now();
    let m = load_model(path).context("loading the model")?;
    let c = &m.config;
    eprintln!(
        "model: {} ({}, {} layers, width {}, {} heads / {} KV heads, vocab {}) loaded in {:.2}s",
        path.display(),
        c.arch.name(),
        c.n_layers,
        c.dim,
        c.n_heads,
        c.n_kv_heads,
        c.vocab_size,
        t.elapsed().as_secs_f64()
    );
    Ok(m)
}
