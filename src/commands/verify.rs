//! `--verify` of `quantize` and of a GGUF -> GGUF `convert`: the output scored against its
//! source by `dustoff eval` on the built-in text.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::eval::{self, EvalArgs, EvalSummary};

/// `--verify`: the output scored against the source.
#[derive(Clone, Debug, Serialize)]
pub struct Verify {
    pub reference: PathBuf,
    /// `--verify-max-kl`, if given.
    pub max_kl: Option<f64>,
    /// False when the mean KL divergence exceeds `max_kl` (the command then exits 1).
    pub passed: bool,
    pub eval: EvalSummary,
}

impl Verify {
    pub fn to_text(&self) -> String {
        let mut s = format!("verify against {}: ", self.reference.display());
        s += &self.eval.to_text();
        if let (Some(max), Some(kl)) = (self.max_kl, self.mean_kl()) {
            let verdict = if self.passed { "passed" } else { "FAILED" };
            s += &format!("verify {verdict}: mean KL {kl:.5} (--verify-max-kl {max})\n");
        }
        s
    }
    pub fn mean_kl(&self) -> Option<f64> {
        self.eval.models.first().and_then(|m| m.kl_divergence.as_ref()).map(|k| k.mean)
    }
}

/// Scores `output` against `reference` on the built-in text (the `--verify` of quantize and
/// of a GGUF -> GGUF convert).
pub fn verify(output: &Path, reference: &Path, max_kl: Option<f64>) -> anyhow::Result<Verify> {
    let eval = eval::run(&EvalArgs {
        models: vec![output.to_path_buf()],
        reference: Some(reference.to_path_buf()),
        text: None,
        ctx: 128,
        max_tokens: 512,
        ..EvalArgs::default()
    })?;
    let mut v = Verify { reference: reference.to_path_buf(), max_kl, passed: true, eval };
    if let (Some(max), Some(kl)) = (max_kl, v.mean_kl()) {
        // NaN (a broken model) fails too.
        v.passed = kl <= max;
    }
    Ok(v)
}
