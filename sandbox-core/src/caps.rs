//! Capabilities: everything a sandboxed run may touch.
//!
//! Deny by default. [`Caps::new`] grants nothing of the host but the read-only system
//! directories a dynamically linked program needs to start ([`SystemDirs::Runtime`]),
//! and every other grant is a narrow, named method. Caps are plain serde data with
//! `deny_unknown_fields`, so the Rust API, the Python and Node bindings and TOML files share
//! one schema and an unknown key is an error instead of a silently ignored grant.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize};

use crate::container::{ContainerRuntime, ContainerSpec};
use crate::size::ByteSize;

/// What a run may touch. See the field docs for each default.
///
/// ```
/// use sandbox_core::{Caps, Net};
/// let caps = Caps::new();
/// assert!(caps.mounts.is_empty());
/// assert!(caps.env.is_empty());
/// assert_eq!(caps.net, Net::None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Caps {
    /// Host paths made visible inside the sandbox. Default: none. A host path containing a
    /// symlink is refused unless its mount says [`Mount::follow_symlinks`].
    pub mounts: Vec<Mount>,
    /// Existing host-executed paths ([`crate::grant::HOST_EXECUTED`]: `.git/hooks`,
    /// `.git/config`, `.envrc`, `.vscode`, ...) inside read-write directory grants are bound
    /// read-only, so a tool cannot plant code the host runs later. Default: `true`. Set
    /// `false` (loudly: [`Caps::allow_host_executed_writes`]) when the tool must edit them.
    /// A tool can still create such a path where none existed; see [`crate::grant`].
    pub protect_host_executed: bool,
    /// Read-only system directories granted so host programs can run.
    /// Default: [`SystemDirs::Runtime`].
    pub system: SystemDirs,
    /// Environment of the tool. Default: empty; the host environment is never inherited.
    /// Backends add `PATH`, `HOME` and `LANG` only when they are not set here.
    pub env: BTreeMap<String, String>,
    /// Network access. Default: [`Net::None`].
    pub net: Net,
    /// Resource limits. Default: [`Limits::default`].
    pub limits: Limits,
    /// Bytes fed to the tool's standard input. Default: empty (immediate end of file).
    /// These bytes are held in memory; for large, endless or slow input, stream it with
    /// [`crate::RunContext::stdin`] instead (read after these bytes, with bounded buffering).
    #[serde(
        deserialize_with = "deserialize_stdin",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(schema_with = "stdin_schema")]
    pub stdin: Vec<u8>,
    /// Working directory inside the sandbox. Default: `None`, meaning `/tmp`, the private
    /// scratch directory. A path that is not inside a mount becomes a private, size-capped
    /// directory shared with `/tmp`'s quota.
    pub workdir: Option<PathBuf>,
    /// The image and runtime of a container run (container backend only). Default: `None`.
    /// The other backends refuse caps that set it. With an image, the image replaces the
    /// host's system directories: [`Caps::system`] is not used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerSpec>,
    /// The agent this run acts for (the seeds' "one OS user per agent"). Default: `None`.
    ///
    /// Backends that map identities give each agent its own unprivileged host uid and gid,
    /// stable across runs, so files an agent's tools create belong to it and another
    /// agent's tools cannot use them. Without an agent, each run gets a fresh id no other
    /// run shares. A name is 1 to 64 characters of `a-z`, `0-9`, `_`, `-` and `.`, starting
    /// with a letter or digit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Secrets the tool may use only toward named hosts, under a network allowlist.
    /// Default: none. The tool's environment holds a per-run placeholder in each
    /// [`Secret::env`]; the egress proxy puts the value in place of the placeholder in the
    /// request headers it forwards to the secret's hosts, and nowhere else (HTTPS through a
    /// per-run certificate authority the sandbox trusts). The value is never in the
    /// sandbox, the run spec, receipts or logs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<Secret>,
}

/// A secret bound to hosts (see [`Caps::secrets`]).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    /// The environment variable the tool gets, holding a placeholder (never the value).
    pub env: String,
    /// The value. Not written back out by serialization (`Caps::to_json` omits it), and
    /// redacted by `Debug`. Printable text: no control characters (it goes into headers).
    #[serde(skip_serializing, default)]
    pub value: String,
    /// Where the value may go: exact host names or `*.domain` wildcards (the allowlist's
    /// rule syntax, without ports). At least one.
    pub hosts: Vec<String>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("env", &self.env)
            .field("value", &"<redacted>")
            .field("hosts", &self.hosts)
            .finish()
    }
}

impl Default for Caps {
    fn default() -> Self {
        Caps::new()
    }
}

impl Caps {
    /// Capabilities that grant nothing but what a host program needs to start:
    ///
    /// | capability | default |
    /// |---|---|
    /// | mounts | none |
    /// | protect_host_executed | `true`: `.git/hooks`, `.envrc`, ... in read-write grants stay read-only |
    /// | system | [`SystemDirs::Runtime`]: `/usr`, `/bin`, `/sbin`, `/lib*`, `/etc/ld.so.cache`, `/etc/alternatives`, read-only |
    /// | env | empty (backends add `PATH`, `HOME=/tmp`, `LANG=C.UTF-8` when unset) |
    /// | net | [`Net::None`] |
    /// | limits | [`Limits::default`] |
    /// | stdin | empty |
    /// | workdir | `/tmp` (private, size-capped) |
    /// | container | none (no image; only the container backend reads it) |
    /// | agent | none (a fresh host identity per run where identities are mapped) |
    pub fn new() -> Self {
        Caps {
            mounts: Vec::new(),
            protect_host_executed: true,
            system: SystemDirs::Runtime,
            env: BTreeMap::new(),
            net: Net::None,
            limits: Limits::default(),
            stdin: Vec::new(),
            workdir: None,
            container: None,
            agent: None,
            secrets: Vec::new(),
        }
    }

    /// Parses caps from JSON, rejecting unknown keys.
    pub fn from_json(json: &str) -> crate::Result<Self> {
        serde_json::from_str(json).map_err(|e| crate::Error::invalid(format!("invalid caps: {e}")))
    }

    /// Grants read-only access to `host`, visible at the same path inside.
    pub fn read_only(mut self, host: impl Into<PathBuf>) -> Self {
        let host = host.into();
        self.mounts
            .push(Mount::new(host.clone(), host, Access::ReadOnly));
        self
    }

    /// Grants read-write access to `host`, visible at the same path inside.
    pub fn read_write(mut self, host: impl Into<PathBuf>) -> Self {
        let host = host.into();
        self.mounts
            .push(Mount::new(host.clone(), host, Access::ReadWrite));
        self
    }

    /// Grants `host` at the sandbox path `guest` with `access`.
    pub fn mount(
        mut self,
        host: impl Into<PathBuf>,
        guest: impl Into<PathBuf>,
        access: Access,
    ) -> Self {
        self.mounts
            .push(Mount::new(host.into(), guest.into(), access));
        self
    }

    /// Adds `mount` (e.g. one built with [`Mount::follow_symlinks`]).
    pub fn with_mount(mut self, mount: Mount) -> Self {
        self.mounts.push(mount);
        self
    }

    /// Lets the tool write the host-executed paths ([`crate::grant::HOST_EXECUTED`]) inside
    /// read-write grants. Loud on purpose: git hooks, `.envrc` and editor tasks written by
    /// the tool run on the host later, outside any sandbox.
    pub fn allow_host_executed_writes(mut self) -> Self {
        self.protect_host_executed = false;
        self
    }

    /// Sets one environment variable of the tool.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Sets the network policy.
    pub fn net(mut self, net: Net) -> Self {
        self.net = net;
        self
    }

    /// Shares the host's network with the tool: no network isolation at all. Loud on
    /// purpose; prefer [`Net::Allow`].
    pub fn unrestricted_host_network(self) -> Self {
        self.net(Net::Host)
    }

    /// Replaces the limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets the wall-clock timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.limits.timeout = timeout;
        self
    }

    /// Sets the memory limit.
    pub fn memory(mut self, memory: ByteSize) -> Self {
        self.limits.memory = memory;
        self
    }

    /// Sets standard input.
    pub fn stdin(mut self, stdin: impl Into<Vec<u8>>) -> Self {
        self.stdin = stdin.into();
        self
    }

    /// Sets the working directory inside the sandbox.
    pub fn workdir(mut self, guest: impl Into<PathBuf>) -> Self {
        self.workdir = Some(guest.into());
        self
    }

    /// Runs as `agent`: its own host identity, shared by its runs and by no other agent
    /// (see [`Caps::agent`](Caps#structfield.agent)).
    pub fn agent(mut self, agent: impl Into<String>) -> Self {
        self.agent = Some(agent.into());
        self
    }

    /// Sets which system directories are granted.
    pub fn system(mut self, system: SystemDirs) -> Self {
        self.system = system;
        self
    }

    /// Runs the tool in `image` (container backend), keeping the runtime if one was set
    /// (default [`ContainerRuntime::Native`]). See [`ContainerSpec::image`] for the forms.
    pub fn image(mut self, image: impl Into<String>) -> Self {
        match &mut self.container {
            Some(spec) => spec.image = image.into(),
            None => self.container = Some(ContainerSpec::new(image)),
        }
        self
    }

    /// Chooses the container runtime. Has no effect until an image is set with
    /// [`Caps::image`] (the order of the two calls does not matter).
    pub fn runtime(mut self, runtime: ContainerRuntime) -> Self {
        match &mut self.container {
            Some(spec) => spec.runtime = runtime,
            None => {
                let mut spec = ContainerSpec::new(String::new());
                spec.runtime = runtime;
                self.container = Some(spec);
            }
        }
        self
    }

    /// The working directory the tool starts in (`/tmp` unless set).
    pub fn effective_workdir(&self) -> &Path {
        self.workdir.as_deref().unwrap_or(Path::new("/tmp"))
    }

    /// Checks the caps for mistakes that no backend could honour (relative or `..` paths,
    /// reserved sandbox paths, invalid env names, zero limits). Backends call this before
    /// anything runs; host-dependent checks (does the mount source exist) are theirs.
    pub fn validate(&self) -> crate::Result<()> {
        crate::validate::caps(self)
    }

    /// Refuses a mount at the guest root `/` (the process, container and microVM backends
    /// own their root; only the wasm backend takes a root grant). `backend` names the
    /// backend in the error.
    pub fn refuse_root_mount(&self, backend: crate::backend::BackendKind) -> crate::Result<()> {
        crate::validate::no_root_mount(self, backend)
    }
}

/// One host path granted to the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = mount_schema)]
pub struct Mount {
    /// Absolute, normalized host path (file or directory). Backends refuse it when any
    /// component is a symlink, unless `follow_symlinks` is set.
    pub host: PathBuf,
    /// Absolute path inside the sandbox. Defaults to `host` when omitted in serialized caps.
    pub guest: PathBuf,
    /// Read-only or read-write.
    pub access: Access,
    /// Follow symlinks in `host` and mount what they point to. Default: `false`, so a
    /// symlink planted by an earlier run (say `ws/src -> /secret`) refuses the grant
    /// instead of redirecting it. The receipt names the resolved path either way.
    #[serde(skip_serializing_if = "is_false")]
    pub follow_symlinks: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// Only `host` is required when reading a mount (see its `Deserialize`): `guest` defaults to
/// `host`, `access` to read-only, `follow_symlinks` to `false`.
fn mount_schema(schema: &mut Schema) {
    schema.insert("required".into(), serde_json::json!(["host"]));
    if let Some(serde_json::Value::Object(properties)) = schema.get_mut("properties") {
        for (field, default) in [
            ("access", serde_json::json!("ro")),
            ("follow_symlinks", serde_json::json!(false)),
        ] {
            if let Some(serde_json::Value::Object(property)) = properties.get_mut(field) {
                property.insert("default".into(), default);
            }
        }
    }
}

impl Mount {
    /// A mount of `host` at `guest` that does not follow symlinks.
    pub fn new(host: PathBuf, guest: PathBuf, access: Access) -> Self {
        Mount {
            host,
            guest,
            access,
            follow_symlinks: false,
        }
    }

    /// The same mount, following symlinks in its host path (see [`Mount::follow_symlinks`]).
    pub fn follow_symlinks(mut self) -> Self {
        self.follow_symlinks = true;
        self
    }
}

impl<'de> Deserialize<'de> for Mount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            host: PathBuf,
            guest: Option<PathBuf>,
            #[serde(default)]
            access: Access,
            #[serde(default)]
            follow_symlinks: bool,
        }
        let raw = Raw::deserialize(deserializer)?;
        let guest = raw.guest.unwrap_or_else(|| raw.host.clone());
        let mut mount = Mount::new(raw.host, guest, raw.access);
        mount.follow_symlinks = raw.follow_symlinks;
        Ok(mount)
    }
}

/// Access to a mount. Default: read-only. `read_only` and `read_write` are accepted as
/// legacy spellings of `ro` and `rw` (see [`crate::names::VALUE_ALIASES`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub enum Access {
    /// Read and execute; no write, truncate, chmod, rename, link or delete.
    #[default]
    #[serde(rename = "ro", alias = "read_only")]
    ReadOnly,
    /// Read, write, create and delete beneath the mount.
    #[serde(rename = "rw", alias = "read_write")]
    ReadWrite,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::ReadOnly => "ro",
            Access::ReadWrite => "rw",
        })
    }
}

/// Which host system directories are visible (read-only) so host programs can run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SystemDirs {
    /// `/usr`, `/bin`, `/sbin`, `/lib`, `/lib32`, `/lib64`, `/libx32` (those that exist),
    /// `/etc/ld.so.cache` and `/etc/alternatives`, all read-only. No other part of `/etc`.
    #[default]
    Runtime,
    /// Nothing: only the mounts in the caps (for static binaries or full rootfs mounts).
    None,
}

impl SystemDirs {
    /// Host paths granted by this choice (whether or not they exist on this host).
    pub fn paths(self) -> &'static [&'static str] {
        match self {
            SystemDirs::Runtime => &[
                "/usr",
                "/bin",
                "/sbin",
                "/lib",
                "/lib32",
                "/lib64",
                "/libx32",
                "/etc/ld.so.cache",
                "/etc/alternatives",
            ],
            SystemDirs::None => &[],
        }
    }
}

/// Network policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Net {
    /// No network at all: an empty network namespace with only a private loopback.
    #[default]
    None,
    /// Only the listed destinations, through an egress proxy that resolves names itself.
    /// An empty list denies everything.
    Allow(Vec<NetRule>),
    /// The host's network, unrestricted. Loud opt-in.
    Host,
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Net::None => f.write_str("none"),
            Net::Host => f.write_str("host"),
            Net::Allow(rules) => {
                f.write_str("allow:")?;
                for (i, rule) in rules.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{rule}")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for Net {
    type Err = crate::Error;

    /// Parses the CLI form: `none`, `host`, or `allow:HOST[:PORT],...`.
    fn from_str(s: &str) -> crate::Result<Self> {
        match s {
            "none" => Ok(Net::None),
            "host" => Ok(Net::Host),
            _ => match s.strip_prefix("allow:") {
                Some(list) => list
                    .split(',')
                    .filter(|part| !part.is_empty())
                    .map(str::parse)
                    .collect::<crate::Result<Vec<NetRule>>>()
                    .map(Net::Allow),
                None => Err(crate::Error::invalid(format!(
                    "invalid network policy {s:?} (expected none, host or allow:HOST[:PORT],...)"
                ))),
            },
        }
    }
}

/// One allowed network destination. Text form: `HOST[:PORT]`, `*.DOMAIN[:PORT]`,
/// `CIDR[:PORT]`, or `[IPv6]:PORT` / `[IPv6/PREFIX]:PORT`.
///
/// The syntax is strict (see [`crate::egress`]): names are lowercase LDH, wildcards may not
/// cover a public suffix (`*.com`), addresses are dotted-quad IPv4 or IPv6 (never
/// IPv4-mapped), networks are canonical CIDRs. A rule is checked by
/// [`crate::egress::EgressPolicy`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct NetRule {
    /// Host name, `*.`-prefixed domain, IP address or CIDR network.
    pub host: String,
    /// Port; `None` allows 80 and 443 only.
    pub port: Option<u16>,
}

impl fmt::Display for NetRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) if self.host.contains(':') => write!(f, "[{}]:{port}", self.host),
            Some(port) => write!(f, "{}:{port}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

impl FromStr for NetRule {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        let invalid =
            |why: &str| crate::Error::invalid(format!("invalid network rule {s:?}: {why}"));
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (host, after) = rest
                .split_once(']')
                .ok_or_else(|| invalid("unclosed '['"))?;
            match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None if after.is_empty() => (host, None),
                None => return Err(invalid("junk after ']'")),
            }
        } else if s.matches(':').count() == 1 {
            let (host, port) = s.split_once(':').ok_or_else(|| invalid("bad port"))?;
            (host, Some(port))
        } else {
            (s, None)
        };
        let port = port
            .map(|p| {
                let digits =
                    !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !p.starts_with('0');
                p.parse::<u16>()
                    .ok()
                    .filter(|p| digits && *p != 0)
                    .ok_or_else(|| {
                        invalid("port must be 1-65535, in decimal without leading zeros")
                    })
            })
            .transpose()?;
        let rule = NetRule {
            host: host.to_ascii_lowercase(),
            port,
        };
        crate::validate::net_rule(&rule)?;
        Ok(rule)
    }
}

/// Read as a `"HOST[:PORT]"` string or a `{host, port}` object; written as the object.
impl JsonSchema for NetRule {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "NetRule".into()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        "sandbox_core::caps::NetRule".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let object = json_schema!({
            "type": "object",
            "properties": {
                "host": {
                    "description": "Host name, `*.`-prefixed domain, or IP address.",
                    "type": "string",
                },
                "port": {
                    "description": "Port; absent or null allows 80 and 443 only.",
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": 65535,
                },
            },
            "required": ["host"],
            "additionalProperties": false,
        });
        if generator.contract().is_serialize() {
            let mut object = object;
            object.insert("required".into(), serde_json::json!(["host", "port"]));
            object.insert(
                "description".into(),
                "One allowed network destination.".into(),
            );
            return object;
        }
        json_schema!({
            "description": "One allowed network destination: \"HOST\", \"HOST:PORT\", \"[IPv6]:PORT\", or an object.",
            "anyOf": [{ "type": "string", "minLength": 1 }, object],
        })
    }
}

impl<'de> Deserialize<'de> for NetRule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Object {
                host: String,
                #[serde(default)]
                port: Option<u16>,
            },
        }
        match Raw::deserialize(deserializer)? {
            Raw::Text(text) => text.parse().map_err(serde::de::Error::custom),
            Raw::Object { host, port } => {
                let rule = NetRule {
                    host: host.to_ascii_lowercase(),
                    port,
                };
                crate::validate::net_rule(&rule).map_err(serde::de::Error::custom)?;
                Ok(rule)
            }
        }
    }
}

/// Resource limits. Every limit has a safe default and hitting one ends the run with a
/// typed [`crate::LimitKind`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock time before the whole process tree is killed. Default: 30 s.
    #[serde(rename = "timeout_ms", with = "millis")]
    #[schemars(schema_with = "millis::schema")]
    pub timeout: Duration,
    /// CPU time (user + system) of the tool. Default: 30 s.
    #[serde(rename = "cpu_time_ms", with = "millis")]
    #[schemars(schema_with = "millis::schema")]
    pub cpu_time: Duration,
    /// Memory (resident + tmpfs + kernel memory charged to the run). Default: 512 MiB.
    pub memory: ByteSize,
    /// Processes and threads alive at once. Default: 128.
    pub processes: u32,
    /// Bytes kept per output stream (stdout, stderr); more ends the run. Default: 1 MiB.
    pub output: ByteSize,
    /// Largest file the tool may write. Default: 64 MiB.
    pub file_size: ByteSize,
    /// Open file descriptors. Default: 1024.
    pub open_files: u32,
    /// Bytes in the private `/tmp` and workdir together. Default: 64 MiB.
    pub disk: ByteSize,
    /// Address-space limit (`RLIMIT_AS`). Default: none, because runtimes such as V8 and
    /// Go reserve far more address space than they use; memory is capped by `memory`.
    pub address_space: Option<ByteSize>,
    /// CPU bandwidth in cores (a cgroup quota: 0.5 = half of one core). Default: 1.0, so a
    /// runaway tool leaves the rest of the host responsive.
    pub cpus: f64,
    /// Bytes the run may move through the egress proxy (both directions, all connections
    /// together) under a network allowlist. Past it the connection at hand is closed and
    /// later ones refused ([`crate::LimitKind::EgressBytes`]); the run goes on. `0` allows
    /// connections but no bytes. Default: 1 GiB.
    pub egress_bytes: ByteSize,
    /// Connections the run may ask the egress proxy for (allowed or refused). Past it they
    /// are refused ([`crate::LimitKind::EgressConnections`]); `0` refuses every one. Default:
    /// 1024.
    pub egress_connections: u32,
}

// `cpus` is a plain positive float (validated), so equality is exact comparison.
impl Eq for Limits {}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(30),
            cpu_time: Duration::from_secs(30),
            memory: ByteSize::mib(512),
            processes: 128,
            output: ByteSize::mib(1),
            file_size: ByteSize::mib(64),
            open_files: 1024,
            disk: ByteSize::mib(64),
            address_space: None,
            cpus: 1.0,
            egress_bytes: ByteSize::gib(1),
            egress_connections: 1024,
        }
    }
}

/// Durations as milliseconds in serde (`#[serde(with = "sandbox_core::caps::millis")]`): for
/// the policy crate's types, not a stable API.
#[doc(hidden)]
pub mod millis {
    use std::time::Duration;

    use schemars::{json_schema, Schema, SchemaGenerator};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Milliseconds: any non-negative number when read, an integer when written.
    pub fn schema(generator: &mut SchemaGenerator) -> Schema {
        let kind = if generator.contract().is_serialize() {
            "integer"
        } else {
            "number"
        };
        json_schema!({ "type": kind, "minimum": 0 })
    }

    /// Writes whole milliseconds.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// Reads a non-negative number of milliseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms = f64::deserialize(d)?;
        if !ms.is_finite() || ms < 0.0 {
            return Err(serde::de::Error::custom(format!(
                "a duration in milliseconds must be a non-negative number, got {ms}"
            )));
        }
        Ok(Duration::from_secs_f64(ms / 1000.0))
    }
}

/// Standard input: a UTF-8 string or an array of bytes when read; bytes when written.
fn stdin_schema(generator: &mut SchemaGenerator) -> Schema {
    let bytes = json_schema!({
        "type": "array",
        "items": { "type": "integer", "minimum": 0, "maximum": 255 },
    });
    if generator.contract().is_serialize() {
        return bytes;
    }
    json_schema!({ "anyOf": [{ "type": "string" }, bytes] })
}

fn deserialize_stdin<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Bytes(Vec<u8>),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::Text(s) => s.into_bytes(),
        Raw::Bytes(b) => b,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins every default of `Caps::new()`: changing one must be a deliberate, reviewed act.
    #[test]
    fn defaults_are_deny_by_default() {
        let caps = Caps::new();
        let limits = &caps.limits;
        let table: [(&str, String, &str); 20] = [
            ("mounts", format!("{:?}", caps.mounts), "[]"),
            (
                "protect_host_executed",
                caps.protect_host_executed.to_string(),
                "true",
            ),
            ("system", format!("{:?}", caps.system), "Runtime"),
            ("env", format!("{:?}", caps.env), "{}"),
            ("net", caps.net.to_string(), "none"),
            ("stdin", format!("{:?}", caps.stdin), "[]"),
            (
                "workdir",
                caps.effective_workdir().display().to_string(),
                "/tmp",
            ),
            ("timeout", format!("{:?}", limits.timeout), "30s"),
            ("cpu_time", format!("{:?}", limits.cpu_time), "30s"),
            ("memory", limits.memory.to_string(), "512M"),
            ("processes", limits.processes.to_string(), "128"),
            ("output", limits.output.to_string(), "1M"),
            ("file_size", limits.file_size.to_string(), "64M"),
            ("open_files", limits.open_files.to_string(), "1024"),
            ("disk", limits.disk.to_string(), "64M"),
            (
                "address_space",
                format!("{:?}", limits.address_space),
                "None",
            ),
            ("cpus", limits.cpus.to_string(), "1"),
            ("container", format!("{:?}", caps.container), "None"),
            ("agent", format!("{:?}", caps.agent), "None"),
            (
                "default==new",
                (Caps::default() == caps).to_string(),
                "true",
            ),
        ];
        for (name, actual, expected) in table {
            assert_eq!(actual, expected, "default of {name}");
        }
    }

    #[test]
    fn runtime_system_dirs_hold_no_secrets() {
        for path in SystemDirs::Runtime.paths() {
            assert!(
                !path.starts_with("/etc/shadow") && *path != "/etc" && *path != "/root",
                "{path}"
            );
        }
        assert!(SystemDirs::None.paths().is_empty());
    }

    #[test]
    fn caps_json_round_trips_and_accepts_friendly_forms() {
        let caps = Caps::from_json(
            r#"{"mounts":[{"host":"/data"},{"host":"/out","guest":"/o","access":"rw"}],
                "env":{"A":"1"},"net":{"allow":["example.com:443","10.0.0.1"]},
                "limits":{"timeout_ms":1500,"memory":"256M"},"stdin":"hi"}"#,
        )
        .expect("parse");
        assert_eq!(
            caps.mounts[0],
            Mount::new("/data".into(), "/data".into(), Access::ReadOnly)
        );
        assert_eq!(caps.mounts[1].access, Access::ReadWrite);
        assert_eq!(caps.limits.timeout, Duration::from_millis(1500));
        assert_eq!(caps.limits.memory, ByteSize::mib(256));
        assert_eq!(
            caps.limits.processes, 128,
            "unset limits keep their defaults"
        );
        assert_eq!(caps.stdin, b"hi");
        assert_eq!(caps.net.to_string(), "allow:example.com:443,10.0.0.1");
        assert!(caps.protect_host_executed, "unset means protected");
        assert!(!caps.mounts[0].follow_symlinks, "unset means not followed");
        let again =
            Caps::from_json(&serde_json::to_string(&caps).expect("serialize")).expect("reparse");
        assert_eq!(again, caps);
    }

    #[test]
    fn unknown_caps_keys_are_rejected_not_ignored() {
        for json in [
            r#"{"mount":[]}"#,
            r#"{"limits":{"memroy":"1G"}}"#,
            r#"{"mounts":[{"host":"/x","acess":"rw"}]}"#,
        ] {
            let err = Caps::from_json(json).expect_err(json);
            assert_eq!(err.kind(), crate::ErrorKind::InvalidRequest);
            assert!(err.to_string().contains("unknown field"), "{err}");
        }
    }

    #[test]
    fn symlink_following_and_host_executed_protection_are_explicit_opt_ins() {
        let caps = Caps::from_json(
            r#"{"mounts":[{"host":"/ws/src","follow_symlinks":true}],"protect_host_executed":false}"#,
        )
        .expect("parse");
        assert!(caps.mounts[0].follow_symlinks);
        assert!(!caps.protect_host_executed);
        let again =
            Caps::from_json(&serde_json::to_string(&caps).expect("serialize")).expect("reparse");
        assert_eq!(again, caps);
        let built = Caps::new()
            .with_mount(Mount::new("/a".into(), "/a".into(), Access::ReadOnly).follow_symlinks())
            .allow_host_executed_writes();
        assert!(built.mounts[0].follow_symlinks && !built.protect_host_executed);
        let plain = serde_json::to_string(&Caps::new().read_only("/a")).expect("serialize");
        assert!(
            !plain.contains("follow_symlinks"),
            "the default is not written out: {plain}"
        );
    }

    #[test]
    fn negative_durations_are_rejected() {
        let err = Caps::from_json(r#"{"limits":{"timeout_ms":-1}}"#).expect_err("negative");
        assert!(err.to_string().contains("non-negative"), "{err}");
    }

    #[test]
    fn net_policy_parses_cli_forms() {
        assert_eq!("none".parse::<Net>().expect("none"), Net::None);
        assert_eq!("host".parse::<Net>().expect("host"), Net::Host);
        assert_eq!("allow:".parse::<Net>().expect("empty"), Net::Allow(vec![]));
        let net: Net = "allow:pypi.org:443,[::1]:8080".parse().expect("allow");
        assert_eq!(net.to_string(), "allow:pypi.org:443,[::1]:8080");
        for bad in ["everything", "allow:a:0", "allow:a:99999", "allow:a b"] {
            assert!(bad.parse::<Net>().is_err(), "{bad}");
        }
    }
}
