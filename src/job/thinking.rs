//! Thinking mode (`[prompt] thinking = true`): the chat template is rendered with
//! `enable_thinking`, the model writes its reasoning in a `<think>...</think>` block before the
//! answer, and the row gets the answer alone (the reasoning in `[output] thinking_field` when
//! the pipeline names one).
//!
//! Two template shapes exist: Qwen3's generation prompt ends at `<|im_start|>assistant\n` and
//! the model opens `<think>` itself; Qwen3.5+'s ends with `<think>\n`, so the output starts
//! inside the block and only `</think>` shows. Both are read here; a block that never closes
//! (cut at `max_tokens`, or the turn ended inside it) is an error row, never half an answer.

use super::record::{ErrorKind, RecordError};
use crate::engine::finish::FinishReason;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// A generation split into its answer and its reasoning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thought<'a> {
    /// The text after `</think>` (leading whitespace removed), or the whole text when there
    /// was no think block.
    pub answer: &'a str,
    /// The text inside the block, trimmed; `None` when the model wrote no block.
    pub reasoning: Option<&'a str>,
}

/// Whether a rendered prompt leaves a think block open for the model (Qwen3.5+ templates).
pub fn prompt_opens_think(prompt: &str) -> bool {
    let t = prompt.trim_end();
    t.ends_with(OPEN) && t.rfind(OPEN) > t.rfind(CLOSE)
}

/// Splits `text` (the decoded generation) at its `</think>`. `opened_by_prompt`: the prompt
/// ended inside a think block ([`prompt_opens_think`]), so the whole text is reasoning until
/// `</think>`.
pub fn split(text: &str, opened_by_prompt: bool, finish: FinishReason) -> Result<Thought<'_>, RecordError> {
    if let Some(i) = text.find(CLOSE) {
        let inner = text[..i].trim_start();
        let inner = inner.strip_prefix(OPEN).unwrap_or(inner).trim();
        return Ok(Thought { answer: text[i + CLOSE.len()..].trim_start(), reasoning: Some(inner) });
    }
    if !opened_by_prompt && !text.trim_start().starts_with(OPEN) {
        // The model answered without thinking (allowed: Qwen3 skips the block at times).
        return Ok(Thought { answer: text, reasoning: None });
    }
    let n = text.chars().count();
    Err(match finish {
        FinishReason::Length => RecordError::new(
            ErrorKind::Truncated,
            format!(
                "generation reached generation.max_tokens inside the <think> block ({n} characters of reasoning, no \
                 </think>): raise generation.max_tokens or set prompt.thinking = false"
            ),
        ),
        _ => RecordError::new(
            ErrorKind::OutputMismatch,
            format!("the model ended its turn inside the <think> block ({n} characters, no </think>): no answer"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_follows_the_block_whoever_opened_it() {
        // Qwen3: the model opens the block.
        let t = split("<think>\nThe user wants a word.\n</think>\n\nHello", false, FinishReason::Stop).unwrap();
        assert_eq!(t, Thought { answer: "Hello", reasoning: Some("The user wants a word.") });
        // Qwen3.5+: the prompt opened it; the answer may itself mention tags later.
        let t = split("Short.\n</think>\n\n{\"a\": \"</think>\"}", true, FinishReason::Stop).unwrap();
        assert_eq!(t, Thought { answer: "{\"a\": \"</think>\"}", reasoning: Some("Short.") });
        // An empty block (what thinking off renders) gives an empty reasoning.
        let t = split("<think>\n\n</think>\n\nYes", false, FinishReason::Length).unwrap();
        assert_eq!(t, Thought { answer: "Yes", reasoning: Some("") });
        // No block at all, prompt did not open one: the whole text is the answer.
        let t = split("Just an answer", false, FinishReason::Stop).unwrap();
        assert_eq!(t, Thought { answer: "Just an answer", reasoning: None });
    }

    #[test]
    fn an_unterminated_block_is_an_error_with_its_reason() {
        let e = split("Let me think about this", true, FinishReason::Length).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Truncated);
        assert!(e.message.contains("max_tokens inside the <think> block"), "{}", e.message);
        let e = split("  <think>hmm", false, FinishReason::Length).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Truncated);
        let e = split("<think>hmm", false, FinishReason::Stop).unwrap_err();
        assert_eq!(e.kind, ErrorKind::OutputMismatch);
        assert!(e.message.contains("ended its turn inside"), "{}", e.message);
    }

    #[test]
    fn open_blocks_at_the_end_of_a_prompt() {
        assert!(prompt_opens_think("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!prompt_opens_think("<|im_start|>assistant\n"));
    }
}
