//! docs/PIPELINES.md against the parser: its table lists exactly the keys a pipeline file may
//! have, each default it states is the parser's, and its complete example loads.

use std::collections::BTreeSet;
use std::path::Path;

use dustoff::job::pipeline::{Pipeline, PipelineSpec};
use serde_json::Value;

fn doc() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/PIPELINES.md")).unwrap()
}

/// `(key, default)` of each row of the "Every key" table.
fn table() -> Vec<(String, String)> {
    let d = doc();
    let section = d.split("## Every key").nth(1).expect("an \"Every key\" section");
    section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let key = cells.first()?.strip_prefix("| `")?.strip_suffix('`')?;
            let default = cells.get(1)?.trim_matches('`');
            Some((key.to_string(), default.to_string()))
        })
        .collect()
}

/// Dotted key paths of a serialized spec (tables one level deep; `output.schema` is user JSON).
fn key_paths(v: &Value) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for (k, v) in v.as_object().unwrap() {
        match v {
            Value::Object(inner) => keys.extend(inner.keys().map(|i| format!("{k}.{i}"))),
            _ => {
                keys.insert(k.clone());
            }
        }
    }
    keys
}

/// A spec with every optional key set, so serializing it shows every key the parser knows.
fn full_spec() -> PipelineSpec {
    let text = r#"
name = "x"
[prompt]
[output]
schema = { type = "object" }
schema_file = "s.json"
choices = ["a"]
pattern = "a"
thinking_field = "r"
required_keys = ["k"]
[input]
document_field = "text"
"#;
    toml::from_str(text).unwrap()
}

#[test]
fn the_table_lists_exactly_the_keys_the_parser_accepts() {
    let parser = key_paths(&serde_json::to_value(full_spec()).unwrap());
    let documented: BTreeSet<String> = table().into_iter().map(|(k, _)| k).collect();
    assert_eq!(documented, parser, "docs/PIPELINES.md's table against PipelineSpec");
    // The parser refuses what the table does not list.
    let e = toml::from_str::<PipelineSpec>("name = \"x\"\n[prompt]\nsytem = \"typo\"\n").unwrap_err().to_string();
    assert!(e.contains("sytem"), "{e}");
}

#[test]
fn the_stated_defaults_are_the_parsers() {
    let minimal: PipelineSpec = toml::from_str("name = \"x\"\n[prompt]\n").unwrap();
    // Every table has its defaults: a pipeline of its name alone is the same.
    assert_eq!(toml::from_str::<PipelineSpec>("name = \"x\"\n").unwrap(), minimal);
    let v = serde_json::to_value(&minimal).unwrap();
    let mut checked = 0;
    for (key, default) in table() {
        if default == "required" || default == "none" || default.starts_with("the first") {
            continue;
        }
        let (table, k) = key.split_once('.').unwrap_or(("", key.as_str()));
        let got = if table.is_empty() { &v[k] } else { &v[table][k] };
        let want: toml::Table = toml::from_str(&format!("v = {default}")).unwrap_or_else(|e| panic!("{key}: {e}"));
        let want = serde_json::to_value(&want["v"]).unwrap();
        // An empty list is left out when the spec is written back.
        let got = if got.is_null() && want == serde_json::json!([]) { &want } else { got };
        let same = match (got.as_f64(), want.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => *got == want,
        };
        assert!(same, "{key}: the doc says {want}, the parser's default is {got}");
        checked += 1;
    }
    assert!(checked >= 18, "only {checked} defaults checked");
}

#[test]
fn the_complete_example_loads_and_uses_every_key_of_its_kind() {
    let d = doc();
    let example = d.split("## A complete example").nth(1).unwrap();
    let toml_text = example.split("```toml\n").nth(1).unwrap().split("```").next().unwrap();
    let p = Pipeline::from_toml(toml_text, Path::new("docs/PIPELINES.md")).unwrap();
    let raw: toml::Table = toml::from_str(toml_text).unwrap();
    let used = key_paths(&serde_json::to_value(&raw).unwrap());
    let all = key_paths(&serde_json::to_value(full_spec()).unwrap());
    let other_kinds: BTreeSet<String> =
        ["output.choices", "output.pattern", "output.schema_file", "output.thinking_field"].map(String::from).into();
    assert_eq!(used, all.difference(&other_kinds).cloned().collect(), "the example's keys");
    assert_eq!(p.spec.input.fields, ["title", "body"]);
}
