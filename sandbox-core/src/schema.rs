//! JSON Schemas generated from the core types: the caps a run is given ([`caps`], what
//! [`Caps::from_json`] reads) and the run output ([`run_output`], the object of
//! [`RunOutput::to_json`], the CLI's `--json`, with the receipt).
//!
//! The repository commits them as `schema/caps.schema.json` and
//! `schema/run-output.schema.json`; a test regenerates them and fails when they are stale
//! (`STRATA_UPDATE_SCHEMA=1 cargo test --release --workspace --test schema` rewrites them).
//! The caps schema also carries the table of names ([`crate::names`]) under
//! `x-strata-names`, which the bindings' tests read.

use std::borrow::Cow;

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use crate::caps::Caps;
use crate::output::{ExitStatus, LimitKind, ResourceUsage, RunOutput, TrapKind};
use crate::receipt::Receipt;

/// File name of the caps schema in the repository's `schema/` directory.
pub const CAPS_FILE: &str = "caps.schema.json";
/// File name of the run-output schema in the repository's `schema/` directory.
pub const RUN_OUTPUT_FILE: &str = "run-output.schema.json";

/// The result of a run as JSON: how it ended, its output, and the receipt. This is the
/// object of the CLI's `--json`, Python's `RunResult.to_dict()` and [`RunOutput::to_json`].
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "RunOutput")]
pub struct RunOutputJson<'a> {
    /// The exit code, when the tool exited (null when a signal, a limit or a trap ended it).
    pub exit_code: Option<i32>,
    /// The signal that ended the tool, if one did.
    pub signal: Option<i32>,
    /// Whether the wall-clock timeout ended the run (`limit` is `wall`).
    pub timed_out: bool,
    /// The limit that ended the run, if one did.
    pub limit: Option<LimitKind>,
    /// What a WebAssembly tool did to trap, if it trapped.
    pub trap: Option<TrapKind>,
    /// Captured standard output, decoded as UTF-8 (invalid bytes become U+FFFD).
    pub stdout: Cow<'a, str>,
    /// Captured standard error, decoded as UTF-8 (invalid bytes become U+FFFD).
    pub stderr: Cow<'a, str>,
    /// Whether stdout was cut at the output limit.
    pub stdout_truncated: bool,
    /// Whether stderr was cut at the output limit.
    pub stderr_truncated: bool,
    /// Wall time of the run in milliseconds.
    pub duration_ms: f64,
    /// Measured resource usage.
    pub usage: ResourceUsage,
    /// What was enforced, and what was denied.
    pub receipt: &'a Receipt,
}

impl<'a> From<&'a RunOutput> for RunOutputJson<'a> {
    fn from(out: &'a RunOutput) -> Self {
        RunOutputJson {
            exit_code: out.exit_code(),
            signal: out.signal(),
            timed_out: out.timed_out(),
            limit: out.limit(),
            trap: out.trap(),
            stdout: String::from_utf8_lossy(&out.stdout),
            stderr: String::from_utf8_lossy(&out.stderr),
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
            duration_ms: out.duration.as_secs_f64() * 1000.0,
            usage: out.usage,
            receipt: &out.receipt,
        }
    }
}

/// The JSON Schema (draft 2020-12) of the caps, as read: every key optional, unknown keys
/// refused, sizes as numbers or strings. It lists the canonical spellings; the legacy
/// spellings readers also accept are in `x-strata-names`.
pub fn caps() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .for_deserialize()
        .into_generator();
    let mut schema = generator.into_root_schema_for::<Caps>();
    schema.insert("title".into(), "Strata caps".into());
    schema.insert(
        "description".into(),
        "What a sandboxed run may touch (Caps::from_json, Python Caps.to_dict(), TOML). Deny \
         by default: every key is optional and defaults as `default` says; unknown keys are \
         refused. The names of each field in Python, Node and the CLI are in x-strata-names."
            .into(),
    );
    schema.insert("x-strata-names".into(), crate::names::to_json());
    let mut value = schema.to_value();
    clean_descriptions(&mut value);
    value
}

/// The JSON Schema (draft 2020-12) of the run output with its receipt, as written. Its
/// `$defs` also hold [`ExitStatus`], the tagged form of how a run ended.
pub fn run_output() -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator();
    generator.subschema_for::<ExitStatus>();
    let mut schema = generator.into_root_schema_for::<RunOutputJson<'static>>();
    schema.insert("title".into(), "Strata run output".into());
    let mut value = schema.to_value();
    clean_descriptions(&mut value);
    value
}

/// Turns rustdoc into plain text in every `description`: code examples are dropped and
/// intra-doc links (`` [`Caps::new`] ``, `` [`x`](Caps#structfield.x) ``) become code spans.
fn clean_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                match child {
                    Value::String(text) if key == "description" => *text = plain(text),
                    _ => clean_descriptions(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(clean_descriptions),
        _ => {}
    }
}

fn plain(doc: &str) -> String {
    let mut kept = Vec::new();
    let mut in_code = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code {
            kept.push(line);
        }
    }
    let text = kept.join("\n");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.trim();
    while let Some(start) = rest.find("[`") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(end) = after.find("`]") else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let code = &after[..end + 1];
        out.push_str(&code.replacen("crate::", "", 1));
        rest = &after[end + 2..];
        // A link target: `(...)` right after the brackets.
        if rest.starts_with('(') {
            if let Some(close) = rest.find(')') {
                rest = &rest[close + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_lose_code_blocks_and_link_syntax() {
        let doc = "What a run may touch.\n\n```\nlet x = 1;\n```\nSee [`Caps::new`] and \
                   [`agent`](Caps#structfield.agent), [`crate::grant::HOST_EXECUTED`].";
        assert_eq!(
            plain(doc),
            "What a run may touch.\n\nSee `Caps::new` and `agent`, `grant::HOST_EXECUTED`."
        );
    }
}
