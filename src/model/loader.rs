//! Opens a model given on the command line: a GGUF file (or, later, a Hugging Face directory),
//! and returns its configuration, weights, tokenizer and fingerprint.

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
    #[error("{0} is a directory; Hugging Face model directories are not supported yet")]
    Directory(PathBuf),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("tokenizer of {path}: {source}")]
    Tokenizer { path: PathBuf, source: TokenizerError },
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

pub fn load_model(path: &Path) -> Result<LoadedModel, LoadError> {
    if !path.exists() {
        return Err(LoadError::NotFound(path.to_path_buf()));
    }
    if path.is_dir() {
        return Err(LoadError::Directory(path.to_path_buf()));
    }
    let g = GgufFile::open(path)?;
    let config = ModelConfig::from_gguf(&g)?;
    let weights = ModelWeights::from_gguf(&g, &config)?;
    let tokenizer =
        Tokenizer::from_gguf(&g).map_err(|source| LoadError::Tokenizer { path: path.to_path_buf(), source })?;
    let fingerprint = gguf_fingerprint(&g);
    Ok(LoadedModel { path: path.to_path_buf(), config, weights, tokenizer, fingerprint })
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
