//! Opens a model given on the command line: a GGUF file or a Hugging Face directory
//! (`config.json`, safetensors weights, `tokenizer.json`), and returns its configuration,
//! weights, tokenizer and fingerprint.

use std::path::{Path, PathBuf};

use super::config::{ConfigError, ModelConfig};
use super::gguf::{GgufError, GgufFile};
use super::weights::ModelWeights;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// The default model of every sample command and test.
pub const SAMPLE_MODEL: &str = "samples/models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model path {0} does not exist (the sample model is fetched by samples/fetch-model.sh)")]
    NotFound(PathBuf),
    #[error("{0} is a directory without config.json (a Hugging Face model directory needs one)")]
    Directory(PathBuf),
    #[error(transparent)]
    Hf(#[from] super::hf::HfError),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("tokenizer of {path}: {source}")]
    Tokenizer { path: PathBuf, source: TokenizerError },
    #[error(
        "{path}: the tokenizer has token ids up to {}, but the embedding table has {rows} rows: the \
         tokenizer and the weights do not belong together",
        tokens - 1
    )]
    VocabMismatch { path: PathBuf, tokens: usize, rows: usize },
}

/// The tokenizer's ids must all have an embedding row (more rows than ids is common: tables are
/// padded). A tokenizer past the table would fail only when a prompt holds such an id, deep in
/// a job; llama.cpp refuses such a file at load too.
fn check_vocab(path: &Path, tokenizer: &Tokenizer, config: &ModelConfig) -> Result<(), LoadError> {
    let (tokens, rows) = (tokenizer.vocab_size(), config.vocab_size);
    if tokens > rows {
        return Err(LoadError::VocabMismatch { path: path.to_path_buf(), tokens, rows });
    }
    Ok(())
}

pub struct LoadedModel {
    pub path: PathBuf,
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
    /// Identifies the weights for prefix-cache hashes and job fingerprints:
    /// blake3 over the file size, the metadata keys and the tensor table.
    pub fingerprint: [u8; 32],
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel").field("path", &self.path).field("config", &self.config).finish()
    }
}

/// A model's tokenizer without its weights: what `tokenize` and `run --dry-run` need. Works on
/// vocab-only GGUFs (llama.cpp's `ggml-vocab-*.gguf`, no tensors) and on HF directories whose
/// weights are absent or not yet supported.
pub struct LoadedTokenizer {
    pub path: PathBuf,
    pub tokenizer: Tokenizer,
    /// Identifies the vocabulary file for job fingerprints (the same hash `load_model` gives for a
    /// GGUF: size, metadata keys and tensor table).
    pub fingerprint: [u8; 32],
}

pub fn load_tokenizer(path: &Path) -> Result<LoadedTokenizer, LoadError> {
    if !path.exists() {
        return Err(LoadError::NotFound(path.to_path_buf()));
    }
    let tok_err = |source| LoadError::Tokenizer { path: path.to_path_buf(), source };
    if path.is_dir() {
        if !path.join(super::hf::CONFIG_FILE).is_file() {
            return Err(LoadError::Directory(path.to_path_buf()));
        }
        let tokenizer = Tokenizer::from_hf_dir(path).map_err(tok_err)?;
        // Only the tokenizer matters to the callers: hash its file.
        let mut h = blake3::Hasher::new();
        h.update(b"hf-tokenizer");
        if let Ok(bytes) = std::fs::read(path.join("tokenizer.json")) {
            h.update(&bytes);
        }
        return Ok(LoadedTokenizer { path: path.to_path_buf(), tokenizer, fingerprint: *h.finalize().as_bytes() });
    }
    let g = GgufFile::open(path)?;
    let tokenizer = Tokenizer::from_gguf(&g).map_err(tok_err)?;
    Ok(LoadedTokenizer { path: path.to_path_buf(), tokenizer, fingerprint: gguf_fingerprint(&g) })
}

/// The model's configuration from its metadata alone (GGUF header or `config.json`): no
/// weights are bound, so it is cheap; a vocab-only GGUF has none (no `token_embd.weight`).
pub fn load_config(path: &Path) -> Result<ModelConfig, LoadError> {
    if !path.exists() {
        return Err(LoadError::NotFound(path.to_path_buf()));
    }
    if path.is_dir() {
        return Ok(super::hf::read_config(path)?.0);
    }
    Ok(ModelConfig::from_gguf(&GgufFile::open(path)?)?)
}

pub fn load_model(path: &Path) -> Result<LoadedModel, LoadError> {
    if !path.exists() {
        return Err(LoadError::NotFound(path.to_path_buf()));
    }
    if path.is_dir() {
        return load_hf_dir(path);
    }
    let g = GgufFile::open(path)?;
    let config = ModelConfig::from_gguf(&g)?;
    let weights = ModelWeights::from_gguf(&g, &config)?;
    let tokenizer =
        Tokenizer::from_gguf(&g).map_err(|source| LoadError::Tokenizer { path: path.to_path_buf(), source })?;
    check_vocab(path, &tokenizer, &config)?;
    let fingerprint = gguf_fingerprint(&g);
    Ok(LoadedModel { path: path.to_path_buf(), config, weights, tokenizer, fingerprint })
}

/// A Hugging Face directory: BF16/F16/F32 matrices are kept as stored (the CPU backend widens
/// rows as it computes; BF16 computed this way is the exact reference for conversions).
fn load_hf_dir(dir: &Path) -> Result<LoadedModel, LoadError> {
    if !dir.join(super::hf::CONFIG_FILE).is_file() {
        return Err(LoadError::Directory(dir.to_path_buf()));
    }
    let (config, _extras, weights, st) = super::hf_bind::load_dir(dir)?;
    let tokenizer =
        Tokenizer::from_hf_dir(dir).map_err(|source| LoadError::Tokenizer { path: dir.to_path_buf(), source })?;
    check_vocab(dir, &tokenizer, &config)?;
    let mut h = blake3::Hasher::new();
    h.update(b"hf-dir");
    h.update(format!("{config:?}").as_bytes());
    for name in st.names() {
        if let Ok((f, info)) = st.get(name) {
            h.update(name.as_bytes());
            h.update(info.dtype.as_bytes());
            h.update(&(info.end - info.start).to_le_bytes());
            // A sample of the data: the first 64 bytes of each tensor.
            let d = f.data(info);
            h.update(&d[..d.len().min(64)]);
        }
    }
    let fingerprint = *h.finalize().as_bytes();
    Ok(LoadedModel { path: dir.to_path_buf(), config, weights, tokenizer, fingerprint })
}

fn gguf_fingerprint(g: &GgufFile) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&(g.bytes().len() as u64).to_le_bytes());
    for k in &g.metadata_order {
        h.update(k.as_bytes());
    }
    for t in &g.tensors {
        h.update(t.name.as_bytes());
        h.update(&(t.offset as u64).to_le_bytes());
        h.update(&t.dtype.id().to_le_bytes());
        // A sample of the data: the first 64 bytes of each tensor.
        let d = g.tensor_data(t);
        h.update(&d[..d.len().min(64)]);
    }
    *h.finalize().as_bytes()
}
