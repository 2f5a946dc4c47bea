//! Constrained decoding: at every step, the tokens that would break the output's grammar are
//! masked before sampling, so a JSON pipeline's rows always parse and follow its schema.
//!
//! The grammar engine is the `llguidance` crate (Earley parser over a derivative-based lexer;
//! a mask over a 150k vocabulary costs tens of microseconds). This module gives it:
//! - [`OutputConstraint`]: what a pipeline's `[output]` section asks for (JSON schema, one of a
//!   list of labels, a regex), turned into an llguidance grammar;
//! - [`ConstraintFactory`]: the tokenizer environment built from dustoff's own tokenizer
//!   (`tok_env.rs`), shared by every request of a job;
//! - [`Grammar`] / [`SeqConstraint`]: one compiled grammar, and the per-sequence parser state
//!   that lives beside the sampler in the engine (`seq.rs`);
//! - [`MaskTimes`]: a small fixed-size histogram for the mask time per token (`stats.rs`).
//!
//! A mask is a packed bit set, `ceil(vocab / 32)` `u32` words, bit `t % 32` of word `t / 32` set
//! when token `t` is allowed: the layout a device kernel can take as is.

mod seq;
mod stats;
mod tok_env;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::Value;

pub use seq::{fill_masks, SeqConstraint};
pub use stats::{ConstraintMetrics, MaskTimes};
pub use tok_env::DustoffTokEnv;

use crate::tokenizer::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    #[error("{what} cannot be compiled into a grammar: {reason}")]
    Compile { what: String, reason: String },
    #[error("cannot build the token environment for constrained decoding: {0}")]
    TokEnv(String),
}

/// The shape a pipeline's output must have.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputConstraint {
    /// A JSON value that follows this JSON Schema (the subset llguidance supports).
    Json(Value),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A full match of this regex (Rust `regex` syntax).
    Regex(String),
}

impl OutputConstraint {
    /// Names the constraint in errors ("the JSON schema", "output.choices"...).
    fn what(&self) -> &'static str {
        match self {
            OutputConstraint::Json(_) => "the output JSON schema",
            OutputConstraint::Choice(_) => "output.choices",
            OutputConstraint::Regex(_) => "output.pattern",
        }
    }

    /// The llguidance grammar. JSON is compact by default (`", "` and `": "` separators, no
    /// free whitespace): a small model given free whitespace may emit newlines until
    /// `max_tokens`, and fixed separators are more forced tokens (no model step). A schema's own
    /// `x-guidance` options win.
    pub fn grammar(&self) -> TopLevelGrammar {
        match self {
            OutputConstraint::Json(schema) => {
                let mut schema = schema.clone();
                if schema.is_object() && schema.get("x-guidance").is_none() {
                    let opts = JsonCompileOptions {
                        item_separator: ", ".into(),
                        key_separator: ": ".into(),
                        whitespace_flexible: false,
                        ..JsonCompileOptions::default()
                    };
                    opts.apply_to(&mut schema);
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            OutputConstraint::Choice(labels) => {
                let alts: Vec<String> = labels.iter().map(|l| regex_syntax::escape(l)).collect();
                TopLevelGrammar::from_regex(&format!("(?:{})", alts.join("|")))
            }
            OutputConstraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
        }
    }

    /// Compiles the grammar against a byte-level vocabulary, without the model: a schema or
    /// pattern llguidance cannot compile is found when the pipeline loads, before the model does.
    pub fn check(&self) -> Result<(), ConstraintError> {
        if let OutputConstraint::Choice(labels) = self {
            if labels.is_empty() || labels.iter().any(String::is_empty) {
                return Err(self.compile_error("the list is empty or has an empty label".into()));
            }
        }
        let env = toktrie::ApproximateTokEnv::single_byte_env();
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| self.compile_error(e.to_string()))?;
        factory.quiet();
        factory.create_parser(self.grammar()).map(|_| ()).map_err(|e| self.compile_error(e.to_string()))
    }

    fn compile_error(&self, reason: String) -> ConstraintError {
        ConstraintError::Compile { what: self.what().to_string(), reason }
    }
}

/// The token environment of one tokenizer, and the llguidance parser factory over it (its
/// lexer slices are precomputed once per vocabulary). One per job.
pub struct ConstraintFactory {
    factory: Arc<ParserFactory>,
}

impl ConstraintFactory {
    /// Builds the token trie from the tokenizer's vocabulary (~0.1 s for 150k tokens).
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, ConstraintError> {
        let env: toktrie::TokEnv = Arc::new(DustoffTokEnv::new(tokenizer)?);
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| ConstraintError::TokEnv(e.to_string()))?;
        factory.quiet();
        Ok(ConstraintFactory { factory: Arc::new(factory) })
    }

    /// Compiles `c` for this vocabulary.
    pub fn compile(&self, c: &OutputConstraint) -> Result<Grammar, ConstraintError> {
        let parser = self.factory.create_parser(c.grammar()).map_err(|e| c.compile_error(e.to_string()))?;
        let proto = Matcher::new(Ok(parser));
        if let Some(e) = proto.get_error() {
            return Err(c.compile_error(e));
        }
        let vocab = self.factory.tok_env().tok_trie().vocab_size();
        Ok(Grammar { proto: Arc::new(proto), vocab })
    }
}

/// A compiled grammar: each request starts from a copy of its fresh parser.
#[derive(Clone)]
pub struct Grammar {
    proto: Arc<Matcher>,
    /// Tokens the masks cover (the tokenizer's vocabulary).
    vocab: usize,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("vocab", &self.vocab).finish()
    }
}

impl Grammar {
    /// A fresh per-sequence state (the parser is cloned: the compiled grammar and lexer are shared).
    pub fn start(&self) -> SeqConstraint {
        SeqConstraint::new(self.proto.as_ref().clone(), self.vocab)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unsupported_or_broken_constraints_are_refused_with_the_reason() {
        let bad_type = OutputConstraint::Json(json!({"type": "strnig"}));
        let e = bad_type.check().unwrap_err().to_string();
        assert!(e.contains("JSON schema") && e.contains("strnig"), "{e}");
        let unsat = OutputConstraint::Json(json!({"type": "array", "minItems": 3, "maxItems": 1}));
        assert!(unsat.check().is_err());
        assert!(OutputConstraint::Regex("(a|b".into()).check().is_err());
        assert!(OutputConstraint::Choice(vec![]).check().is_err());
        assert!(OutputConstraint::Choice(vec!["a".into(), "".into()]).check().is_err());
        let good = json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
        OutputConstraint::Json(good).check().unwrap();
        OutputConstraint::Choice(vec!["x.y".into(), "a|b".into(), "(c)".into()]).check().unwrap();
        OutputConstraint::Regex("[0-9]{3}".into()).check().unwrap();
    }
}
