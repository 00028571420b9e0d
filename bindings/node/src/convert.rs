//! Conversions between JavaScript values and Strata's types. No sandbox logic: every
//! decision (validation of paths, limits, routing) is the `strata` crate's.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use napi::bindgen_prelude::{External, FnArgs, JsValuesTupleIntoVec};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use strata::names::{self, Dialect, Field, MountField};
use strata::{
    ByteSize, Caps, ContainerRuntime, ContainerSpec, Error, Mount, Net, NetRule, Receipt,
    RunOutput, Secret, SystemDirs, Tool,
};

/// The caps object of the Node API (`readOnly`, `timeoutMs`, ...), mapped onto [`Caps`].
///
/// Every key is optional and `undefined`/`null` means "keep the default of [`Caps::new`]".
/// Keys are looked up in the table of names (`strata::names::CAPS`, Node column, with its
/// legacy spellings such as `maxOutput`). Unknown keys are rejected, as in every other form
/// of Strata's caps, naming the closest valid key, so a typo never silently drops a
/// restriction.
#[derive(Debug, Default)]
pub(crate) struct NodeCaps {
    read_only: Option<Paths>,
    read_write: Option<Paths>,
    mounts: Option<Vec<NodeMount>>,
    protect_host_executed: Option<bool>,
    system: Option<SystemDirs>,
    env: Option<BTreeMap<String, String>>,
    net: Option<NodeNet>,
    stdin: Option<Stdin>,
    workdir: Option<PathBuf>,
    timeout_ms: Option<Millis>,
    cpu_time_ms: Option<Millis>,
    memory: Option<ByteSize>,
    processes: Option<u32>,
    output: Option<ByteSize>,
    file_size: Option<ByteSize>,
    open_files: Option<u32>,
    disk: Option<ByteSize>,
    address_space: Option<ByteSize>,
    cpus: Option<f64>,
    egress_bytes: Option<ByteSize>,
    egress_connections: Option<u32>,
    image: Option<String>,
    runtime: Option<ContainerRuntime>,
    workspace: Option<PathBuf>,
    agent: Option<String>,
    secrets: Option<Secrets>,
}

impl From<NodeCaps> for Caps {
    fn from(node: NodeCaps) -> Caps {
        let mut caps = Caps::new();
        for path in node.read_only.map(|p| p.0).unwrap_or_default() {
            caps = caps.read_only(path);
        }
        for path in node.read_write.map(|p| p.0).unwrap_or_default() {
            caps = caps.read_write(path);
        }
        caps.mounts
            .extend(node.mounts.unwrap_or_default().into_iter().map(Mount::from));
        if let Some(protect) = node.protect_host_executed {
            caps.protect_host_executed = protect;
        }
        if let Some(system) = node.system {
            caps.system = system;
        }
        caps.env = node.env.unwrap_or_default();
        if let Some(net) = node.net {
            caps.net = net.0;
        }
        if let Some(stdin) = node.stdin {
            caps.stdin = stdin.0;
        }
        caps.workdir = node.workdir;
        caps.agent = node.agent;
        caps.secrets = node.secrets.map(|s| s.0).unwrap_or_default();
        let limits = &mut caps.limits;
        if let Some(ms) = node.timeout_ms {
            limits.timeout = ms.0;
        }
        if let Some(ms) = node.cpu_time_ms {
            limits.cpu_time = ms.0;
        }
        if let Some(size) = node.memory {
            limits.memory = size;
        }
        if let Some(n) = node.processes {
            limits.processes = n;
        }
        if let Some(size) = node.output {
            limits.output = size;
        }
        if let Some(size) = node.file_size {
            limits.file_size = size;
        }
        if let Some(n) = node.open_files {
            limits.open_files = n;
        }
        if let Some(size) = node.disk {
            limits.disk = size;
        }
        if node.address_space.is_some() {
            limits.address_space = node.address_space;
        }
        if let Some(cpus) = node.cpus {
            limits.cpus = cpus;
        }
        if let Some(size) = node.egress_bytes {
            limits.egress_bytes = size;
        }
        if let Some(n) = node.egress_connections {
            limits.egress_connections = n;
        }
        // A runtime or workspace without an image becomes an empty image, which the core
        // refuses by name, rather than options silently ignored.
        if node.image.is_some() || node.runtime.is_some() || node.workspace.is_some() {
            caps.container = Some(ContainerSpec {
                image: node.image.unwrap_or_default(),
                runtime: node.runtime.unwrap_or_default(),
                workspace: node.workspace,
            });
        }
        caps
    }
}

impl<'de> Deserialize<'de> for NodeCaps {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NodeCaps;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a caps object")
            }
            fn visit_unit<E: de::Error>(self) -> Result<NodeCaps, E> {
                Ok(NodeCaps::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NodeCaps, A::Error> {
                let mut caps = NodeCaps::default();
                let mut seen: Vec<(Field, String)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let found = names::lookup(names::CAPS, Dialect::Node, &key)
                        .map_err(de::Error::custom)?;
                    let field = found.name.field;
                    if let Some((_, first)) = seen.iter().find(|(f, _)| *f == field) {
                        return Err(de::Error::custom(format!(
                            "`{first}` and `{key}` are the same field; give one"
                        )));
                    }
                    seen.push((field, key.clone()));
                    match field {
                        Field::ReadOnly => caps.read_only = map.next_value()?,
                        Field::ReadWrite => caps.read_write = map.next_value()?,
                        Field::Mounts => caps.mounts = map.next_value()?,
                        Field::ProtectHostExecuted => {
                            caps.protect_host_executed = map.next_value()?
                        }
                        Field::System => caps.system = map.next_value()?,
                        Field::Env => caps.env = map.next_value()?,
                        Field::Net => caps.net = map.next_value()?,
                        Field::Stdin => caps.stdin = map.next_value()?,
                        Field::Workdir => caps.workdir = map.next_value()?,
                        Field::Timeout => caps.timeout_ms = map.next_value()?,
                        Field::CpuTime => caps.cpu_time_ms = map.next_value()?,
                        Field::Memory => caps.memory = map.next_value()?,
                        Field::Processes => caps.processes = map.next_value()?,
                        Field::Output => caps.output = map.next_value()?,
                        Field::FileSize => caps.file_size = map.next_value()?,
                        Field::OpenFiles => caps.open_files = map.next_value()?,
                        Field::Disk => caps.disk = map.next_value()?,
                        Field::AddressSpace => caps.address_space = map.next_value()?,
                        Field::Cpus => caps.cpus = map.next_value()?,
                        Field::EgressBytes => caps.egress_bytes = map.next_value()?,
                        Field::EgressConnections => caps.egress_connections = map.next_value()?,
                        Field::Image => caps.image = map.next_value()?,
                        Field::Runtime => caps.runtime = map.next_value()?,
                        Field::Workspace => caps.workspace = map.next_value()?,
                        Field::Agent => caps.agent = map.next_value()?,
                        Field::Secrets => caps.secrets = map.next_value()?,
                        // Schema forms Node does not take (the table gives them no Node
                        // name, so the lookup above never returns them).
                        Field::Limits | Field::Container => {
                            return Err(de::Error::custom(format!("unknown field `{key}`")))
                        }
                    }
                }
                Ok(caps)
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// One entry of `mounts`: `{ host, guest?, access?, followSymlinks? }`, keys looked up in
/// `strata::names::MOUNT`.
#[derive(Debug)]
pub(crate) struct NodeMount {
    host: PathBuf,
    guest: Option<PathBuf>,
    access: strata::Access,
    follow_symlinks: bool,
}

impl<'de> Deserialize<'de> for NodeMount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NodeMount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mount object { host, guest?, access?, followSymlinks? }")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NodeMount, A::Error> {
                let mut host: Option<PathBuf> = None;
                let mut guest: Option<PathBuf> = None;
                let mut access: Option<strata::Access> = None;
                let mut follow_symlinks: Option<bool> = None;
                while let Some(key) = map.next_key::<String>()? {
                    let found = names::lookup(names::MOUNT, Dialect::Node, &key)
                        .map_err(de::Error::custom)?;
                    match found.name.field {
                        MountField::Host => host = map.next_value()?,
                        MountField::Guest => guest = map.next_value()?,
                        MountField::Access => access = map.next_value()?,
                        MountField::FollowSymlinks => follow_symlinks = map.next_value()?,
                    }
                }
                Ok(NodeMount {
                    host: host.ok_or_else(|| de::Error::missing_field("host"))?,
                    guest,
                    access: access.unwrap_or_default(),
                    follow_symlinks: follow_symlinks.unwrap_or_default(),
                })
            }
        }
        deserializer.deserialize_map(V)
    }
}

impl From<NodeMount> for Mount {
    fn from(node: NodeMount) -> Mount {
        let guest = node.guest.unwrap_or_else(|| node.host.clone());
        let mount = Mount::new(node.host, guest, node.access);
        if node.follow_symlinks {
            mount.follow_symlinks()
        } else {
            mount
        }
    }
}

/// The `secrets` array: `[{ env, value, hosts }]`, every key required (the schema's form of
/// a secret may lack its value, which is never written out; here it is the input). Errors
/// name the entry and never echo a value.
#[derive(Debug)]
struct Secrets(Vec<Secret>);

impl<'de> Deserialize<'de> for Secrets {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// One entry, as JavaScript gives it.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Entry {
            env: String,
            value: String,
            hosts: Vec<String>,
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Secrets;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of { env, value, hosts } objects")
            }
            // Say what came instead without repeating it: it may be the value itself.
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Secrets, E> {
                Err(E::custom(
                    "secrets must be an array of { env, value, hosts } objects, got a string",
                ))
            }
            fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Secrets, A::Error> {
                Err(de::Error::custom(
                    "secrets must be an array of { env, value, hosts } objects, got an object",
                ))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Secrets, A::Error> {
                let mut out = Vec::new();
                // Each entry is read as JSON data first, then checked, so that its errors
                // are serde's own (napi's deserializer prefixes a status to them).
                while let Some(entry) = seq.next_element::<serde_json::Value>()? {
                    let i = out.len();
                    let kind = match &entry {
                        serde_json::Value::Object(_) => None,
                        serde_json::Value::Array(_) => Some("an array"),
                        serde_json::Value::String(_) => Some("a string"),
                        serde_json::Value::Null => Some("null"),
                        _ => Some("a number or boolean"),
                    };
                    if let Some(kind) = kind {
                        return Err(de::Error::custom(format!(
                            "secrets[{i}] must be an object {{ env, value, hosts }}, got {kind}"
                        )));
                    }
                    let entry = Entry::deserialize(entry)
                        .map_err(|e| de::Error::custom(format!("secrets[{i}]: {e}")))?;
                    out.push(Secret {
                        env: entry.env,
                        value: entry.value,
                        hosts: entry.hosts,
                    });
                }
                Ok(Secrets(out))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A tool: an argv array, or a tagged object `{ kind: 'command' | 'script' | 'wasm', ... }`
/// in the schema of [`Tool`]. Never a shell string.
pub(crate) struct NodeTool(pub(crate) Tool);

impl<'de> Deserialize<'de> for NodeTool {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NodeTool;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "an argv array of strings or a tool from Tool.command, Tool.script or Tool.wasm (never a shell string)",
                )
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<NodeTool, A::Error> {
                let argv = Vec::<String>::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(NodeTool(Tool::command(argv)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NodeTool, A::Error> {
                Tool::deserialize(de::value::MapAccessDeserializer::new(map)).map(NodeTool)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// One path or a list of paths.
#[derive(Debug)]
struct Paths(Vec<PathBuf>);

impl<'de> Deserialize<'de> for Paths {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Paths;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a path or an array of paths")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Paths, E> {
                Ok(Paths(vec![PathBuf::from(v)]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Paths, A::Error> {
                Vec::<PathBuf>::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(Paths)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `'none'`, `'host'`, `'allow:HOST[:PORT],...'`, an array of rules, or `{ allow: [...] }`.
#[derive(Debug)]
struct NodeNet(Net);

impl<'de> Deserialize<'de> for NodeNet {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NodeNet;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "'none', 'host', 'allow:HOST[:PORT],...', an array of allowed destinations or { allow: [...] }",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<NodeNet, E> {
                v.parse().map(NodeNet).map_err(|e| E::custom(reason(e)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<NodeNet, A::Error> {
                let rules =
                    Vec::<NetRule>::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(NodeNet(Net::Allow(rules)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NodeNet, A::Error> {
                Net::deserialize(de::value::MapAccessDeserializer::new(map)).map(NodeNet)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// Standard input: a string (UTF-8) or bytes (`Buffer`, `Uint8Array`).
#[derive(Debug)]
struct Stdin(Vec<u8>);

impl<'de> Deserialize<'de> for Stdin {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Stdin;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a Buffer or a Uint8Array")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Stdin, E> {
                Ok(Stdin(v.as_bytes().to_vec()))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Stdin, E> {
                Ok(Stdin(v.to_vec()))
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Stdin, E> {
                Ok(Stdin(v))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A duration in milliseconds: a finite, non-negative number.
#[derive(Debug)]
struct Millis(Duration);

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let ms = f64::deserialize(deserializer)?;
        Duration::try_from_secs_f64(ms / 1000.0)
            .map(Millis)
            .map_err(|_| {
                de::Error::custom(format!(
                    "a duration in milliseconds must be a finite, non-negative number, got {ms}"
                ))
            })
    }
}

/// The message of an invalid-request error without its "invalid request:" prefix, for
/// errors that end up inside another one.
fn reason(err: Error) -> String {
    match err {
        Error::InvalidRequest { reason } => reason,
        other => other.to_string(),
    }
}

/// Parses `backend` as the Node API spells it (`auto`, `process`, `wasm`, ...).
pub(crate) fn backend_choice(name: Option<&str>) -> Result<strata::BackendChoice, Error> {
    name.map_or(Ok(strata::BackendChoice::Auto), str::parse)
}

/// An error as JavaScript sees it before `index.js` turns it into an `Error` subclass.
#[napi_derive::napi(object, object_from_js = false)]
pub struct NativeError {
    /// The stable code of the error's kind (`invalid_request`, `cancelled`, ...).
    pub code: String,
    /// The message, naming the problem.
    pub message: String,
    /// For `backend_unavailable`: the backend.
    pub backend: Option<String>,
    /// For `unenforceable`: the guarantee that cannot be enforced.
    pub guarantee: Option<String>,
    /// For `limit_exceeded`: the limit.
    pub limit: Option<String>,
    /// For `setup_failed`: the setup stage that failed.
    pub stage: Option<String>,
}

impl From<&Error> for NativeError {
    fn from(err: &Error) -> Self {
        // The message names the problem and, where the Display of `err` leaves it out,
        // the OS cause (`Error::Internal` keeps it only as a source).
        let mut message = err.to_string();
        let mut source = std::error::Error::source(err);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !message.contains(&text) {
                message = format!("{message}: {text}");
            }
            source = cause.source();
        }
        let mut out = NativeError {
            code: err.kind().code().to_string(),
            message,
            backend: None,
            guarantee: None,
            limit: None,
            stage: None,
        };
        match err {
            Error::BackendUnavailable { backend, .. } => out.backend = Some(backend.to_string()),
            Error::Unenforceable { guarantee, .. } => out.guarantee = Some(guarantee.clone()),
            Error::LimitExceeded { limit } => out.limit = Some(limit.to_string()),
            Error::Setup { stage, .. } => out.stage = Some(stage.clone()),
            _ => {}
        }
        out
    }
}

/// An invalid-request error for a value JavaScript passed in (`what` names the argument).
pub(crate) fn invalid_argument(what: &str, err: &napi::Error) -> Error {
    Error::invalid(format!("invalid {what}: {}", err.reason))
}

/// A finished run, converted off the JavaScript thread (everything but the JS objects).
pub(crate) struct Finished {
    pub(crate) output: Option<OutputData>,
    pub(crate) error: Option<NativeError>,
}

/// The parts of a [`RunOutput`] JavaScript reads.
pub(crate) struct OutputData {
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    limit: Option<String>,
    status: String,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
    duration_ms: f64,
    user_cpu_us: f64,
    system_cpu_us: f64,
    peak_memory_bytes: f64,
    receipt: Receipt,
    native_ms: f64,
}

impl Finished {
    /// Converts the result of `Sandbox::run_with`. With `check`, a run that did not exit 0
    /// also carries the error `RunOutput::check` gives (and still its output).
    pub(crate) fn new(result: Result<RunOutput, Error>, native: Duration, check: bool) -> Self {
        match result {
            Err(err) => Finished {
                output: None,
                error: Some(NativeError::from(&err)),
            },
            Ok(out) => {
                let error = if check && !out.success() {
                    out.clone().check().err().map(|e| NativeError::from(&e))
                } else {
                    None
                };
                Finished {
                    output: Some(OutputData {
                        exit_code: out.exit_code(),
                        signal: out.signal(),
                        timed_out: out.timed_out(),
                        limit: out.limit().map(|l| l.to_string()),
                        status: out.status.to_string(),
                        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                        stdout_truncated: out.stdout_truncated,
                        stderr_truncated: out.stderr_truncated,
                        duration_ms: out.duration.as_secs_f64() * 1000.0,
                        user_cpu_us: out.usage.user_cpu_us as f64,
                        system_cpu_us: out.usage.system_cpu_us as f64,
                        peak_memory_bytes: out.usage.peak_memory_bytes as f64,
                        receipt: out.receipt,
                        native_ms: native.as_secs_f64() * 1000.0,
                    }),
                    error,
                }
            }
        }
    }

    /// The arguments of the run's last callback (see [`DoneArgs`]): plain values, no
    /// objects, so that JavaScript builds the result itself (a JavaScript object literal
    /// costs a fraction of an object built property by property through Node-API).
    pub(crate) fn into_args(self, kind: u32) -> DoneArgs {
        match (self.output, self.error) {
            (Some(o), error) => DoneArgs::Ran(Box::new(FnArgs::from((
                kind,
                error,
                o.exit_code,
                o.signal,
                o.timed_out,
                o.limit,
                o.status,
                o.stdout,
                o.stderr,
                o.stdout_truncated,
                o.stderr_truncated,
                o.duration_ms,
                o.native_ms,
                o.user_cpu_us,
                o.system_cpu_us,
                o.peak_memory_bytes,
                External::new(o.receipt),
            )))),
            (None, error) => DoneArgs::NotRun(FnArgs::from((
                kind,
                error.unwrap_or_else(|| {
                    NativeError::from(&Error::Internal {
                        message: "the run ended without an outcome".to_string(),
                        source: None,
                    })
                }),
            ))),
        }
    }
}

/// A run's last callback: `(kind, error)` when the run was refused or failed before the
/// tool ran; `(kind, error, exitCode, signal, timedOut, limit, status, stdout, stderr,
/// stdoutTruncated, stderrTruncated, durationMs, nativeMs, userCpuUs, systemCpuUs,
/// peakMemoryBytes, receipt)` when it ran, `error` then set only when (with `check`) it did
/// not succeed. `receipt` is the receipt kept in Rust until JavaScript reads it with
/// `receiptJson` (most callers never do).
pub(crate) enum DoneArgs {
    NotRun(FnArgs<(u32, NativeError)>),
    Ran(Box<RanArgs>),
}

type RanArgs = FnArgs<(
    u32,
    Option<NativeError>,
    Option<i32>,
    Option<i32>,
    bool,
    Option<String>,
    String,
    String,
    String,
    bool,
    bool,
    f64,
    f64,
    f64,
    f64,
    f64,
    External<Receipt>,
)>;

impl JsValuesTupleIntoVec for DoneArgs {
    fn into_vec(self, env: napi::sys::napi_env) -> napi::Result<Vec<napi::sys::napi_value>> {
        match self {
            DoneArgs::NotRun(args) => args.into_vec(env),
            DoneArgs::Ran(args) => (*args).into_vec(env),
        }
    }
}
