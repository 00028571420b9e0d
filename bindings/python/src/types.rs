//! `Tool` and `Caps`: what to run and what it may touch, as immutable Python objects.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyMapping, PyString, PyTuple};
use serde_json::Value;
use strata::names::{self, Dialect, Field};
use strata::{Caps, Net, ScriptLanguage, Secret, Tool};

use crate::convert::{self, json_to_py, py_to_json};
use crate::errors::{invalid, IntoPyResult};

/// What to run: an argv, a script in a language, or a WebAssembly module.
///
/// Build one with `Tool.command(argv)`, `Tool.script(language, source)` or
/// `Tool.wasm(module, args)`. `Sandbox.run` also takes a plain argv list. A tool is never
/// a shell string; shell code runs only through `Tool.script("sh", source)`.
#[pyclass(frozen, eq, module = "strata._strata", name = "Tool")]
#[derive(Clone, PartialEq)]
pub struct PyTool {
    pub tool: Tool,
}

fn validated(py: Python<'_>, tool: Tool) -> PyResult<PyTool> {
    tool.validate().py_err(py)?;
    Ok(PyTool { tool })
}

#[pymethods]
impl PyTool {
    /// Runs a program directly (no shell): `argv[0]` is a path inside the sandbox or a
    /// name looked up in the sandbox's `PATH`. Raises InvalidRequestError for an empty argv.
    #[staticmethod]
    fn command(py: Python<'_>, argv: &Bound<'_, PyAny>) -> PyResult<Self> {
        validated(py, Tool::command(convert::argv(argv)?))
    }

    /// Runs `source` with the backend's interpreter for `language`: `"python"`,
    /// `"javascript"` (or `"js"`) or `"sh"`.
    #[staticmethod]
    fn script(py: Python<'_>, language: &str, source: &str) -> PyResult<Self> {
        let language: ScriptLanguage = language.parse().py_err(py)?;
        validated(py, Tool::script(language, source))
    }

    /// Runs the WebAssembly module (or `.wat` text) at host path `module` with `args`
    /// (default: none) after the program name.
    #[staticmethod]
    #[pyo3(signature = (module, args = None))]
    fn wasm(
        py: Python<'_>,
        module: &Bound<'_, PyAny>,
        args: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let module = convert::path(module, "wasm module")?;
        let args = match args {
            Some(args) => convert::argv(args)?,
            None => Vec::new(),
        };
        validated(py, Tool::wasm(module, args))
    }

    /// `"command"`, `"script"` or `"wasm"`.
    #[getter]
    fn kind(&self) -> &'static str {
        match &self.tool {
            Tool::Command { .. } => "command",
            Tool::Script { .. } => "script",
            Tool::Wasm { .. } => "wasm",
            _ => "unknown",
        }
    }

    /// The argv of a command tool (`None` for other kinds).
    #[getter]
    fn argv(&self) -> Option<Vec<String>> {
        match &self.tool {
            Tool::Command { argv } => Some(argv.clone()),
            _ => None,
        }
    }

    /// The language of a script tool (`None` for other kinds).
    #[getter]
    fn language(&self) -> Option<&'static str> {
        match &self.tool {
            Tool::Script { language, .. } => Some(language.as_str()),
            _ => None,
        }
    }

    /// The source of a script tool (`None` for other kinds).
    #[getter]
    fn source(&self) -> Option<String> {
        match &self.tool {
            Tool::Script { source, .. } => Some(source.clone()),
            _ => None,
        }
    }

    /// The module path of a wasm tool (`None` for other kinds).
    #[getter]
    fn module(&self) -> Option<String> {
        match &self.tool {
            Tool::Wasm { module, .. } => Some(module.display().to_string()),
            _ => None,
        }
    }

    /// The arguments of a wasm tool (`None` for other kinds).
    #[getter]
    fn args(&self) -> Option<Vec<String>> {
        match &self.tool {
            Tool::Wasm { args, .. } => Some(args.clone()),
            _ => None,
        }
    }

    /// The tool in the shared JSON schema (`{"kind": "command", "argv": [...]}`, ...).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let value = serde_json::to_value(&self.tool)
            .map_err(|e| invalid(py, format!("cannot serialize tool: {e}")))?;
        json_to_py(py, &value)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let repr = |v: &dyn ToPyRepr| v.py_repr(py);
        Ok(match &self.tool {
            Tool::Command { argv } => format!("Tool.command({})", repr(argv)?),
            Tool::Script { language, source } => {
                format!("Tool.script({:?}, {})", language.as_str(), repr(source)?)
            }
            Tool::Wasm { module, args } => format!(
                "Tool.wasm({}, {})",
                repr(&module.display().to_string())?,
                repr(args)?
            ),
            other => format!("Tool({})", other.describe()),
        })
    }
}

/// Python `repr()` of a Rust value converted to Python.
trait ToPyRepr {
    fn py_repr(&self, py: Python<'_>) -> PyResult<String>;
}

impl ToPyRepr for String {
    fn py_repr(&self, py: Python<'_>) -> PyResult<String> {
        Ok(PyString::new(py, self).repr()?.to_string())
    }
}

impl ToPyRepr for Vec<String> {
    fn py_repr(&self, py: Python<'_>) -> PyResult<String> {
        Ok(PyList::new(py, self)?.repr()?.to_string())
    }
}

/// Capabilities: everything a run may touch. Deny by default; immutable.
///
/// `Caps()` grants nothing but read-only system directories (`/usr`, `/bin`, `/lib*`, ...)
/// so host programs can start. Defaults: no mounts, empty env (never inherited), no
/// network, timeout 30 s, cpu_time 30 s, memory 512M, processes 128, output 1M per
/// stream, file_size 64M, open_files 1024, disk 64M (private /tmp), no address-space
/// limit, egress_bytes 1G and egress_connections 1024 (under a network allowlist), empty
/// stdin, workdir /tmp.
///
/// Keywords (also accepted as a dict: `Caps({"read_only": [...]})`):
///
/// - `read_only`, `read_write`: a path, or a list of paths and `(host, guest)` pairs, or a
///   `{host: guest}` dict. A path alone is visible at the same path inside.
/// - `mounts`: the schema form, a list of `{"host", "guest", "access": "ro"|"rw",
///   "follow_symlinks": bool}` dicts or `(host, guest, access)` tuples. A host path with a
///   symlink in it is refused unless its dict says `"follow_symlinks": True`.
/// - `protect_host_executed`: bool, default True: existing `.git/hooks`, `.git/config`,
///   `.envrc`, `.vscode`, shell start-up files, ... inside read-write grants stay read-only.
/// - `env`: dict of str to str.
/// - `net`: `"none"` (default), `"host"` (no network isolation: loud opt-in),
///   `"allow:HOST[:PORT],..."` or a list of `"host[:port]"` rules.
/// - `timeout`, `cpu_time`: seconds (int or float, > 0).
/// - `memory`, `output`, `file_size`, `disk`, `address_space`, `egress_bytes`: bytes (int)
///   or sizes such as `"256M"`.
/// - `processes`, `open_files`, `egress_connections`: counts.
/// - `stdin`: str or bytes fed to the tool.
/// - `workdir`: working directory inside the sandbox.
/// - `agent`: the agent the run acts for; each agent gets its own host uid and gid (a root
///   embedder), other runs a fresh one.
/// - `secrets`: a list of `{"env": name, "value": str, "hosts": [host, ...]}` dicts, under a
///   network allowlist: the tool's variable `env` holds a per-run placeholder, and the
///   egress proxy puts the value in place of it in request headers to `hosts` only. Values
///   are never read back (`secrets`, `to_dict()`, `to_json()` and `repr()` leave them out).
/// - `system`: `"runtime"` (default) or `"none"`.
/// - `image`, `runtime`, `workspace`: the container backend's image, runtime (`"native"`,
///   `"docker"`, `"podman"`, `"runsc"`) and kept writable layer (native runtime); or
///   `container` in the schema form.
/// - `cpus`: CPU bandwidth in cores (default 1.0).
/// - `limits`: a dict in the schema form (`{"timeout_ms": 5000, "memory": "256M"}`); every
///   field of it can also be given as a keyword (`cpus=0.5`; `timeout_ms` and `cpu_time_ms`
///   in milliseconds).
///
/// `Caps(base, **changes)` starts from another Caps: mounts, env and secrets add to the
/// base's (a secret of the same `env` replaces the base's), everything else replaces. The
/// dict form also accepts exactly what `to_dict()` returns (the JSON schema shared with
/// Rust and Node, `schema/caps.schema.json`), but for secret values, which it leaves out. Unknown keys
/// and invalid values raise InvalidRequestError (a ValueError) naming them, and an unknown
/// key the closest valid one.
#[pyclass(frozen, eq, module = "strata._strata", name = "Caps")]
#[derive(Clone, PartialEq)]
pub struct PyCaps {
    pub caps: Caps,
}

fn serde_invalid(py: Python<'_>, e: serde_json::Error) -> PyErr {
    invalid(py, format!("invalid caps: {e}"))
}

/// Mount entries from a `read_only` / `read_write` value, in the schema form.
fn access_mounts(value: &Bound<'_, PyAny>, key: &str, access: &str) -> PyResult<Vec<Value>> {
    let py = value.py();
    let mount = |host: std::path::PathBuf, guest: std::path::PathBuf| {
        serde_json::json!({
            "host": host.to_string_lossy(),
            "guest": guest.to_string_lossy(),
            "access": access,
        })
    };
    if value.is_none() {
        return Ok(Vec::new());
    }
    if value.is_instance_of::<PyString>() || value.hasattr("__fspath__")? {
        let path = convert::path(value, key)?;
        return Ok(vec![mount(path.clone(), path)]);
    }
    let mut out = Vec::new();
    if let Ok(dict) = value.cast::<PyDict>() {
        for (host, guest) in dict.iter() {
            out.push(mount(
                convert::path(&host, key)?,
                convert::path(&guest, key)?,
            ));
        }
        return Ok(out);
    }
    let iter = value.try_iter().map_err(|_| {
        invalid(
            py,
            format!("invalid caps: {key} must be a path, a list of paths and (host, guest) pairs, or a dict"),
        )
    })?;
    for entry in iter {
        let entry = entry?;
        if let Ok(pair) = entry.cast::<PyTuple>() {
            if pair.len() != 2 {
                return Err(invalid(
                    py,
                    format!(
                        "invalid caps: {key}: a pair is (host, guest), got {} items",
                        pair.len()
                    ),
                ));
            }
            out.push(mount(
                convert::path(&pair.get_item(0)?, key)?,
                convert::path(&pair.get_item(1)?, key)?,
            ));
        } else {
            let path = convert::path(&entry, key)?;
            out.push(mount(path.clone(), path));
        }
    }
    Ok(out)
}

/// Mount entries of the `mounts` key: schema dicts, or `(host, guest[, access])` tuples.
fn schema_mounts(value: &Bound<'_, PyAny>) -> PyResult<Vec<Value>> {
    let py = value.py();
    if value.is_none() {
        return Ok(Vec::new());
    }
    let iter = value
        .try_iter()
        .map_err(|_| invalid(py, "invalid caps: mounts must be a list"))?;
    let mut out = Vec::new();
    for entry in iter {
        let entry = entry?;
        match entry.cast::<PyTuple>() {
            Ok(tuple) => {
                if !(2..=3).contains(&tuple.len()) {
                    return Err(invalid(
                        py,
                        "invalid caps: a mount tuple is (host, guest) or (host, guest, access)",
                    ));
                }
                let mut mount = serde_json::Map::new();
                mount.insert(
                    "host".into(),
                    py_to_json(&tuple.get_item(0)?, "mount host")?,
                );
                mount.insert(
                    "guest".into(),
                    py_to_json(&tuple.get_item(1)?, "mount guest")?,
                );
                if tuple.len() == 3 {
                    mount.insert(
                        "access".into(),
                        py_to_json(&tuple.get_item(2)?, "mount access")?,
                    );
                }
                out.push(Value::Object(mount));
            }
            Err(_) => out.push(py_to_json(&entry, "mounts")?),
        }
    }
    Ok(out)
}

/// The `net` key: the CLI's text form, a list of rules, or the schema form.
fn net(value: &Bound<'_, PyAny>) -> PyResult<Value> {
    let py = value.py();
    if value.is_none() {
        return Ok(Value::String("none".into()));
    }
    if let Ok(s) = value.cast::<PyString>() {
        let net: Net = s.to_cow()?.parse().py_err(py)?;
        return serde_json::to_value(net).map_err(|e| serde_invalid(py, e));
    }
    let json = py_to_json(value, "net")?;
    Ok(match json {
        Value::Array(rules) => serde_json::json!({ "allow": rules }),
        other => other,
    })
}

/// Seconds as the schema's milliseconds, refusing negative and non-finite values.
fn millis(value: &Bound<'_, PyAny>, key: &str) -> PyResult<Value> {
    let duration = convert::seconds(value, &format!("caps.{key}"))?;
    let ms = duration.as_secs_f64() * 1000.0;
    Ok(serde_json::Number::from_f64(ms).map_or(Value::Null, Value::Number))
}

/// The `secrets` key: a list of `{"env", "value", "hosts"}` mappings, read straight into
/// [`Secret`]s (not through the JSON schema, whose form of a secret has no value). Wrong
/// shapes and types are refused here, naming the entry and key; what the values may be
/// (names, hosts, an allowlist) is the core's validation.
fn parse_secrets(value: &Bound<'_, PyAny>) -> PyResult<Vec<Secret>> {
    let py = value.py();
    let type_name = |obj: &Bound<'_, PyAny>| {
        obj.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    };
    if value.is_none() {
        return Ok(Vec::new());
    }
    let shape = r#"a list of {"env": ..., "value": ..., "hosts": [...]} dicts"#;
    let not_a_list = value.is_instance_of::<PyString>()
        || value.is_instance_of::<PyBytes>()
        || value.cast::<PyMapping>().is_ok();
    let iter = if not_a_list {
        None
    } else {
        value.try_iter().ok()
    };
    let Some(iter) = iter else {
        return Err(invalid(
            py,
            format!(
                "invalid caps: secrets must be {shape}, got {}",
                type_name(value)
            ),
        ));
    };
    let mut out = Vec::new();
    for (i, entry) in iter.enumerate() {
        let entry = entry?;
        let what = format!("invalid caps: secrets[{i}]");
        let Ok(mapping) = entry.cast::<PyMapping>() else {
            return Err(invalid(
                py,
                format!(
                    r#"{what} must be a dict {{"env", "value", "hosts"}}, got {}"#,
                    type_name(&entry)
                ),
            ));
        };
        let (mut env, mut secret_value, mut hosts) = (None, None, None);
        for item in mapping.items()?.iter() {
            let (key, field): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
            let key = match key.cast::<PyString>() {
                Ok(key) => key.to_cow()?.into_owned(),
                Err(_) => {
                    return Err(invalid(
                        py,
                        format!("{what}: keys must be str, got {key:?}"),
                    ))
                }
            };
            let text = |field: &Bound<'_, PyAny>, name: &str| match field.cast::<PyString>() {
                Ok(s) => Ok(s.to_cow()?.into_owned()),
                Err(_) => Err(invalid(
                    py,
                    format!("{what}.{name} must be a str, got {}", type_name(field)),
                )),
            };
            match key.as_str() {
                "env" => env = Some(text(&field, "env")?),
                "value" => secret_value = Some(text(&field, "value")?),
                "hosts" => {
                    let list =
                        field.is_instance_of::<PyList>() || field.is_instance_of::<PyTuple>();
                    if !list {
                        return Err(invalid(
                            py,
                            format!(
                                "{what}.hosts must be a list of host names, got {}",
                                type_name(&field)
                            ),
                        ));
                    }
                    let mut names = Vec::new();
                    for (j, host) in field.try_iter()?.enumerate() {
                        names.push(text(&host?, &format!("hosts[{j}]"))?);
                    }
                    hosts = Some(names);
                }
                other => {
                    let expected = "a secret has `env`, `value` and `hosts`";
                    return Err(invalid(
                        py,
                        format!("{what}: unknown key `{other}` ({expected})"),
                    ));
                }
            }
        }
        let missing = |name: &str| {
            let hint = match name {
                "value" => " (to_dict() and to_json() leave values out: give them again)",
                _ => "",
            };
            invalid(py, format!("{what}: missing key `{name}`{hint}"))
        };
        out.push(Secret {
            env: env.ok_or_else(|| missing("env"))?,
            value: secret_value.ok_or_else(|| missing("value"))?,
            hosts: hosts.ok_or_else(|| missing("hosts"))?,
        });
    }
    Ok(out)
}

/// Adds `new` to the earlier `secrets` (a base's, or an earlier mapping's), replacing those
/// of the same variable. Two of one variable within `new` both stay, for the core to refuse.
fn merge_secrets(secrets: &mut Vec<Secret>, new: Vec<Secret>) {
    secrets.retain(|old| !new.iter().any(|s| s.env == old.env));
    secrets.extend(new);
}

/// Applies one mapping of keywords to `caps` (as JSON in the shared schema) and `secrets`
/// (kept apart: the schema's form of a secret has no value), merging: mounts, env and
/// secrets add, limits merge per field, everything else replaces. Each keyword is looked
/// up in the table of names (`strata::names::CAPS`); an unknown one is refused with the
/// closest valid keyword.
fn apply_mapping(
    caps: &mut Value,
    secrets: &mut Vec<Secret>,
    mapping: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let py = mapping.py();
    let items = match mapping.cast::<PyDict>() {
        Ok(dict) => dict.items(),
        Err(_) => mapping
            .cast::<PyMapping>()
            .map_err(|_| {
                PyTypeError::new_err(format!(
                    "caps must be a strata.Caps, a dict or None, got {}",
                    mapping
                        .get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?
            .items()?,
    };
    let Value::Object(root) = caps else {
        return Err(invalid(py, "caps did not serialize to an object"));
    };
    for item in items.iter() {
        let (key, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
        let key = key
            .cast::<PyString>()
            .map_err(|_| invalid(py, format!("invalid caps: keys must be str, got {key:?}")))?
            .to_cow()?
            .into_owned();
        let found = names::lookup(names::CAPS, Dialect::Python, &key)
            .map_err(|e| invalid(py, format!("invalid caps: {e}")))?;
        // The field's key in its JSON object (`output` of `limits.output`).
        let json_key = found.name.json_key().unwrap_or(key.as_str()).to_string();
        let mut append_mounts = |mounts: Vec<Value>| {
            if let Some(Value::Array(existing)) = root.get_mut("mounts") {
                existing.extend(mounts);
            } else {
                root.insert("mounts".into(), Value::Array(mounts));
            }
        };
        match found.name.field {
            Field::ReadOnly => append_mounts(access_mounts(&value, &key, "ro")?),
            Field::ReadWrite => append_mounts(access_mounts(&value, &key, "rw")?),
            Field::Mounts => append_mounts(schema_mounts(&value)?),
            Field::Net => {
                root.insert(json_key, net(&value)?);
            }
            Field::Secrets => merge_secrets(secrets, parse_secrets(&value)?),
            Field::Image | Field::Runtime | Field::Workspace => {
                let json = py_to_json(&value, &key)?;
                match root.get_mut("container") {
                    Some(Value::Object(container)) => {
                        container.insert(json_key, json);
                    }
                    _ => {
                        let mut container = serde_json::Map::new();
                        container.insert(json_key, json);
                        root.insert("container".into(), Value::Object(container));
                    }
                }
            }
            Field::Env | Field::Limits | Field::Container => {
                let Value::Object(changes) = py_to_json(&value, &key)? else {
                    return Err(invalid(py, format!("invalid caps: {key} must be a dict")));
                };
                match root.get_mut(&json_key) {
                    Some(Value::Object(existing)) => existing.extend(changes),
                    _ => {
                        root.insert(json_key, Value::Object(changes));
                    }
                }
            }
            field @ (Field::Timeout
            | Field::CpuTime
            | Field::Memory
            | Field::Processes
            | Field::Output
            | Field::FileSize
            | Field::OpenFiles
            | Field::Disk
            | Field::AddressSpace
            | Field::Cpus
            | Field::EgressBytes
            | Field::EgressConnections) => {
                // Python's duration keywords are seconds; their JSON names (aliases) are
                // milliseconds, passed through like every other limit.
                let seconds =
                    matches!(field, Field::Timeout | Field::CpuTime) && found.alias.is_none();
                let json = if seconds {
                    millis(&value, &key)?
                } else {
                    py_to_json(&value, &key)?
                };
                if let Some(Value::Object(limits)) = root.get_mut("limits") {
                    limits.insert(json_key, json);
                }
            }
            Field::ProtectHostExecuted
            | Field::System
            | Field::Stdin
            | Field::Workdir
            | Field::Agent => {
                let json = py_to_json(&value, &key)?;
                root.insert(json_key, json);
            }
        }
    }
    Ok(())
}

impl PyCaps {
    /// Caps from a `caps` argument: a Caps (cloned), a mapping, or None (defaults).
    pub fn from_arg(caps: Option<&Bound<'_, PyAny>>) -> PyResult<Caps> {
        match caps {
            None => Ok(Caps::new()),
            Some(obj) if obj.is_none() => Ok(Caps::new()),
            Some(obj) => match obj.cast::<PyCaps>() {
                Ok(c) => Ok(c.get().caps.clone()),
                Err(_) => Ok(PyCaps::build(obj.py(), Some(obj), None)?.caps),
            },
        }
    }

    fn build(
        py: Python<'_>,
        base: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut caps = match base.map(|b| b.cast::<PyCaps>()) {
            Some(Ok(c)) => c.get().caps.clone(),
            _ => Caps::new(),
        };
        let mappings = [
            base.filter(|b| !b.is_none() && b.cast::<PyCaps>().is_err()),
            kwargs.map(|k| k.as_any()),
        ];
        if mappings.iter().any(Option::is_some) {
            // Secrets go around the JSON: serializing one drops its value.
            let mut secrets = std::mem::take(&mut caps.secrets);
            let mut json = serde_json::to_value(&caps).map_err(|e| serde_invalid(py, e))?;
            for mapping in mappings.into_iter().flatten() {
                apply_mapping(&mut json, &mut secrets, mapping)?;
            }
            caps = serde_path_to_error::deserialize(json).map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                if path == "." || path.is_empty() {
                    serde_invalid(py, inner)
                } else {
                    invalid(py, format!("invalid caps: {path}: {inner}"))
                }
            })?;
            caps.secrets = secrets;
        }
        caps.validate().py_err(py)?;
        Ok(PyCaps { caps })
    }
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

#[pymethods]
impl PyCaps {
    #[new]
    #[pyo3(signature = (base = None, /, **kwargs))]
    fn new(
        py: Python<'_>,
        base: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        PyCaps::build(py, base, kwargs)
    }

    /// Parses caps from JSON in the shared schema (what `to_json()` writes); unknown keys
    /// raise InvalidRequestError.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Self> {
        let caps = Caps::from_json(text).py_err(py)?;
        caps.validate().py_err(py)?;
        Ok(PyCaps { caps })
    }

    /// The caps as a dict in the shared JSON schema; `Caps(d)` accepts it back.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &self.json(py)?)
    }

    /// The caps as JSON in the shared schema (Rust `Caps::from_json`, Node, TOML files).
    fn to_json(&self, py: Python<'_>) -> PyResult<String> {
        serde_json::to_string(&self.caps)
            .map_err(|e| invalid(py, format!("cannot serialize caps: {e}")))
    }

    /// Mounts as dicts `{"host", "guest", "access"}` (access `"ro"` or `"rw"`), plus
    /// `"follow_symlinks": True` for mounts that follow symlinks.
    #[getter]
    fn mounts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let value = serde_json::to_value(&self.caps.mounts)
            .map_err(|e| invalid(py, format!("cannot serialize mounts: {e}")))?;
        json_to_py(py, &value)
    }

    /// Whether existing host-executed paths inside read-write grants stay read-only.
    #[getter]
    fn protect_host_executed(&self) -> bool {
        self.caps.protect_host_executed
    }

    /// Environment of the tool (a copy).
    #[getter]
    fn env(&self) -> std::collections::BTreeMap<String, String> {
        self.caps.env.clone()
    }

    /// Network policy: `"none"`, `"host"` or `"allow:..."`.
    #[getter]
    fn net(&self) -> String {
        self.caps.net.to_string()
    }

    /// Wall-clock timeout in seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        secs(self.caps.limits.timeout)
    }

    /// CPU-time limit in seconds.
    #[getter]
    fn cpu_time(&self) -> f64 {
        secs(self.caps.limits.cpu_time)
    }

    /// Memory limit in bytes.
    #[getter]
    fn memory(&self) -> u64 {
        self.caps.limits.memory.bytes()
    }

    /// Bytes kept per output stream.
    #[getter]
    fn output(&self) -> u64 {
        self.caps.limits.output.bytes()
    }

    /// Largest file the tool may write, in bytes.
    #[getter]
    fn file_size(&self) -> u64 {
        self.caps.limits.file_size.bytes()
    }

    /// Bytes of the private /tmp and workdir together.
    #[getter]
    fn disk(&self) -> u64 {
        self.caps.limits.disk.bytes()
    }

    /// Address-space limit in bytes (`None`: no limit).
    #[getter]
    fn address_space(&self) -> Option<u64> {
        self.caps.limits.address_space.map(|b| b.bytes())
    }

    /// Processes and threads alive at once.
    #[getter]
    fn processes(&self) -> u32 {
        self.caps.limits.processes
    }

    /// Open file descriptors.
    #[getter]
    fn open_files(&self) -> u32 {
        self.caps.limits.open_files
    }

    /// CPU bandwidth in cores (a cgroup quota: 0.5 is half of one core).
    #[getter]
    fn cpus(&self) -> f64 {
        self.caps.limits.cpus
    }

    /// Bytes the run may move through the egress proxy under a network allowlist (both
    /// directions, all connections together).
    #[getter]
    fn egress_bytes(&self) -> u64 {
        self.caps.limits.egress_bytes.bytes()
    }

    /// Connections the run may ask the egress proxy for (allowed or refused).
    #[getter]
    fn egress_connections(&self) -> u32 {
        self.caps.limits.egress_connections
    }

    /// Standard input fed to the tool.
    #[getter]
    fn stdin<'py>(&self, py: Python<'py>) -> Bound<'py, pyo3::types::PyBytes> {
        pyo3::types::PyBytes::new(py, &self.caps.stdin)
    }

    /// The secrets as dicts `{"env", "hosts"}`: the values are never given back.
    #[getter]
    fn secrets<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let value = serde_json::to_value(&self.caps.secrets)
            .map_err(|e| invalid(py, format!("cannot serialize secrets: {e}")))?;
        json_to_py(py, &value)
    }

    /// The agent this run acts for (its own host identity where the backend maps them).
    #[getter]
    fn agent(&self) -> Option<String> {
        self.caps.agent.clone()
    }

    /// Working directory inside the sandbox (`None`: `/tmp`).
    #[getter]
    fn workdir(&self) -> Option<String> {
        self.caps.workdir.as_ref().map(|p| p.display().to_string())
    }

    /// System directories granted read-only: `"runtime"` or `"none"`.
    #[getter]
    fn system(&self, py: Python<'_>) -> PyResult<String> {
        match serde_json::to_value(self.caps.system) {
            Ok(Value::String(s)) => Ok(s),
            _ => Err(invalid(py, "cannot serialize system dirs")),
        }
    }

    /// `Caps({...})` with only what differs from the defaults.
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let mine = self.json(py)?;
        let defaults = serde_json::to_value(Caps::new())
            .map_err(|e| invalid(py, format!("cannot serialize caps: {e}")))?;
        let mut diff = serde_json::Map::new();
        if let (Value::Object(mine), Value::Object(defaults)) = (mine, defaults) {
            for (key, value) in mine {
                match (key.as_str(), &value, defaults.get(&key)) {
                    ("limits", Value::Object(limits), Some(Value::Object(default_limits))) => {
                        let changed: serde_json::Map<String, Value> = limits
                            .iter()
                            .filter(|(k, v)| default_limits.get(*k) != Some(*v))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        if !changed.is_empty() {
                            diff.insert(key, Value::Object(changed));
                        }
                    }
                    (_, value, default) if default != Some(value) => {
                        diff.insert(key, value.clone());
                    }
                    _ => {}
                }
            }
        }
        if diff.is_empty() {
            return Ok("Caps()".to_string());
        }
        let dict = json_to_py(py, &Value::Object(diff))?;
        Ok(format!("Caps({})", dict.repr()?))
    }
}

impl PyCaps {
    fn json(&self, py: Python<'_>) -> PyResult<Value> {
        serde_json::to_value(&self.caps)
            .map_err(|e| invalid(py, format!("cannot serialize caps: {e}")))
    }
}
