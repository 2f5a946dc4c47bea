//! Thinking mode of pipelines (`[prompt] thinking = true`, `[output] thinking_field`) with a
//! real tokenizer and model: the tiny Qwen3.5 reference model of `../shared/testdata/arch/qwen3_5`
//! given a chat template of the Qwen3.5 shape (written here: with thinking on the generation
//! prompt opens `<think>\n`, with it off an empty think block precedes the answer).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{bin, tmpdir};
use dustoff::engine::finish::FinishReason;
use dustoff::job::adapters::TokenizerCodec;
use dustoff::job::pipeline::Pipeline;
use dustoff::job::writer::{ok_row_with, RowOutput};
use dustoff::tokenizer::Tokenizer;

const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}\
<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

/// The tiny model's directory with the template above as `chat_template.jinja` (which takes
/// precedence over the one in tokenizer_config.json).
fn model_dir(name: &str) -> PathBuf {
    let src = common::shared_testdata().join("arch/qwen3_5/hf");
    let dir = tmpdir(name).join("model");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("chat_template.jinja"), TEMPLATE).unwrap();
    dir
}

/// A pipeline file in `dir`, named after its settings (each variant its own file).
fn pipeline(dir: &Path, extra_prompt: &str, extra_output: &str, max_tokens: u32) -> PathBuf {
    let tag = blake3::hash(format!("{extra_prompt}|{extra_output}|{max_tokens}").as_bytes()).to_hex();
    let p = dir.join(format!("think-{}.toml", &tag[..12]));
    let text = format!(
        "name = \"think\"\n[prompt]\nsystem = \"Be brief.\"\ninstruction = \"Answer.\"\n{extra_prompt}\n\
         [generation]\nmax_tokens = {max_tokens}\n[output]\nkind = \"text\"\n{extra_output}\n"
    );
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn thinking_renders_the_open_block_and_strips_it_from_the_row() {
    let model = model_dir("think-render");
    let dir = model.parent().unwrap().to_path_buf();
    let tok = Tokenizer::from_hf_dir(&model).unwrap();
    let codec = TokenizerCodec(&tok);
    let fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(r#"{"text": "Is water wet?"}"#).unwrap();
    let off = Pipeline::resolve(pipeline(&dir, "", "", 8).to_str().unwrap(), &dir).unwrap();
    let on = Pipeline::resolve(
        pipeline(&dir, "thinking = true", "thinking_field = \"reasoning\"", 8).to_str().unwrap(),
        &dir,
    )
    .unwrap();
    // Default: thinking off, the empty block is part of the prompt; on: the prompt ends inside
    // an open block.
    let text = |p: &Pipeline| tok.decode(&p.prompt_ids(&codec, "r1", &fields).unwrap().ids).unwrap();
    assert!(text(&off).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{:?}", text(&off));
    assert!(text(&on).ends_with("<|im_start|>assistant\n<think>\n"), "{:?}", text(&on));
    // Off: the text is the answer as written (no stripping).
    let out = off.parse_output("<think>x</think>Yes.", FinishReason::Stop).unwrap();
    assert_eq!(out, RowOutput::Text("<think>x</think>Yes.".into()));
    // On: the block the prompt opened is closed by the model; the row keeps the answer and,
    // in the named field, the reasoning.
    let out = on.parse_row("Water makes things wet.\n</think>\n\nYes.", FinishReason::Stop).unwrap();
    assert_eq!(out.output, RowOutput::Text("Yes.".into()));
    assert_eq!(out.reasoning.as_deref(), Some("Water makes things wet."));
    let row = ok_row_with("r1", &out.output, Some(("reasoning", out.reasoning.as_deref())), "stop", 30, 9, false);
    assert_eq!(
        row,
        r#"{"id":"r1","output":"Yes.","reasoning":"Water makes things wet.","finish_reason":"stop","prompt_tokens":30,"generated_tokens":9,"input_truncated":false,"empty_output":false}"#
    );
    let e = on.parse_row("Still thinking", FinishReason::Length).unwrap_err();
    assert!(e.message.contains("max_tokens inside the <think> block"), "{}", e.message);
}

#[test]
fn bad_thinking_settings_are_refused() {
    let dir = tmpdir("think-bad");
    let err = |prompt: &str, output: &str| {
        let p = pipeline(&dir, prompt, output, 8);
        Pipeline::resolve(p.to_str().unwrap(), &dir).err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert!(err("", "thinking_field = \"reasoning\"").contains("needs prompt.thinking = true"));
    assert!(err("thinking = true", "thinking_field = \"output\"").contains("must be a new"));
    assert!(err("thinking = true\nchat_template = false", "").contains("needs prompt.chat_template"));
}

/// `dustoff run` end to end: the random model never closes the block the prompt opened, so at
/// `max_tokens` every record is an error row that says why; with thinking off (the default)
/// the same job writes result rows. A Parquet output with a thinking field is refused.
#[test]
fn run_writes_an_error_row_for_an_unterminated_think_block() {
    let model = model_dir("think-run");
    let dir = model.parent().unwrap().to_path_buf();
    let input = dir.join("in.jsonl");
    std::fs::write(&input, "{\"id\": \"a\", \"text\": \"Is water wet?\"}\n{\"id\": \"b\", \"text\": \"Why?\"}\n")
        .unwrap();
    let run = |pipe: &Path, out: &Path| {
        Command::new(bin())
            .args(["run", "--device", "cpu", "--quiet", "--model"])
            .arg(&model)
            .arg(pipe)
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(out)
            .output()
            .unwrap()
    };
    let rows = |out: &Path| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(out).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let on = pipeline(&dir, "thinking = true", "thinking_field = \"reasoning\"", 6);
    let o = run(&on, &dir.join("on.jsonl"));
    assert!(o.status.code().is_some(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = rows(&dir.join("on.jsonl"));
    assert_eq!(got.len(), 2);
    for r in &got {
        assert_eq!(r["error"]["kind"], "truncated", "{r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("inside the <think> block"), "{r}");
    }
    let off = pipeline(&dir, "", "", 6);
    let o = run(&off, &dir.join("off.jsonl"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for r in rows(&dir.join("off.jsonl")) {
        assert!(r["output"].is_string() && r.get("reasoning").is_none(), "{r}");
        assert_eq!(r["generated_tokens"], 6, "{r}");
    }
    let o = run(&on, &dir.join("on.parquet"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("JSONL outputs only"), "{err}");
}
