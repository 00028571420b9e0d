//! Transactional workspaces and tool-call permissions for Node. Staging, diffing and
//! committing are `strata::Workspace`'s; what may be committed is
//! `strata::policy::workspace`'s; the caps of a tool call are `strata::policy::toolcall`'s.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use napi::bindgen_prelude::{Either, Unknown};
use napi::Env;
use napi_derive::napi;
use serde_json::{Map, Value};
use strata::policy::workspace::{CommitMode, Selection};
use strata::{ByteSize, Caps, Workspace};

use crate::convert::{NativeError, NodeCaps};

fn native<T>(result: strata::Result<T>) -> Either<T, NativeError> {
    match result {
        Ok(value) => Either::A(value),
        Err(e) => Either::B((&e).into()),
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> strata::Result<String> {
    serde_json::to_string(value)
        .map_err(|e| strata::Error::invalid(format!("not representable as JSON: {e}")))
}

/// A staged workspace, shared with the runs that use it.
pub(crate) type Shared = Arc<Mutex<Option<Workspace>>>;

/// Runs `f` with the staged workspace, or fails when it was discarded.
pub(crate) fn with<R>(
    shared: &Shared,
    f: impl FnOnce(&mut Workspace) -> strata::Result<R>,
) -> strata::Result<R> {
    let mut inner = shared.lock().unwrap_or_else(PoisonError::into_inner);
    match inner.as_mut() {
        Some(ws) => f(ws),
        None => Err(strata::Error::invalid("this Workspace was discarded")),
    }
}

/// A transactional copy of a host directory (see `Workspace` in index.d.ts).
#[napi]
pub struct NativeWorkspace {
    pub(crate) shared: Shared,
    source: String,
}

/// Stages `source`; `limit` is what a diff may add (bytes or a size such as `64M`; default
/// the caps' disk default, 64 MiB).
#[napi]
pub fn stage_workspace(
    source: String,
    limit: Option<Either<f64, String>>,
) -> Either<NativeWorkspace, NativeError> {
    let staged = (|| {
        let limit = match limit {
            None => strata::Limits::default().disk,
            Some(Either::A(n)) if n >= 0.0 => ByteSize(n as u64),
            Some(Either::A(_)) => return Err(strata::Error::invalid("limit must not be negative")),
            Some(Either::B(text)) => text
                .parse::<ByteSize>()
                .map_err(|e| strata::Error::invalid(format!("limit: {e}")))?,
        };
        let ws = Workspace::stage(std::path::Path::new(&source), limit)?;
        Ok(NativeWorkspace {
            source: ws.grant_dir().display().to_string(),
            shared: Arc::new(Mutex::new(Some(ws))),
        })
    })();
    native(staged)
}

#[napi]
impl NativeWorkspace {
    /// The directory this workspace stands for.
    #[napi(getter)]
    pub fn source(&self) -> String {
        self.source.clone()
    }

    /// The staging copy, or the error when discarded.
    #[napi]
    pub fn path(&self) -> Either<String, NativeError> {
        native(with(&self.shared, |ws| Ok(ws.path().display().to_string())))
    }

    /// What the runs changed, as JSON text.
    #[napi]
    pub fn diff(&self) -> Either<String, NativeError> {
        native(with(&self.shared, |ws| to_json(&ws.diff()?)))
    }

    /// Applies the changes below `paths` (default: all), accepting the flagged `accept`
    /// paths; the report as JSON text. With `sandbox`, the outcome is audited there.
    #[napi]
    pub fn commit(
        &self,
        paths: Option<Vec<String>>,
        accept: Option<Vec<String>>,
        all_or_nothing: Option<bool>,
        sandbox: Option<&crate::NativeSandbox>,
    ) -> Either<String, NativeError> {
        let selection = match paths {
            Some(paths) => Selection::Paths(paths.into_iter().map(PathBuf::from).collect()),
            None => Selection::All,
        };
        let accept: Vec<PathBuf> = accept
            .unwrap_or_default()
            .into_iter()
            .map(PathBuf::from)
            .collect();
        let mode = match all_or_nothing {
            Some(true) => CommitMode::AllOrNothing,
            _ => CommitMode::SkipRefused,
        };
        native(with(&self.shared, |ws| {
            let report = match sandbox {
                Some(sandbox) => sandbox
                    .inner
                    .commit_workspace(ws, &selection, &accept, mode)?,
                None => ws.commit(&selection, &accept, mode)?,
            };
            to_json(&report)
        }))
    }

    /// Removes the staging copy. Idempotent.
    #[napi]
    pub fn discard(&self) -> Option<NativeError> {
        let taken = self
            .shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        taken.and_then(|ws| ws.discard().err()).map(|e| (&e).into())
    }
}

/// The caps of one tool call: `schema` and `arguments` as JSON text, `base` a caps object;
/// with `tier` (a preset name) arguments beyond it are refused naming them. Returns JSON
/// text `{"caps": <caps object>, "arguments": [...]}`.
#[napi]
pub fn caps_for_call(
    env: Env,
    schema: String,
    arguments: String,
    base: Unknown<'_>,
    tier: Option<String>,
    program: Option<String>,
) -> napi::Result<Either<String, NativeError>> {
    let base: Caps = match env.from_js_value::<Option<NodeCaps>, _>(base) {
        Ok(caps) => caps.unwrap_or_default().into(),
        Err(e) => {
            return Ok(Either::B(
                (&crate::convert::invalid_argument("base", &e)).into(),
            ))
        }
    };
    let derived = (|| {
        let schema: Value = serde_json::from_str(&schema)
            .map_err(|e| strata::Error::invalid(format!("schema: {e}")))?;
        let arguments: Value = serde_json::from_str(&arguments)
            .map_err(|e| strata::Error::invalid(format!("arguments: {e}")))?;
        let derived = match tier {
            Some(name) => {
                let tier = strata::policy::Tier::lookup(&name, &[], None)?;
                let tool = strata::Tool::command([program.unwrap_or_else(|| "tool".into())]);
                strata::policy::derive_for_tier(&schema, &arguments, &base, &tier, &tool)?
            }
            None => strata::policy::derive_caps(&schema, &arguments, &base)?,
        };
        let caps = node_caps(&derived.caps)?;
        Ok(serde_json::json!({ "caps": caps, "arguments": derived.arguments }).to_string())
    })();
    Ok(native(derived))
}

/// `caps` as Node's caps object: the canonical JSON with `limits` and `container` flattened
/// and every key in camelCase (the Node column of `strata::names`).
fn node_caps(caps: &Caps) -> strata::Result<Value> {
    let canonical =
        serde_json::to_value(caps).map_err(|e| strata::Error::invalid(format!("caps: {e}")))?;
    let Value::Object(object) = canonical else {
        return Err(strata::Error::invalid(
            "caps did not serialize as an object",
        ));
    };
    let mut out = Map::new();
    for (key, value) in object {
        match (key.as_str(), value) {
            ("limits" | "container", Value::Object(inner)) => {
                for (k, v) in inner {
                    out.insert(camel(&k), camel_keys(v));
                }
            }
            (_, value) => {
                let value = if key == "env" {
                    value
                } else {
                    camel_keys(value)
                };
                out.insert(camel(&key), value);
            }
        }
    }
    Ok(Value::Object(out))
}

fn camel(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut upper = false;
    for c in key.chars() {
        match (c, upper) {
            ('_', _) => upper = true,
            (c, true) => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            (c, false) => out.push(c),
        }
    }
    out
}

/// Object keys in camelCase, at any depth (mounts' `follow_symlinks`, ...).
fn camel_keys(value: Value) -> Value {
    match value {
        Value::Object(object) => Value::Object(
            object
                .into_iter()
                .map(|(k, v)| (camel(&k), camel_keys(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(camel_keys).collect()),
        other => other,
    }
}
