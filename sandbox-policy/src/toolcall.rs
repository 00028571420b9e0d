//! Permissions from the tool call: the narrowest caps a call's own arguments justify.
//!
//! A tool declares its parameters as a JSON Schema (an MCP `inputSchema`, an OpenAI
//! function's `parameters`). Strata reads one extra keyword on a property's schema,
//! `"x-strata"`, saying what the argument is:
//!
//! | `"x-strata"`   | the argument (a JSON string)                 | grants                                   |
//! |----------------|----------------------------------------------|------------------------------------------|
//! | `"read-path"`  | an absolute host path the tool reads         | that file or directory, read-only        |
//! | `"write-path"` | an absolute host path the tool writes        | that file or directory, read-write       |
//! | `"host"`       | `HOST[:PORT]` the tool connects to           | that destination ([`NetRule`]), allowlist |
//! | `"url"`        | an `http`, `https`, `ws` or `wss` URL        | its host and port (80 or 443 by scheme)  |
//!
//! ```json
//! { "type": "object",
//!   "properties": {
//!     "src":  { "type": "string", "x-strata": "read-path" },
//!     "outs": { "type": "array", "items": { "type": "string", "x-strata": "write-path" } },
//!     "opts": { "type": "object", "properties": { "mirror": { "type": "string", "x-strata": "url" } } }
//!   },
//!   "required": ["src"] }
//! ```
//!
//! That keyword is the whole vocabulary (no `format` spelling). [`derive_caps`] walks the
//! schema alongside the call's arguments through `properties`, `additionalProperties` (a
//! schema) and `items` (one schema for every element), at any depth, and:
//!
//! - adds one mount per path argument, at the same path inside the sandbox, of exactly the
//!   file or directory named (never its parent), after removing `.` and `..` lexically
//!   ([`lexical`]); a path both read and written is one read-write mount. A path the base
//!   caps already show (inside a same-path mount with enough access, or, for a read, inside
//!   the system directories) adds no mount, so no nested mount shadows a writable one;
//! - adds each host or URL argument to a [`Net::Allow`] list (an existing allowlist is
//!   extended; [`Net::Host`] in the base stays as it is);
//! - adds nothing for arguments without the keyword;
//! - records which argument (by JSON pointer, RFC 6901) produced which capability, named as
//!   tiers name them (`read:PATH`, `write:PATH`, `net:allow`), for receipts and prompts.
//!
//! Refused as [`Error::InvalidRequest`], naming the argument's pointer: a path that is not
//! absolute (relative paths are refused, not resolved: the tool resolves them against its
//! own working directory, which need not be any host directory), holds a NUL byte, or
//! cleans to `/`, `/proc` or `/dev`; a write path that is or lies in a host-executed path
//! ([`sandbox_core::grant::HOST_EXECUTED`]: `.git/hooks`, `.envrc`, `.bashrc`, ...) unless the
//! base caps opt out of [`Caps::protect_host_executed`]; a value that is not a string
//! (`null` included); a missing argument that the schema lists in `required` and that holds
//! an annotation; a host that [`NetRule`] refuses, or that is a `*.` wildcard or a network
//! (one argument names one destination); a URL with another scheme, user information, a
//! backslash, a `%` or whitespace in its host part. A malformed schema is refused too: an unknown `"x-strata"` value, an
//! annotation on a schema whose `type` excludes strings or above other annotations, or an
//! annotation where the walk does not go (`anyOf`, `oneOf`, `allOf`, `not`, `if`/`then`/
//! `else`, `$defs`, `patternProperties`, tuple `items`, ...), so no annotation is ever
//! silently ignored.
//!
//! [`derive_for_tier`] then checks the caps against a [`Tier`] and refuses with
//! [`Error::Denied`], before anything runs, when anything beyond the tier stems from an
//! argument: arguments are chosen by the model, so they are never elevated. Needs that stem
//! from the base caps or the tool itself (its program, secrets) are left to
//! [`super::elevation::admit`].
//!
//! The arguments the tool receives are not rewritten: a tool handed `/tmp/../etc/shadow`
//! opens it through the sandbox, where only the cleaned `/etc/shadow` can be mounted.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::tier::{lexical, Tier};
use sandbox_core::caps::{Access, Caps, Mount, Net, NetRule};
use sandbox_core::error::{Error, Result};
use sandbox_core::grant::{Expect, HostExecuted, HOST_EXECUTED};
use sandbox_core::tool::Tool;

/// The JSON Schema keyword that annotates a parameter: `"x-strata"`.
pub const KEYWORD: &str = "x-strata";

/// Guest paths the sandbox provides itself; an argument may not name them (as in
/// [`Caps::validate`]).
const RESERVED: [&str; 2] = ["/proc", "/dev"];

/// What an annotated argument is (the values of [`KEYWORD`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Annotation {
    /// `"read-path"`: an absolute host path, mounted read-only.
    ReadPath,
    /// `"write-path"`: an absolute host path, mounted read-write (writing implies reading).
    WritePath,
    /// `"host"`: `HOST[:PORT]`, allowed as one [`NetRule`]; no port means 80 and 443.
    Host,
    /// `"url"`: an `http`/`https`/`ws`/`wss` URL, allowing its host and its port (80 for
    /// `http` and `ws`, 443 for `https` and `wss` when it names none).
    Url,
}

impl Annotation {
    /// Every annotation, in the order the module doc lists them.
    pub const ALL: [Annotation; 4] = [
        Annotation::ReadPath,
        Annotation::WritePath,
        Annotation::Host,
        Annotation::Url,
    ];

    /// The keyword's value: `read-path`, `write-path`, `host` or `url`.
    pub fn as_str(self) -> &'static str {
        match self {
            Annotation::ReadPath => "read-path",
            Annotation::WritePath => "write-path",
            Annotation::Host => "host",
            Annotation::Url => "url",
        }
    }

    /// The annotation spelled `text`; `None` for anything else (case-sensitive).
    pub fn parse(text: &str) -> Option<Annotation> {
        Annotation::ALL.into_iter().find(|a| a.as_str() == text)
    }
}

/// One capability one argument produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgumentCap {
    /// The argument, as a JSON pointer into the call's arguments (`/files/0`); `""` is the
    /// arguments value itself.
    pub pointer: String,
    /// What the schema says the argument is.
    pub annotation: Annotation,
    /// The capability, named as tiers and grants name it: `read:PATH`, `write:PATH` (PATH
    /// cleaned) or `net:allow`.
    pub capability: String,
    /// What exactly: the cleaned path, or the network rule (`api.example.com:443`).
    pub target: String,
}

/// The caps a tool call justifies, and where each grant came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Derived {
    /// The base caps plus the arguments' mounts and network rules.
    pub caps: Caps,
    /// One entry per annotated argument value, in the order the walk met them (duplicates
    /// kept, so every pointer is accounted for).
    pub arguments: Vec<ArgumentCap>,
}

/// The caps `args` justifies under `schema`, starting from `base` (usually [`Caps::new`]);
/// see the module doc for the vocabulary, the walk and what is refused. A top-level `null`
/// is read as `{}` (a call without arguments). Pure: touches no files, so it cannot tell
/// files from directories or see symlinks (backends refuse symlinked mounts).
pub fn derive_caps(schema: &Value, args: &Value, base: &Caps) -> Result<Derived> {
    let empty = Value::Object(Map::new());
    let args = if args.is_null() { &empty } else { args };
    let mut found = Vec::new();
    walk(schema, "#", Some(args), "", &mut found)?;

    let mut caps = base.clone();
    let mut rules: Vec<NetRule> = Vec::new();
    let mut arguments = Vec::with_capacity(found.len());
    for Found {
        pointer,
        annotation,
        value,
    } in found
    {
        match value {
            Target::Path(path) => {
                let writable = annotation == Annotation::WritePath;
                let verb = if writable { "write" } else { "read" };
                add_mount(&mut caps, &pointer, &path, writable)?;
                arguments.push(ArgumentCap {
                    pointer,
                    annotation,
                    capability: format!("{verb}:{}", path.display()),
                    target: path.display().to_string(),
                });
            }
            Target::Rule(rule) => {
                let target = rule.to_string();
                if !rules.contains(&rule) {
                    rules.push(rule);
                }
                arguments.push(ArgumentCap {
                    pointer,
                    annotation,
                    capability: "net:allow".into(),
                    target,
                });
            }
        }
    }
    if !rules.is_empty() {
        match &mut caps.net {
            Net::None => caps.net = Net::Allow(rules),
            Net::Allow(existing) => {
                for rule in rules {
                    if !existing.contains(&rule) {
                        existing.push(rule);
                    }
                }
            }
            // Host networking, or a policy this version does not know: left as it is.
            _ => {}
        }
    }
    Ok(Derived { caps, arguments })
}

/// [`derive_caps`], then [`Tier::check`]: refuses with [`Error::Denied`] naming the tier,
/// each offending argument's pointer and its capability when any need beyond the tier
/// stems from an argument (a mount at its path, or `net:allow` when it added a rule).
/// Other needs (the program, secrets, the base's own grants) are not judged here: pass the
/// result through [`super::elevation::admit`] as for any run.
pub fn derive_for_tier(
    schema: &Value,
    args: &Value,
    base: &Caps,
    tier: &Tier,
    tool: &Tool,
) -> Result<Derived> {
    let derived = derive_caps(schema, args, base)?;
    let mut refused = Vec::new();
    for need in tier.check(tool, &derived.caps) {
        let path = need
            .capability
            .strip_prefix("read:")
            .or_else(|| need.capability.strip_prefix("write:"));
        for arg in &derived.arguments {
            let stems = match path {
                Some(path) => arg.capability != "net:allow" && arg.target == path,
                None => need.capability == "net:allow" && arg.capability == "net:allow",
            };
            if stems {
                refused.push(format!(
                    "argument {} asks for {} ({})",
                    show(&arg.pointer),
                    need.capability,
                    need.detail
                ));
            }
        }
    }
    if refused.is_empty() {
        return Ok(derived);
    }
    Err(Error::Denied {
        reason: format!(
            "tier {} refuses the tool call's arguments: {}",
            tier.name,
            refused.join("; ")
        ),
    })
}

/// An annotated argument value, checked and normalized.
struct Found {
    pointer: String,
    annotation: Annotation,
    value: Target,
}

enum Target {
    Path(PathBuf),
    Rule(NetRule),
}

/// Walks `schema` (at `spath`, a `#`-rooted pointer into the schema) alongside `arg` (at
/// `apath`; `None` when absent), collecting annotated values.
fn walk(
    schema: &Value,
    spath: &str,
    arg: Option<&Value>,
    apath: &str,
    out: &mut Vec<Found>,
) -> Result<()> {
    let obj = match schema {
        Value::Object(obj) => obj,
        Value::Bool(_) => return Ok(()),
        _ => {
            return Err(Error::invalid(format!(
                "tool schema {spath} is not a schema (an object or a boolean)"
            )))
        }
    };
    for (keyword, value) in obj {
        let walked = matches!(
            keyword.as_str(),
            KEYWORD | "properties" | "additionalProperties"
        ) || (keyword == "items" && !value.is_array());
        if !walked && keyword_annotated(keyword, value) {
            return Err(Error::invalid(format!(
                "tool schema {spath}/{}: {KEYWORD} annotations are read only under properties, additionalProperties and items (one schema); move it there",
                escape(keyword)
            )));
        }
    }

    if let Some(annotation) = obj.get(KEYWORD) {
        let annotation = annotation_of(annotation, obj, spath)?;
        let Some(arg) = arg else {
            return Ok(());
        };
        let Value::String(text) = arg else {
            return Err(Error::invalid(format!(
                "{} is {}, but a {} argument must be a string",
                show(apath),
                kind(arg),
                annotation.as_str()
            )));
        };
        let value = match annotation {
            Annotation::ReadPath | Annotation::WritePath => Target::Path(path_arg(apath, text)?),
            Annotation::Host => Target::Rule(host_arg(apath, text)?),
            Annotation::Url => Target::Rule(url_arg(apath, text)?),
        };
        out.push(Found {
            pointer: apath.to_string(),
            annotation,
            value,
        });
        return Ok(());
    }

    let properties = match obj.get("properties") {
        None => None,
        Some(Value::Object(map)) => Some(map),
        Some(_) => {
            return Err(Error::invalid(format!(
                "tool schema {spath}/properties is not an object"
            )))
        }
    };
    let additional = obj.get("additionalProperties").filter(|s| annotated(s));
    let props_annotated = properties.is_some_and(|p| p.values().any(annotated));
    if props_annotated || additional.is_some() {
        match arg {
            None => {}
            Some(Value::Object(map)) => {
                let required = required(obj, spath)?;
                let empty = Map::new();
                let properties = properties.unwrap_or(&empty);
                for (name, sub) in properties {
                    let spath = format!("{spath}/properties/{}", escape(name));
                    let apath = format!("{apath}/{}", escape(name));
                    match map.get(name) {
                        Some(value) => walk(sub, &spath, Some(value), &apath, out)?,
                        None if required.contains(&name.as_str()) && annotated(sub) => {
                            return Err(Error::invalid(format!(
                                "{} is required by the tool schema and missing",
                                show(&apath)
                            )))
                        }
                        None => {}
                    }
                }
                if let Some(sub) = additional {
                    let spath = format!("{spath}/additionalProperties");
                    for (name, value) in map.iter().filter(|(k, _)| !properties.contains_key(*k)) {
                        let apath = format!("{apath}/{}", escape(name));
                        walk(sub, &spath, Some(value), &apath, out)?;
                    }
                }
            }
            Some(other) => {
                return Err(Error::invalid(format!(
                    "{} is {}, but the tool schema says an object",
                    show(apath),
                    kind(other)
                )))
            }
        }
    }

    if let Some(items) = obj.get("items").filter(|s| !s.is_array() && annotated(s)) {
        match arg {
            None => {}
            Some(Value::Array(values)) => {
                let spath = format!("{spath}/items");
                for (i, value) in values.iter().enumerate() {
                    walk(items, &spath, Some(value), &format!("{apath}/{i}"), out)?;
                }
            }
            Some(other) => {
                return Err(Error::invalid(format!(
                    "{} is {}, but the tool schema says an array",
                    show(apath),
                    kind(other)
                )))
            }
        }
    }
    Ok(())
}

/// The annotation a schema's keyword names, checking the schema around it.
fn annotation_of(value: &Value, obj: &Map<String, Value>, spath: &str) -> Result<Annotation> {
    let annotation = value.as_str().and_then(Annotation::parse).ok_or_else(|| {
        let known: Vec<&str> = Annotation::ALL.iter().map(|a| a.as_str()).collect();
        Error::invalid(format!(
            "tool schema {spath}: {KEYWORD} is {value}; expected one of {}",
            known.join(", ")
        ))
    })?;
    let stringy = match obj.get("type") {
        None => true,
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(types)) => types.iter().any(|t| t == "string"),
        Some(_) => false,
    };
    if !stringy {
        return Err(Error::invalid(format!(
            "tool schema {spath}: a {} annotation needs \"type\": \"string\"",
            annotation.as_str()
        )));
    }
    if ["properties", "additionalProperties", "items"]
        .iter()
        .any(|k| obj.get(*k).is_some_and(|s| keyword_annotated(k, s)))
    {
        return Err(Error::invalid(format!(
            "tool schema {spath}: {KEYWORD} annotates a schema with annotations below it"
        )));
    }
    Ok(annotation)
}

/// The names in a schema's `required` (none when absent).
fn required<'a>(obj: &'a Map<String, Value>, spath: &str) -> Result<Vec<&'a str>> {
    match obj.get("required") {
        None => Ok(Vec::new()),
        Some(Value::Array(names)) => names
            .iter()
            .map(|n| {
                n.as_str().ok_or_else(|| {
                    Error::invalid(format!(
                        "tool schema {spath}/required holds {n}, not a property name"
                    ))
                })
            })
            .collect(),
        Some(_) => Err(Error::invalid(format!(
            "tool schema {spath}/required is not an array"
        ))),
    }
}

/// Whether `schema` holds an annotation anywhere a schema may nest.
fn annotated(schema: &Value) -> bool {
    match schema {
        Value::Object(obj) => obj.iter().any(|(k, v)| keyword_annotated(k, v)),
        _ => false,
    }
}

/// Whether the value of schema keyword `keyword` holds an annotation. Instance data
/// (`default`, `examples`, `const`, `enum`) and unknown keywords hold none.
fn keyword_annotated(keyword: &str, value: &Value) -> bool {
    match keyword {
        KEYWORD => true,
        "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas"
        | "dependencies" => value.as_object().is_some_and(|m| m.values().any(annotated)),
        "items" | "prefixItems" | "allOf" | "anyOf" | "oneOf" => match value {
            Value::Array(list) => list.iter().any(annotated),
            other => annotated(other),
        },
        "additionalProperties"
        | "additionalItems"
        | "unevaluatedProperties"
        | "unevaluatedItems"
        | "contains"
        | "propertyNames"
        | "not"
        | "if"
        | "then"
        | "else" => annotated(value),
        _ => false,
    }
}

/// A path argument, checked and lexically cleaned.
fn path_arg(pointer: &str, text: &str) -> Result<PathBuf> {
    let at = show(pointer);
    if text.contains('\0') {
        return Err(Error::invalid(format!(
            "{at}: path {text:?} contains a NUL byte"
        )));
    }
    if !text.starts_with('/') {
        return Err(Error::invalid(format!(
            "{at}: path {text:?} is not absolute; relative paths are refused (the tool would resolve them against its own working directory)"
        )));
    }
    let path = lexical(Path::new(text));
    if path == Path::new("/") {
        return Err(Error::invalid(format!(
            "{at}: path {text:?} names the root directory, which cannot be mounted"
        )));
    }
    if let Some(reserved) = RESERVED.iter().find(|r| path.starts_with(r)) {
        return Err(Error::invalid(format!(
            "{at}: path {} is inside {reserved}, which the sandbox provides itself",
            path.display()
        )));
    }
    Ok(path)
}

/// A host argument: one destination, `HOST[:PORT]`.
fn host_arg(pointer: &str, text: &str) -> Result<NetRule> {
    let at = show(pointer);
    if text.contains(['*', '/']) {
        return Err(Error::invalid(format!(
            "{at}: host {text:?} is a wildcard or a network; a host argument names one destination"
        )));
    }
    if text.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Error::invalid(format!(
            "{at}: host {text:?} contains whitespace or control characters"
        )));
    }
    text.parse::<NetRule>()
        .map_err(|e| Error::invalid(format!("{at}: {}", reason(e))))
}

/// A URL argument: its host and port (the scheme's default when it names none).
fn url_arg(pointer: &str, text: &str) -> Result<NetRule> {
    let at = show(pointer);
    let invalid = |why: &str| Error::invalid(format!("{at}: URL {text:?} {why}"));
    if text.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(invalid("contains whitespace or control characters"));
    }
    let (scheme, rest) = text
        .split_once("://")
        .ok_or_else(|| invalid("is not an absolute URL (SCHEME://HOST[:PORT]/...)"))?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => 80,
        "https" | "wss" => 443,
        _ => return Err(invalid("has a scheme other than http, https, ws or wss")),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.is_empty() {
        return Err(invalid("names no host"));
    }
    if authority.contains('@') {
        return Err(invalid("carries user information ('@')"));
    }
    if authority.contains(['\\', '%', '*']) {
        return Err(invalid(
            "has '\\', '%' or '*' in its host part, which URL parsers read differently",
        ));
    }
    let mut rule = authority
        .parse::<NetRule>()
        .map_err(|e| invalid(&format!("has a host Strata refuses: {}", reason(e))))?;
    rule.port.get_or_insert(default);
    Ok(rule)
}

/// Adds (or widens) the same-path mount for `path`, unless the caps already show it.
fn add_mount(caps: &mut Caps, pointer: &str, path: &Path, writable: bool) -> Result<()> {
    if writable && caps.protect_host_executed {
        if let Some(item) = host_executed(path) {
            return Err(Error::invalid(format!(
                "{}: path {} is or lies in {}, which the host runs or trusts later ({}); a tool call's argument may not write it",
                show(pointer),
                path.display(),
                item.path,
                item.why
            )));
        }
    }
    if let Some(mount) = caps.mounts.iter_mut().find(|m| m.guest == path) {
        if mount.host != path {
            return Err(Error::invalid(format!(
                "{}: path {} is already mounted from {}",
                show(pointer),
                path.display(),
                mount.host.display()
            )));
        }
        if writable {
            mount.access = Access::ReadWrite;
        }
        return Ok(());
    }
    let mounted = caps.mounts.iter().any(|m| {
        m.host == m.guest
            && path.starts_with(&m.guest)
            && (!writable || m.access == Access::ReadWrite)
    });
    let system_shows_it =
        caps.container.is_none() && caps.system.paths().iter().any(|dir| path.starts_with(dir));
    if mounted || (!writable && system_shows_it) {
        return Ok(());
    }
    let access = if writable {
        Access::ReadWrite
    } else {
        Access::ReadOnly
    };
    caps.mounts
        .push(Mount::new(path.to_path_buf(), path.to_path_buf(), access));
    Ok(())
}

/// The [`HOST_EXECUTED`] entry `path` is or lies in, matched below any of its ancestors (a
/// `.git` gitfile only when `path` is that `.git`: the rest of a `.git` directory is
/// ordinary data; its hooks and config have entries of their own).
fn host_executed(path: &Path) -> Option<&'static HostExecuted> {
    HOST_EXECUTED.iter().find(|item| {
        path.ancestors().any(|base| {
            let full = base.join(item.path);
            match item.expect {
                Expect::Any => path.starts_with(&full),
                Expect::File => path == full,
            }
        })
    })
}

/// `name` escaped for a JSON pointer (RFC 6901: `~` as `~0`, `/` as `~1`).
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// How messages name the argument at `pointer`.
fn show(pointer: &str) -> String {
    if pointer.is_empty() {
        "the arguments value".to_string()
    } else {
        format!("argument {pointer}")
    }
}

/// The JSON type of `value`, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The reason inside an error, without the kind's prefix.
fn reason(error: Error) -> String {
    match error {
        Error::InvalidRequest { reason } => reason,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::caps::SystemDirs;
    use sandbox_core::ErrorKind;
    use serde_json::json;

    fn object(properties: Value) -> Value {
        json!({ "type": "object", "properties": properties })
    }

    fn annotated_as(what: &str) -> Value {
        json!({ "type": "string", "x-strata": what })
    }

    fn derive(schema: &Value, args: Value) -> Result<Derived> {
        derive_caps(schema, &args, &Caps::new())
    }

    fn refused(schema: &Value, args: Value, needles: &[&str]) {
        let err = derive(schema, args.clone()).expect_err(&args.to_string());
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
        let text = err.to_string();
        for needle in needles {
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
    }

    fn rules(caps: &Caps) -> Vec<String> {
        match &caps.net {
            Net::Allow(rules) => rules.iter().map(NetRule::to_string).collect(),
            other => vec![format!("not an allowlist: {other}")],
        }
    }

    fn caps_named(derived: &Derived) -> Vec<(&str, &str)> {
        derived
            .arguments
            .iter()
            .map(|a| (a.pointer.as_str(), a.capability.as_str()))
            .collect()
    }

    #[test]
    fn path_argument_becomes_exactly_that_read_only_mount() {
        let schema = object(json!({ "path": annotated_as("read-path") }));
        let derived = derive(&schema, json!({ "path": "/home/alice/notes.txt" })).expect("derive");
        let expected = Caps::new().read_only("/home/alice/notes.txt");
        assert_eq!(derived.caps, expected, "one read-only mount, nothing else");
        assert_eq!(
            derived.caps.mounts[0].guest,
            Path::new("/home/alice/notes.txt"),
            "the file itself, at the same path, not its parent"
        );
        assert_eq!(
            caps_named(&derived),
            [("/path", "read:/home/alice/notes.txt")]
        );
        assert_eq!(derived.arguments[0].annotation, Annotation::ReadPath);
    }

    #[test]
    fn write_path_becomes_read_write_and_nothing_else() {
        let schema = object(json!({
            "out": annotated_as("write-path"),
            "mode": { "type": "string" },
        }));
        let derived = derive(
            &schema,
            json!({ "out": "/home/alice/out/", "mode": "/etc" }),
        )
        .expect("derive");
        assert_eq!(derived.caps, Caps::new().read_write("/home/alice/out"));
        assert_eq!(caps_named(&derived), [("/out", "write:/home/alice/out")]);
    }

    #[test]
    fn dot_dot_in_a_path_argument_is_cleaned_before_the_tier_check() {
        let schema = object(json!({ "path": annotated_as("read-path") }));
        let args = json!({ "path": "/tmp/../etc/shadow" });
        let derived = derive(&schema, args.clone()).expect("derive");
        assert_eq!(derived.caps, Caps::new().read_only("/etc/shadow"));
        let err = derive_for_tier(
            &schema,
            &args,
            &Caps::new(),
            &Tier::low(),
            &Tool::command(["cat"]),
        )
        .expect_err("beyond tier low");
        assert_eq!(err.kind(), ErrorKind::Denied);
        let text = err.to_string();
        for needle in ["tier low", "argument /path", "read:/etc/shadow"] {
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
        let inside = json!({ "path": "/tmp/./a/../b" });
        let fine = derive_for_tier(
            &schema,
            &inside,
            &Caps::new(),
            &Tier::low(),
            &Tool::command(["cat"]),
        )
        .expect("within /tmp");
        assert_eq!(fine.caps, Caps::new().read_only("/tmp/b"));
    }

    #[test]
    fn argument_outside_the_tier_is_refused_before_anything_runs() {
        let schema = object(json!({
            "src": annotated_as("read-path"),
            "dst": annotated_as("write-path"),
            "api": annotated_as("host"),
        }));
        let medium = Tier::medium("/home/alice");
        let tool = Tool::command(["cp"]);
        let args = json!({ "src": "/home/alice/a", "dst": "/home/bob/b" });
        let err = derive_for_tier(&schema, &args, &Caps::new(), &medium, &tool)
            .expect_err("another user's home");
        assert_eq!(err.kind(), ErrorKind::Denied);
        let text = err.to_string();
        assert!(
            text.contains("tier medium")
                && text.contains("argument /dst")
                && text.contains("write:/home/bob/b"),
            "{text}"
        );
        assert!(
            !text.contains("/src"),
            "the in-tier argument is not blamed: {text}"
        );

        let err = derive_for_tier(
            &schema,
            &json!({ "api": "example.com" }),
            &Caps::new(),
            &Tier::low(),
            &tool,
        )
        .expect_err("no network in tier low");
        assert!(
            err.to_string().contains("argument /api asks for net:allow"),
            "{err}"
        );

        // In the tier, the arguments pass; what stems from the tool (program `cp` is not
        // approved in medium) is left to elevation.
        let derived = derive_for_tier(
            &schema,
            &json!({ "src": "/home/alice/a", "dst": "/home/alice/b", "api": "pypi.org" }),
            &Caps::new(),
            &medium,
            &tool,
        )
        .expect("within medium");
        assert_eq!(derived.caps.mounts.len(), 2);
        assert_eq!(
            medium
                .check(&tool, &derived.caps)
                .iter()
                .map(|n| n.capability.as_str())
                .collect::<Vec<_>>(),
            ["program:cp"]
        );
    }

    #[test]
    fn unannotated_arguments_grant_nothing() {
        let schema = object(json!({
            "path": { "type": "string", "format": "path" },
            "url": { "type": "string", "format": "uri" },
            "nested": { "type": "object", "properties": { "file": { "type": "string" } } },
            "list": { "type": "array", "items": { "type": "string" } },
        }));
        let args = json!({
            "path": "/etc/shadow",
            "url": "https://evil.example.com/",
            "nested": { "file": "/root/.ssh/id_rsa" },
            "list": ["/home", "/"],
            "undeclared": "/var/lib/secret",
        });
        let derived = derive(&schema, args).expect("derive");
        assert_eq!(derived.caps, Caps::new());
        assert!(derived.arguments.is_empty());
        let no_schema = derive(&json!(true), json!({ "path": "/etc" })).expect("derive");
        assert_eq!(no_schema.caps, Caps::new());
    }

    #[test]
    fn url_argument_allows_only_its_host_and_port() {
        let schema = object(json!({ "u": annotated_as("url") }));
        for (url, rule) in [
            ("https://api.example.com/v1?q=1#top", "api.example.com:443"),
            ("HTTP://Example.COM", "example.com:80"),
            ("http://example.com:8080/x", "example.com:8080"),
            ("wss://stream.example.com/socket", "stream.example.com:443"),
            ("http://[::1]:8000/", "[::1]:8000"),
            ("http://10.0.0.7?x=@evil.com", "10.0.0.7:80"),
        ] {
            let derived = derive(&schema, json!({ "u": url })).expect(url);
            assert_eq!(rules(&derived.caps), [rule], "{url}");
            assert!(derived.caps.mounts.is_empty());
            assert_eq!(caps_named(&derived), [("/u", "net:allow")]);
            assert_eq!(derived.arguments[0].target, rule);
        }
        for bad in [
            "file:///etc/passwd",
            "ftp://example.com/",
            "example.com",
            "https:example.com",
            "https://",
            "https:///path",
            "https://user:pw@example.com/",
            "https://good.example.com\\@evil.com/",
            "https://evil%2ecom/",
            "https://*.example.com/",
            "https://ex ample.com/",
            "https://example.com:0/",
            "https://example.com:/",
        ] {
            refused(&schema, json!({ "u": bad }), &["argument /u", "URL"]);
        }
    }

    #[test]
    fn host_argument_names_one_destination_not_a_wildcard_or_network() {
        let schema = object(json!({ "h": annotated_as("host") }));
        let derived = derive(&schema, json!({ "h": "DB.example.com:5432" })).expect("derive");
        assert_eq!(rules(&derived.caps), ["db.example.com:5432"]);
        let derived = derive(&schema, json!({ "h": "example.com" })).expect("derive");
        assert_eq!(rules(&derived.caps), ["example.com"], "no port: 80 and 443");
        for bad in [
            "*.example.com",
            "0.0.0.0/0",
            "10.0.0.0/8:22",
            "*.com",
            "example.com:99999",
            "exa mple.com",
            "",
        ] {
            refused(&schema, json!({ "h": bad }), &["argument /h"]);
        }
    }

    #[test]
    fn wrong_type_for_an_annotated_argument_is_refused() {
        let schema = object(json!({
            "p": annotated_as("read-path"),
            "o": { "type": "object", "properties": { "q": annotated_as("write-path") } },
            "l": { "type": "array", "items": annotated_as("read-path") },
        }));
        for (args, needle) in [
            (json!({ "p": 7 }), "argument /p is a number"),
            (json!({ "p": ["/tmp/x"] }), "argument /p is an array"),
            (
                json!({ "p": { "path": "/tmp/x" } }),
                "argument /p is an object",
            ),
            (json!({ "p": null }), "argument /p is null"),
            (json!({ "o": "/tmp/x" }), "argument /o is a string"),
            (json!({ "l": "/tmp/x" }), "argument /l is a string"),
            (json!({ "l": ["/tmp/x", 1] }), "argument /l/1 is a number"),
            (json!(["/tmp/x"]), "the arguments value is an array"),
        ] {
            refused(&schema, args, &[needle]);
        }
    }

    #[test]
    fn arrays_of_paths_each_become_a_mount() {
        let schema = object(json!({
            "inputs": { "type": "array", "items": annotated_as("read-path") },
        }));
        let derived = derive(
            &schema,
            json!({ "inputs": ["/data/a.csv", "/data/b.csv", "/data/./a.csv"] }),
        )
        .expect("derive");
        assert_eq!(
            derived.caps,
            Caps::new()
                .read_only("/data/a.csv")
                .read_only("/data/b.csv"),
            "one mount per distinct path"
        );
        assert_eq!(
            caps_named(&derived),
            [
                ("/inputs/0", "read:/data/a.csv"),
                ("/inputs/1", "read:/data/b.csv"),
                ("/inputs/2", "read:/data/a.csv"),
            ]
        );
        let hosts = object(json!({
            "mirrors": { "type": "array", "items": annotated_as("host") },
        }));
        let derived = derive(
            &hosts,
            json!({ "mirrors": ["a.example.com", "a.example.com"] }),
        )
        .expect("derive");
        assert_eq!(rules(&derived.caps), ["a.example.com"], "deduplicated");
    }

    #[test]
    fn nested_objects_and_maps_are_walked() {
        let schema = object(json!({
            "job": {
                "type": "object",
                "properties": {
                    "output": {
                        "type": "object",
                        "properties": { "dir": annotated_as("write-path") },
                        "required": ["dir"],
                    },
                    "a/b~c": annotated_as("read-path"),
                },
            },
            "mounts": { "type": "object", "additionalProperties": annotated_as("read-path") },
        }));
        let derived = derive(
            &schema,
            json!({
                "job": { "output": { "dir": "/srv/out" }, "a/b~c": "/srv/in" },
                "mounts": { "x": "/srv/x" },
            }),
        )
        .expect("derive");
        let mut named = caps_named(&derived);
        named.sort();
        assert_eq!(
            named,
            [
                ("/job/a~1b~0c", "read:/srv/in"),
                ("/job/output/dir", "write:/srv/out"),
                ("/mounts/x", "read:/srv/x"),
            ]
        );
        refused(
            &schema,
            json!({ "job": { "output": {} } }),
            &["argument /job/output/dir is required"],
        );
        refused(
            &schema,
            json!({ "mounts": { "y": 3 } }),
            &["argument /mounts/y is a number"],
        );
    }

    #[test]
    fn nul_byte_in_a_path_argument_is_refused() {
        let schema = object(json!({ "p": annotated_as("write-path") }));
        refused(
            &schema,
            json!({ "p": "/tmp/ok\u{0}/../../etc/passwd" }),
            &["argument /p", "NUL"],
        );
    }

    #[test]
    fn relative_root_and_reserved_paths_are_refused() {
        let schema = object(json!({ "p": annotated_as("read-path") }));
        for (path, needle) in [
            ("notes.txt", "not absolute"),
            ("../etc/passwd", "not absolute"),
            ("~/x", "not absolute"),
            ("", "not absolute"),
            ("/", "root directory"),
            ("/tmp/../..", "root directory"),
            ("/proc/1/environ", "inside /proc"),
            ("/dev/../dev/mem", "inside /dev"),
        ] {
            refused(&schema, json!({ "p": path }), &["argument /p", needle]);
        }
    }

    #[test]
    fn missing_required_annotated_argument_is_refused_and_optional_ones_grant_nothing() {
        let schema = json!({
            "type": "object",
            "properties": { "p": annotated_as("read-path"), "q": annotated_as("host") },
            "required": ["p"],
        });
        refused(
            &schema,
            json!({ "q": "example.com" }),
            &["argument /p is required"],
        );
        refused(&schema, Value::Null, &["argument /p is required"]);
        let derived = derive(&schema, json!({ "p": "/srv/a" })).expect("q is optional");
        assert_eq!(derived.caps, Caps::new().read_only("/srv/a"));
    }

    #[test]
    fn a_path_both_read_and_written_becomes_one_read_write_mount() {
        let schema = object(json!({
            "src": annotated_as("read-path"),
            "dst": annotated_as("write-path"),
        }));
        let derived =
            derive(&schema, json!({ "src": "/srv/f", "dst": "/srv/./f" })).expect("derive");
        assert_eq!(derived.caps, Caps::new().read_write("/srv/f"));
        let mut named = caps_named(&derived);
        named.sort();
        assert_eq!(named, [("/dst", "write:/srv/f"), ("/src", "read:/srv/f")]);
    }

    #[test]
    fn base_caps_are_kept_and_merged_not_replaced() {
        let schema = object(json!({
            "dst": annotated_as("write-path"),
            "api": annotated_as("url"),
            "lib": annotated_as("read-path"),
        }));
        let base = Caps::new()
            .read_only("/srv/f")
            .env("A", "1")
            .net(Net::Allow(vec!["pypi.org".parse().expect("rule")]));
        let derived = derive_caps(
            &schema,
            &json!({ "dst": "/srv/f", "api": "https://pypi.org", "lib": "/usr/lib/x.so" }),
            &base,
        )
        .expect("derive");
        let expected = Caps::new().read_write("/srv/f").env("A", "1");
        assert_eq!(derived.caps.mounts, expected.mounts, "widened in place");
        assert_eq!(derived.caps.env, expected.env);
        assert_eq!(rules(&derived.caps), ["pypi.org", "pypi.org:443"]);
        assert_eq!(
            caps_named(&derived).last(),
            Some(&("/lib", "read:/usr/lib/x.so")),
            "a system directory already shows it: recorded, not mounted"
        );
        let bare = derive_caps(
            &schema,
            &json!({ "lib": "/usr/lib/x.so" }),
            &Caps::new().system(SystemDirs::None),
        )
        .expect("derive");
        assert_eq!(
            bare.caps.mounts.len(),
            1,
            "without system directories it is mounted"
        );

        let other = Caps::new().mount("/elsewhere", "/srv/f", Access::ReadOnly);
        let err = derive_caps(&schema, &json!({ "dst": "/srv/f" }), &other).expect_err("clash");
        assert!(
            err.to_string().contains("already mounted from /elsewhere"),
            "{err}"
        );
        let host = derive_caps(
            &schema,
            &json!({ "api": "https://pypi.org" }),
            &Caps::new().net(Net::Host),
        )
        .expect("derive");
        assert_eq!(host.caps.net, Net::Host);
    }

    #[test]
    fn malformed_schemas_are_refused_rather_than_ignored() {
        for (schema, needle) in [
            (
                object(json!({ "p": annotated_as("exec-path") })),
                "expected one of read-path, write-path, host, url",
            ),
            (
                object(json!({ "p": { "type": "integer", "x-strata": "read-path" } })),
                "needs \"type\": \"string\"",
            ),
            (
                object(
                    json!({ "p": { "anyOf": [annotated_as("read-path"), { "type": "null" }] } }),
                ),
                "#/properties/p/anyOf",
            ),
            (
                json!({ "$defs": { "P": annotated_as("read-path") }, "properties": { "p": { "$ref": "#/$defs/P" } } }),
                "#/$defs",
            ),
            (
                json!({ "type": "array", "items": [annotated_as("read-path")] }),
                "#/items",
            ),
            (
                object(
                    json!({ "p": { "x-strata": "read-path", "properties": { "q": annotated_as("host") } } }),
                ),
                "annotations below it",
            ),
            (json!({ "properties": [] }), "#/properties is not an object"),
            (
                json!({ "properties": { "p": annotated_as("host") }, "required": "p" }),
                "#/required is not an array",
            ),
        ] {
            refused(&schema, json!({ "p": "/tmp/x" }), &[needle]);
        }
        // Instance data and unknown keywords are not schemas: an "x-strata" key in them is
        // not an annotation.
        let schema = object(json!({
            "p": { "type": "object", "default": { "x-strata": "read-path" }, "x-other": { "x-strata": "host" } },
        }));
        assert_eq!(
            derive(&schema, json!({ "p": {} })).expect("derive").caps,
            Caps::new()
        );
    }

    #[test]
    fn write_path_argument_cannot_plant_host_executed_files() {
        let schema = object(json!({ "out": annotated_as("write-path") }));
        for path in [
            "/home/alice/repo/.git/hooks/pre-commit",
            "/home/alice/repo/.git/hooks",
            "/home/alice/repo/.git/config",
            "/home/alice/repo/.git",
            "/home/alice/.bashrc",
            "/home/alice/.ssh/authorized_keys",
            "/home/alice/ws/.vscode/tasks.json",
            "/home/alice/ws/sub/.envrc",
        ] {
            refused(
                &schema,
                json!({ "out": path }),
                &["argument /out", "host runs"],
            );
        }
        let derived = derive(
            &schema,
            json!({ "out": "/home/alice/repo/.git/COMMIT_EDITMSG" }),
        )
        .expect("ordinary git data");
        assert_eq!(derived.caps.mounts.len(), 1);
        let read = object(json!({ "in": annotated_as("read-path") }));
        assert!(derive(&read, json!({ "in": "/home/alice/.bashrc" })).is_ok());
        let opted_out = Caps::new().allow_host_executed_writes();
        assert!(derive_caps(
            &schema,
            &json!({ "out": "/home/alice/.bashrc" }),
            &opted_out
        )
        .is_ok());
        let widened = Caps::new().read_only("/home/alice/.bashrc");
        assert!(
            derive_caps(&schema, &json!({ "out": "/home/alice/.bashrc" }), &widened).is_err(),
            "nor widen a read-only base mount of one"
        );
    }

    #[test]
    fn a_path_inside_a_base_mount_adds_no_nested_mount() {
        let schema = object(json!({
            "src": annotated_as("read-path"),
            "dst": annotated_as("write-path"),
        }));
        let base = Caps::new().read_write("/ws").read_only("/data");
        let derived = derive_caps(&schema, &json!({ "src": "/ws/a", "dst": "/ws/b" }), &base)
            .expect("derive");
        assert_eq!(derived.caps, base, "the read-write /ws already shows both");
        assert_eq!(derived.arguments.len(), 2, "still recorded");
        let derived = derive_caps(&schema, &json!({ "dst": "/data/out" }), &base).expect("derive");
        assert_eq!(
            derived.caps.mounts.last(),
            Some(&Mount::new(
                "/data/out".into(),
                "/data/out".into(),
                Access::ReadWrite
            )),
            "a read-only base mount does not cover a write"
        );
    }

    #[test]
    fn annotation_names_round_trip() {
        for annotation in Annotation::ALL {
            assert_eq!(Annotation::parse(annotation.as_str()), Some(annotation));
            let json = serde_json::to_value(annotation).expect("serialize");
            assert_eq!(json, json!(annotation.as_str()));
        }
        assert_eq!(Annotation::parse("Read-Path"), None);
    }
}
