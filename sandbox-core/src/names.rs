//! The one table of caps names: for every field, its canonical name (the serde/JSON one,
//! as in `schema/caps.schema.json`), the Python keyword of `strata.Caps(...)`, the Node
//! property of the caps object, the CLI flag of `strata run`, and the other spellings each
//! dialect still accepts.
//!
//! The Python and Node bindings look every key up here ([`lookup`]): a key that is in no
//! row is refused with an error naming the closest valid one. The CLI's flags and the
//! bindings' declared types (`_strata.pyi`, `index.d.ts`) are checked against this table by
//! tests, and the table is written into the generated caps schema (`x-strata-names`), so
//! those tests read it from there.
//!
//! The conventions, which tests enforce (exceptions are listed in the table's notes):
//!
//! - Python keyword: the JSON name, except durations, which Python takes in seconds
//!   (`timeout`, `cpu_time`) where JSON has milliseconds (`timeout_ms`, `cpu_time_ms`).
//! - Node property: the JSON name in camelCase (`timeout_ms` -> `timeoutMs`).
//! - CLI flag: the Python keyword in kebab-case (`cpu_time` -> `--cpu-time`), for the
//!   fields that have a flag.
//!
//! ```
//! use sandbox_core::names::{self, Dialect, Field};
//! let found = names::lookup(names::CAPS, Dialect::Node, "maxOutput").unwrap();
//! assert_eq!(found.name.field, Field::Output);
//! assert_eq!(found.name.node, Some("output"));
//! assert!(found.alias.is_some(), "maxOutput is a legacy spelling");
//! let err = names::lookup(names::CAPS, Dialect::Python, "memroy").unwrap_err();
//! assert!(err.to_string().contains("did you mean `memory`?"), "{err}");
//! ```

use std::fmt;

/// Where a name is spelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// The serde/JSON schema (`Caps::from_json`, TOML, `to_dict()`): the canonical names.
    Json,
    /// Keywords of Python's `strata.Caps(...)` (and keys of the dict it accepts).
    Python,
    /// Properties of Node's caps object.
    Node,
    /// Flags of `strata run`.
    Cli,
}

impl Dialect {
    /// All dialects, canonical first.
    pub const ALL: [Dialect; 4] = [Dialect::Json, Dialect::Python, Dialect::Node, Dialect::Cli];

    /// The lowercase name used in the schema's `x-strata-names`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Json => "json",
            Dialect::Python => "python",
            Dialect::Node => "node",
            Dialect::Cli => "cli",
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key of the caps, in any dialect: a field of the schema, or a bindings' shorthand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// Shorthand for read-only entries of `mounts` (same path inside).
    ReadOnly,
    /// Shorthand for read-write entries of `mounts` (same path inside).
    ReadWrite,
    /// `mounts`: host paths made visible.
    Mounts,
    /// `protect_host_executed`.
    ProtectHostExecuted,
    /// `system`: the read-only system directories.
    System,
    /// `env`: the tool's environment.
    Env,
    /// `net`: the network policy.
    Net,
    /// `stdin`: bytes fed to the tool.
    Stdin,
    /// `workdir`: the working directory inside.
    Workdir,
    /// `limits`: the whole limits object (schema form).
    Limits,
    /// `limits.timeout_ms`: wall-clock timeout.
    Timeout,
    /// `limits.cpu_time_ms`: CPU time.
    CpuTime,
    /// `limits.memory`.
    Memory,
    /// `limits.processes`: processes and threads alive at once.
    Processes,
    /// `limits.output`: bytes kept per output stream.
    Output,
    /// `limits.file_size`: largest file the tool may write.
    FileSize,
    /// `limits.open_files`: open file descriptors.
    OpenFiles,
    /// `limits.disk`: bytes of the private `/tmp` and workdir.
    Disk,
    /// `limits.address_space`: `RLIMIT_AS`.
    AddressSpace,
    /// `limits.cpus`: CPU bandwidth in cores.
    Cpus,
    /// `limits.egress_bytes`: bytes through the egress proxy.
    EgressBytes,
    /// `limits.egress_connections`: connections through the egress proxy.
    EgressConnections,
    /// `container`: the whole container spec (schema form).
    Container,
    /// `container.image`.
    Image,
    /// `container.runtime`.
    Runtime,
    /// `container.workspace`.
    Workspace,
    /// `agent`: the agent the run acts for.
    Agent,
    /// `secrets`: secrets bound to hosts, sent by the egress proxy.
    Secrets,
}

/// A key of one entry of `mounts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MountField {
    /// `host`: the host path.
    Host,
    /// `guest`: the path inside (default: `host`).
    Guest,
    /// `access`: `ro` or `rw`.
    Access,
    /// `follow_symlinks`.
    FollowSymlinks,
}

/// A per-run option that is not part of the caps (the sandbox's or the CLI's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunOption {
    /// Which backend runs the tool.
    Backend,
    /// [`crate::Strictness`]: refuse what cannot be enforced, or run best effort.
    Strictness,
}

/// Another spelling a dialect accepts for a field, besides its name in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alias {
    /// The dialect that accepts it.
    pub dialect: Dialect,
    /// The spelling.
    pub name: &'static str,
    /// Why it is accepted, and how it differs (units), if it does.
    pub note: &'static str,
}

/// One row of the table: the names of one field in every dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Name<K: 'static> {
    /// The field.
    pub field: K,
    /// Its path in the JSON schema (`limits.output`, `mounts[].host`), or `None` for a
    /// bindings' shorthand that has no key of its own in the schema.
    pub json: Option<&'static str>,
    /// The Python keyword, if Python has one.
    pub python: Option<&'static str>,
    /// The Node property, if Node has one.
    pub node: Option<&'static str>,
    /// The CLI flags (with `--`) that set it; empty when the CLI has none.
    pub cli: &'static [&'static str],
    /// Other accepted spellings, per dialect.
    pub aliases: &'static [Alias],
    /// Units, and how the dialects differ, when they do.
    pub note: &'static str,
}

impl<K> Name<K> {
    /// The key of this field inside its JSON object (`output` for `limits.output`).
    pub fn json_key(&self) -> Option<&'static str> {
        self.json
            .map(|path| path.rsplit(['.', ']']).next().unwrap_or(path))
    }

    /// Its name in `dialect` (for the CLI, its first flag), if that dialect has one.
    pub fn name_in(&self, dialect: Dialect) -> Option<&'static str> {
        match dialect {
            Dialect::Json => self.json_key(),
            Dialect::Python => self.python,
            Dialect::Node => self.node,
            Dialect::Cli => self.cli.first().copied(),
        }
    }

    /// Every spelling `dialect` accepts for it: its name (all flags, for the CLI), then its
    /// aliases.
    pub fn spellings(&self, dialect: Dialect) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = match dialect {
            Dialect::Cli => self.cli.to_vec(),
            _ => self.name_in(dialect).into_iter().collect(),
        };
        out.extend(
            self.aliases
                .iter()
                .filter(|a| a.dialect == dialect)
                .map(|a| a.name),
        );
        out
    }
}

const fn row<K>(
    field: K,
    json: Option<&'static str>,
    python: Option<&'static str>,
    node: Option<&'static str>,
    cli: &'static [&'static str],
) -> Name<K> {
    Name {
        field,
        json,
        python,
        node,
        cli,
        aliases: &[],
        note: "",
    }
}

const fn with<K>(mut name: Name<K>, aliases: &'static [Alias], note: &'static str) -> Name<K> {
    name.aliases = aliases;
    name.note = note;
    name
}

/// The keys of the caps: of Python's `strata.Caps(...)`, Node's caps object, and the caps
/// flags of `strata run`.
pub const CAPS: &[Name<Field>] = &[
    with(
        row(
            Field::ReadOnly,
            None,
            Some("read_only"),
            Some("readOnly"),
            &["--ro", "--ro-follow"],
        ),
        &[],
        "shorthand: adds read-only entries to `mounts` (Python: paths, (host, guest) pairs or a {host: guest} dict; Node: paths; CLI: HOST[:GUEST], --ro-follow also follows symlinks)",
    ),
    with(
        row(
            Field::ReadWrite,
            None,
            Some("read_write"),
            Some("readWrite"),
            &["--rw", "--rw-follow"],
        ),
        &[],
        "shorthand: adds read-write entries to `mounts`, like read_only",
    ),
    row(Field::Mounts, Some("mounts"), Some("mounts"), Some("mounts"), &[]),
    with(
        row(
            Field::ProtectHostExecuted,
            Some("protect_host_executed"),
            Some("protect_host_executed"),
            Some("protectHostExecuted"),
            &["--allow-host-executed-writes"],
        ),
        &[],
        "the CLI flag is the opt-out: it sets false",
    ),
    row(Field::System, Some("system"), Some("system"), Some("system"), &[]),
    with(
        row(Field::Env, Some("env"), Some("env"), Some("env"), &["--env"]),
        &[],
        "CLI: one K=V per flag",
    ),
    with(
        row(Field::Net, Some("net"), Some("net"), Some("net"), &["--net"]),
        &[],
        "Python, Node and the CLI also take the text form: none, host or allow:HOST[:PORT],...",
    ),
    with(
        row(Field::Stdin, Some("stdin"), Some("stdin"), Some("stdin"), &["--stdin"]),
        &[],
        "CLI: a switch that streams the CLI's own standard input instead of fixed bytes",
    ),
    row(
        Field::Workdir,
        Some("workdir"),
        Some("workdir"),
        Some("workdir"),
        &["--workdir"],
    ),
    with(
        row(Field::Limits, Some("limits"), Some("limits"), None, &[]),
        &[],
        "schema form (a dict of the JSON names); Node takes each limit as its own property",
    ),
    with(
        row(
            Field::Timeout,
            Some("limits.timeout_ms"),
            Some("timeout"),
            Some("timeoutMs"),
            &["--timeout"],
        ),
        &[Alias {
            dialect: Dialect::Python,
            name: "timeout_ms",
            note: "the JSON name, in milliseconds",
        }],
        "milliseconds in JSON and Node; seconds in Python and the CLI",
    ),
    with(
        row(
            Field::CpuTime,
            Some("limits.cpu_time_ms"),
            Some("cpu_time"),
            Some("cpuTimeMs"),
            &["--cpu-time"],
        ),
        &[Alias {
            dialect: Dialect::Python,
            name: "cpu_time_ms",
            note: "the JSON name, in milliseconds",
        }],
        "milliseconds in JSON and Node; seconds in Python and the CLI",
    ),
    with(
        row(
            Field::Memory,
            Some("limits.memory"),
            Some("memory"),
            Some("memory"),
            &["--memory"],
        ),
        &[],
        "a byte count or a size string (\"256M\")",
    ),
    with(
        row(
            Field::Processes,
            Some("limits.processes"),
            Some("processes"),
            Some("processes"),
            &["--processes"],
        ),
        &[Alias {
            dialect: Dialect::Cli,
            name: "--pids",
            note: "older flag name, kept as an alias",
        }],
        "hitting it ends the run with limit `pids`",
    ),
    with(
        row(
            Field::Output,
            Some("limits.output"),
            Some("output"),
            Some("output"),
            &["--output"],
        ),
        &[
            Alias {
                dialect: Dialect::Node,
                name: "maxOutput",
                note: "older property name, deprecated",
            },
            Alias {
                dialect: Dialect::Cli,
                name: "--max-output",
                note: "older flag name, kept as an alias",
            },
        ],
        "bytes kept per output stream: a byte count or a size string",
    ),
    row(
        Field::FileSize,
        Some("limits.file_size"),
        Some("file_size"),
        Some("fileSize"),
        &[],
    ),
    row(
        Field::OpenFiles,
        Some("limits.open_files"),
        Some("open_files"),
        Some("openFiles"),
        &[],
    ),
    row(
        Field::Disk,
        Some("limits.disk"),
        Some("disk"),
        Some("disk"),
        &["--disk"],
    ),
    row(
        Field::AddressSpace,
        Some("limits.address_space"),
        Some("address_space"),
        Some("addressSpace"),
        &[],
    ),
    row(Field::Cpus, Some("limits.cpus"), Some("cpus"), Some("cpus"), &[]),
    row(
        Field::EgressBytes,
        Some("limits.egress_bytes"),
        Some("egress_bytes"),
        Some("egressBytes"),
        &["--egress-bytes"],
    ),
    row(
        Field::EgressConnections,
        Some("limits.egress_connections"),
        Some("egress_connections"),
        Some("egressConnections"),
        &["--egress-connections"],
    ),
    with(
        row(Field::Container, Some("container"), Some("container"), None, &[]),
        &[],
        "schema form (a dict of the JSON names); Node takes image, runtime and workspace as their own properties",
    ),
    with(
        row(
            Field::Image,
            Some("container.image"),
            Some("image"),
            Some("image"),
            &["--image"],
        ),
        &[],
        "container backend only",
    ),
    with(
        row(
            Field::Runtime,
            Some("container.runtime"),
            Some("runtime"),
            Some("runtime"),
            &["--runtime"],
        ),
        &[],
        "container backend only",
    ),
    with(
        row(
            Field::Workspace,
            Some("container.workspace"),
            Some("workspace"),
            Some("workspace"),
            &[],
        ),
        &[],
        "container backend, native runtime only",
    ),
    row(
        Field::Agent,
        Some("agent"),
        Some("agent"),
        Some("agent"),
        &["--agent"],
    ),
    with(
        row(
            Field::Secrets,
            Some("secrets"),
            Some("secrets"),
            Some("secrets"),
            &["--secret"],
        ),
        &[],
        "a list of {env, value, hosts}; the CLI takes --secret NAME@HOST[,HOST...] with the value from its own environment variable NAME",
    ),
];

/// The keys of one entry of `mounts` (the CLI has no per-key flags: `--ro HOST[:GUEST]`).
pub const MOUNT: &[Name<MountField>] = &[
    row(
        MountField::Host,
        Some("mounts[].host"),
        Some("host"),
        Some("host"),
        &[],
    ),
    row(
        MountField::Guest,
        Some("mounts[].guest"),
        Some("guest"),
        Some("guest"),
        &[],
    ),
    row(
        MountField::Access,
        Some("mounts[].access"),
        Some("access"),
        Some("access"),
        &[],
    ),
    with(
        row(
            MountField::FollowSymlinks,
            Some("mounts[].follow_symlinks"),
            Some("follow_symlinks"),
            Some("followSymlinks"),
            &["--ro-follow", "--rw-follow"],
        ),
        &[],
        "CLI: the -follow variants of --ro and --rw",
    ),
];

/// Per-run options that are not caps: Python's `Sandbox(...)`, Node's `new Sandbox({...})`,
/// the CLI's flags. Their JSON name is the receipt's field.
pub const OPTIONS: &[Name<RunOption>] = &[
    row(
        RunOption::Backend,
        Some("backend"),
        Some("backend"),
        Some("backend"),
        &["--backend"],
    ),
    with(
        row(
            RunOption::Strictness,
            Some("strictness"),
            Some("strict"),
            Some("strict"),
            &["--best-effort"],
        ),
        &[],
        "a bool in Python and Node (true: strict); the CLI flag selects best_effort",
    ),
];

/// An accepted legacy spelling of an enum value of the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueAlias {
    /// The schema definition the value belongs to (`Strictness`).
    pub schema: &'static str,
    /// The canonical value (`best_effort`).
    pub value: &'static str,
    /// The other spelling that is read as it (`best-effort`).
    pub alias: &'static str,
}

/// Legacy spellings of enum values that every reader accepts. Only the canonical values
/// are written, and only they are in the schema and the bindings' types.
pub const VALUE_ALIASES: &[ValueAlias] = &[
    ValueAlias {
        schema: "Strictness",
        value: "best_effort",
        alias: "best-effort",
    },
    ValueAlias {
        schema: "Access",
        value: "ro",
        alias: "read_only",
    },
    ValueAlias {
        schema: "Access",
        value: "rw",
        alias: "read_write",
    },
    ValueAlias {
        schema: "ContainerRuntime",
        value: "runsc",
        alias: "gvisor",
    },
];

/// A key found in a table: its row, and the alias it was spelled as (`None`: its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found<K: 'static> {
    /// The row.
    pub name: &'static Name<K>,
    /// The alias used, if the key was not the row's name in that dialect.
    pub alias: Option<&'static Alias>,
}

/// A key no row of a table has in a dialect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownKey {
    /// The key as given.
    pub key: String,
    /// The closest valid key of that dialect, if one is close.
    pub suggestion: Option<&'static str>,
    /// Every valid key of that dialect, in table order.
    pub expected: Vec<&'static str>,
}

impl fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown field `{}`", self.key)?;
        if let Some(suggestion) = self.suggestion {
            write!(f, ", did you mean `{suggestion}`?")?;
        }
        f.write_str(" (expected one of ")?;
        for (i, name) in self.expected.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "`{name}`")?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for UnknownKey {}

/// Finds `key` among the names and aliases `dialect` accepts in `table`. An unknown key
/// comes back with the closest valid one: the same field's name in this dialect when `key`
/// is its name in another (`timeoutMs` in Python suggests `timeout`), else the nearest by
/// edit distance.
pub fn lookup<K>(
    table: &'static [Name<K>],
    dialect: Dialect,
    key: &str,
) -> Result<Found<K>, UnknownKey> {
    for name in table {
        if name.name_in(dialect) == Some(key)
            || (dialect == Dialect::Cli && name.cli.contains(&key))
        {
            return Ok(Found { name, alias: None });
        }
        if let Some(alias) = name
            .aliases
            .iter()
            .find(|a| a.dialect == dialect && a.name == key)
        {
            return Ok(Found {
                name,
                alias: Some(alias),
            });
        }
    }
    Err(UnknownKey {
        key: key.to_string(),
        suggestion: suggest(table, dialect, key),
        expected: table.iter().filter_map(|n| n.name_in(dialect)).collect(),
    })
}

/// The valid key of `dialect` closest to `key`, if any is close enough to be a likely typo
/// or another dialect's spelling.
pub fn suggest<K>(table: &'static [Name<K>], dialect: Dialect, key: &str) -> Option<&'static str> {
    let wanted = normalize(key);
    // Another dialect's spelling of a field (or the same words in another case).
    for name in table {
        let Some(here) = name.name_in(dialect) else {
            continue;
        };
        let elsewhere = Dialect::ALL
            .iter()
            .flat_map(|d| name.spellings(*d))
            .chain(name.json_key());
        for spelling in elsewhere {
            if normalize(spelling) == wanted {
                return Some(here);
            }
        }
    }
    // A typo: the nearest name by edit distance, if it is near.
    let limit = (wanted.chars().count() / 3).max(2);
    table
        .iter()
        .filter_map(|n| n.name_in(dialect))
        .map(|name| (distance(&normalize(name), &wanted), name))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, name)| name)
}

/// Lowercase, without `-` and `_`: `timeoutMs`, `timeout_ms` and `--timeout-ms` compare equal.
fn normalize(s: &str) -> String {
    s.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// `snake_case` as `camelCase`.
pub fn camel_case(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The table as JSON, as written into the caps schema under `x-strata-names`.
pub fn to_json() -> serde_json::Value {
    fn rows<K: fmt::Debug>(table: &[Name<K>]) -> serde_json::Value {
        table
            .iter()
            .map(|n| {
                let aliases: Vec<serde_json::Value> = n
                    .aliases
                    .iter()
                    .map(|a| {
                        serde_json::json!({
                            "dialect": a.dialect.as_str(),
                            "name": a.name,
                            "note": a.note,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "field": format!("{:?}", n.field),
                    "json": n.json,
                    "python": n.python,
                    "node": n.node,
                    "cli": n.cli,
                    "aliases": aliases,
                    "note": n.note,
                })
            })
            .collect()
    }
    let values: Vec<serde_json::Value> = VALUE_ALIASES
        .iter()
        .map(|v| serde_json::json!({ "schema": v.schema, "value": v.value, "alias": v.alias }))
        .collect();
    serde_json::json!({
        "caps": rows(CAPS),
        "mount": rows(MOUNT),
        "options": rows(OPTIONS),
        "values": values,
    })
}

/// The table as Markdown, as `docs/caps.md` shows it: one row per field (caps, then mount
/// entries, then run options), then the legacy enum values.
pub fn to_markdown() -> String {
    fn code(name: &str) -> String {
        format!("`{name}`")
    }
    fn rows<K>(out: &mut String, table: &[Name<K>], json_prefix: &str) {
        for n in table {
            let json = match n.json {
                Some(path) => format!("{json_prefix}{}", code(path)),
                None => "(shorthand)".to_string(),
            };
            let name = |dialect: Option<&str>| dialect.map_or("-".to_string(), code);
            let cli = if n.cli.is_empty() {
                "-".to_string()
            } else {
                n.cli.iter().map(|f| code(f)).collect::<Vec<_>>().join(", ")
            };
            let aliases = n
                .aliases
                .iter()
                .map(|a| format!("{} {} ({})", a.dialect, code(a.name), a.note))
                .collect::<Vec<_>>()
                .join("; ");
            out.push_str(&format!(
                "| {json} | {} | {} | {cli} | {} | {} |\n",
                name(n.python),
                name(n.node),
                if aliases.is_empty() { "-" } else { &aliases },
                n.note.replace('|', "\\|"),
            ));
        }
    }
    let mut out = String::from(
        "| JSON (canonical) | Python | Node | CLI | also accepted | notes |\n|---|---|---|---|---|---|\n",
    );
    rows(&mut out, CAPS, "");
    rows(&mut out, MOUNT, "");
    rows(&mut out, OPTIONS, "run option; receipt ");
    out.push_str("\n| enum | value | also accepted |\n|---|---|---|\n");
    for v in VALUE_ALIASES {
        out.push_str(&format!(
            "| `{}` | `{}` | `{}` |\n",
            v.schema, v.value, v.alias
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_is_unique_within_a_dialect() {
        fn check<K: fmt::Debug>(table: &'static [Name<K>]) {
            for dialect in Dialect::ALL {
                let mut seen = std::collections::HashSet::new();
                for name in table {
                    for spelling in name.spellings(dialect) {
                        assert!(
                            seen.insert(spelling),
                            "{dialect} spells two fields {spelling:?}"
                        );
                    }
                }
            }
        }
        check(CAPS);
        check(MOUNT);
        check(OPTIONS);
    }

    #[test]
    fn names_follow_the_conventions() {
        for name in CAPS {
            let python = name.python;
            match (name.json_key(), python) {
                // Durations: seconds in Python, milliseconds in JSON.
                (Some(json), Some(py)) if json.ends_with("_ms") => {
                    assert_eq!(Some(py), json.strip_suffix("_ms"), "{:?}", name.field)
                }
                (Some(json), Some(py)) => assert_eq!(json, py, "{:?}", name.field),
                _ => {}
            }
            if let (Some(node), Some(json)) = (name.node, name.json_key()) {
                assert_eq!(node, camel_case(json), "{:?}", name.field);
            }
            if let (Some(node), None, Some(py)) = (name.node, name.json, python) {
                assert_eq!(node, camel_case(py), "{:?}", name.field);
            }
            // The CLI flag is the Python keyword in kebab-case, but for these.
            let exceptions = [
                Field::ReadOnly,
                Field::ReadWrite,
                Field::ProtectHostExecuted,
                Field::Secrets,
            ];
            if let (Some(flag), Some(py)) = (name.cli.first(), python) {
                if !exceptions.contains(&name.field) {
                    assert_eq!(*flag, format!("--{}", py.replace('_', "-")));
                }
            }
        }
        for name in MOUNT {
            assert_eq!(name.python, name.json_key());
            assert_eq!(name.node.map(String::from), name.json_key().map(camel_case));
        }
    }

    #[test]
    fn lookup_finds_names_and_aliases_and_suggests_the_closest() {
        let found = lookup(CAPS, Dialect::Python, "cpu_time_ms").expect("alias");
        assert_eq!(found.name.field, Field::CpuTime);
        assert_eq!(found.alias.map(|a| a.name), Some("cpu_time_ms"));
        let found = lookup(CAPS, Dialect::Cli, "--ro-follow").expect("second flag");
        assert_eq!(found.name.field, Field::ReadOnly);
        for (dialect, key, suggestion) in [
            (Dialect::Python, "timeoutMs", Some("timeout")),
            (Dialect::Python, "memroy", Some("memory")),
            (Dialect::Python, "mount", Some("mounts")),
            (Dialect::Node, "read_only", Some("readOnly")),
            (Dialect::Node, "readOnyl", Some("readOnly")),
            (Dialect::Node, "timeout", Some("timeoutMs")),
            (Dialect::Node, "max_output", Some("output")),
            (Dialect::Node, "limits", None),
            (Dialect::Python, "zzzzzzzz", None),
        ] {
            let err = lookup(CAPS, dialect, key).expect_err(key);
            assert_eq!(err.suggestion, suggestion, "{dialect} {key}");
            assert!(err
                .to_string()
                .starts_with(&format!("unknown field `{key}`")));
        }
        let err = lookup(MOUNT, Dialect::Node, "follow_symlinks").expect_err("snake");
        assert_eq!(err.suggestion, Some("followSymlinks"));
    }

    #[test]
    fn camel_case_and_json_keys() {
        assert_eq!(camel_case("protect_host_executed"), "protectHostExecuted");
        assert_eq!(camel_case("timeout_ms"), "timeoutMs");
        assert_eq!(MOUNT[3].json_key(), Some("follow_symlinks"));
        assert_eq!(CAPS[10].json_key(), Some("timeout_ms"));
    }
}
