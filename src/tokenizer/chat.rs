//! Chat templates: Hugging Face Jinja templates rendered with minijinja.
//!
//! HF renders templates with `trim_blocks` and `lstrip_blocks` on, and gives them
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and the functions
//! `raise_exception` and `strftime_now`; templates also call Python string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`...), provided here by [`py_method`].
//! Not supported: `{% break %}`/`{% continue %}` (needs minijinja's `loop_controls` feature).

use minijinja::value::{from_args, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::{Deserialize, Serialize};

use super::TokenizerError;

/// One chat turn. `role` is usually "system", "user" or "assistant".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

const TEMPLATE_NAME: &str = "chat_template";

/// An environment holding one compiled chat template (compile once, render per record).
pub(super) struct ChatEnv {
    env: Environment<'static>,
}

impl ChatEnv {
    pub(super) fn new(template: &str) -> Result<Self, minijinja::Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(py_method);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, format!("template raised: {msg}")))
        });
        env.add_function("strftime_now", |fmt: String| -> Result<Value, Error> { Ok(Value::from(strftime_now(&fmt))) });
        env.add_template_owned(TEMPLATE_NAME, template.to_string())?;
        Ok(ChatEnv { env })
    }

    pub(super) fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
        enable_thinking: bool,
    ) -> Result<String, TokenizerError> {
        let tmpl = self.env.get_template(TEMPLATE_NAME)?;
        // `enable_thinking` is read by the Qwen3 / Qwen3.5+ templates (false: an empty think
        // block opens the answer, so the model answers directly); other templates ignore it.
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
            enable_thinking => enable_thinking,
        };
        Ok(tmpl.render(ctx)?)
    }
}

fn unknown(value: &Value, method: &str) -> Error {
    Error::new(ErrorKind::UnknownMethod, format!("{} has no method {method}() in dustoff's templates", value.kind()))
}

/// Python `str`/`dict` methods that HF chat templates use.
fn py_method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        return str_method(state, s, value, method, args);
    }
    if value.kind() == ValueKind::Map {
        return match method {
            "items" => {
                let _: () = from_args(args)?;
                state.apply_filter("items", std::slice::from_ref(value))
            }
            "keys" => {
                let _: () = from_args(args)?;
                Ok(Value::from(value.try_iter()?.collect::<Vec<_>>()))
            }
            "values" => {
                let _: () = from_args(args)?;
                let vals: Result<Vec<Value>, Error> = value.try_iter()?.map(|k| value.get_item(&k)).collect();
                Ok(Value::from(vals?))
            }
            "get" => {
                let (key, default): (Value, Option<Value>) = from_args(args)?;
                let v = value.get_item(&key)?;
                Ok(if v.is_undefined() { default.unwrap_or(Value::from(())) } else { v })
            }
            _ => Err(unknown(value, method)),
        };
    }
    Err(unknown(value, method))
}

fn str_method(state: &State, s: &str, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    let out = match method {
        "strip" | "lstrip" | "rstrip" => {
            let (chars,): (Option<&str>,) = from_args(args)?;
            let pred = |c: char| chars.map_or(c.is_whitespace(), |set| set.contains(c));
            Value::from(match method {
                "strip" => s.trim_matches(pred),
                "lstrip" => s.trim_start_matches(pred),
                _ => s.trim_end_matches(pred),
            })
        }
        "upper" | "lower" | "title" | "capitalize" => {
            let _: () = from_args(args)?;
            return state.apply_filter(method, std::slice::from_ref(value));
        }
        "startswith" | "endswith" => {
            let (pat,): (Value,) = from_args(args)?;
            // Python accepts one prefix or a tuple (here: a list) of them.
            let pats: Vec<String> = match pat.as_str() {
                Some(p) => vec![p.to_string()],
                None => pat.try_iter()?.map(|p| p.as_str().unwrap_or_default().to_string()).collect(),
            };
            let hit = pats.iter().any(|p| if method == "startswith" { s.starts_with(p) } else { s.ends_with(p) });
            Value::from(hit)
        }
        "split" | "rsplit" => {
            let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
            let limit = maxsplit.filter(|&m| m >= 0).map(|m| m as usize + 1).unwrap_or(usize::MAX);
            let parts: Vec<Value> = match (sep, method) {
                (Some(sep), "split") => s.splitn(limit, sep).map(Value::from).collect(),
                (Some(sep), _) => {
                    let mut v: Vec<Value> = s.rsplitn(limit, sep).map(Value::from).collect();
                    v.reverse();
                    v
                }
                (None, _) => s.split_whitespace().map(Value::from).collect(),
            };
            Value::from(parts)
        }
        "replace" => {
            let (old, new, count): (&str, &str, Option<i64>) = from_args(args)?;
            Value::from(match count {
                Some(n) if n >= 0 => s.replacen(old, new, n as usize),
                _ => s.replace(old, new),
            })
        }
        "find" => {
            let (needle,): (&str,) = from_args(args)?;
            Value::from(s.find(needle).map_or(-1, |byte| s[..byte].chars().count() as i64))
        }
        "count" => {
            let (needle,): (&str,) = from_args(args)?;
            Value::from(if needle.is_empty() { s.chars().count() + 1 } else { s.matches(needle).count() })
        }
        "join" => {
            let (items,): (Value,) = from_args(args)?;
            let parts: Vec<String> = items.try_iter()?.map(|v| v.to_string()).collect();
            Value::from(parts.join(s))
        }
        _ => return Err(unknown(value, method)),
    };
    Ok(out)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// `strftime` over the current UTC time for the fields chat templates use
/// (%Y %m %d %B %b %H %M %S %%); other directives are kept as written.
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let tod = secs.rem_euclid(86_400);
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out += &y.to_string(),
            Some('m') => out += &format!("{m:02}"),
            Some('d') => out += &format!("{d:02}"),
            Some('B') => out += MONTHS[(m - 1) as usize],
            Some('b') => out += &MONTHS[(m - 1) as usize][..3],
            Some('H') => out += &format!("{:02}", tod / 3600),
            Some('M') => out += &format!("{:02}", tod / 60 % 60),
            Some('S') => out += &format!("{:02}", tod % 60),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 -> (year, month 1..=12, day 1..=31), proleptic Gregorian calendar
/// (eras of 400 years = 146097 days; months counted from March so leap days fall last).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of the Qwen3 template's generation prompt (written here, not copied): with
    /// thinking off it opens the answer with an empty think block.
    const THINKING_TEMPLATE: &str =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}\
<think>\n\n</think>\n\n{% endif %}{% endif %}";

    #[test]
    fn thinking_is_off_unless_asked() {
        let env = ChatEnv::new(THINKING_TEMPLATE).unwrap();
        let msgs = [ChatMessage::new("user", "Hi")];
        let off = env.render(&msgs, true, "", "", false).unwrap();
        assert_eq!(off, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
        let on = env.render(&msgs, true, "", "", true).unwrap();
        assert_eq!(on, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    fn render(template: &str) -> Result<String, TokenizerError> {
        let msgs = [ChatMessage::new("system", "  be brief  "), ChatMessage::new("user", "Hi")];
        ChatEnv::new(template)?.render(&msgs, true, "<s>", "</s>", false)
    }

    #[test]
    fn python_methods_and_trimming_match_hf_conventions() {
        let t = "{% for m in messages %}\n  {{ m.role.upper() }}:{{ m['content'].strip() }}|{{ m.content.startswith(('  b', 'x')) }}\n    {% endfor %}{{ 'a,b,c'.split(',')[1] }}{{ eos_token }}";
        // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one
        // (not before `{{`); booleans print as Python's True/False.
        assert_eq!(render(t).unwrap(), "  SYSTEM:be brief|True\n  USER:Hi|False\nb</s>");
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let err = render("{{ raise_exception('only user and assistant roles') }}").unwrap_err();
        assert!(err.to_string().contains("only user and assistant roles"), "{err}");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
