//! Host-independent checks of a request. Everything here is pure; backends add the checks
//! that need the host (does a mount source exist).

use std::collections::HashSet;
use std::path::{Component, Path};

use crate::backend::BackendKind;
use crate::caps::{Caps, NetRule};
use crate::error::{Error, Result};
use crate::tool::Tool;

/// Guest paths the sandbox owns; a mount may not replace them.
const RESERVED_GUEST_PATHS: [&str; 2] = ["/proc", "/dev"];

/// Refuses a grant at the guest root `/` for `backend`, whose root is its own (a fresh root
/// file system, an image, a guest disk). Only the wasm backend takes a root grant, as
/// `wasmtime run --dir HOST::/` does.
pub(crate) fn no_root_mount(caps: &Caps, backend: BackendKind) -> Result<()> {
    match caps.mounts.iter().find(|m| m.guest == Path::new("/")) {
        Some(mount) => Err(Error::invalid(format!(
            "mount {} -> /: the {backend} backend's root cannot be a mount; mount below it (only the wasm backend takes a root grant)",
            mount.host.display()
        ))),
        None => Ok(()),
    }
}

pub(crate) fn caps(caps: &Caps) -> Result<()> {
    let mut seen = HashSet::new();
    for mount in &caps.mounts {
        absolute_clean("mount host path", &mount.host)?;
        absolute_clean("mount guest path", &mount.guest)?;
        for reserved in RESERVED_GUEST_PATHS {
            if mount.guest.starts_with(reserved) {
                return Err(Error::invalid(format!(
                    "mount guest path {} is inside {reserved}, which the sandbox provides itself",
                    mount.guest.display()
                )));
            }
        }
        if !seen.insert(mount.guest.clone()) {
            return Err(Error::invalid(format!(
                "two mounts target the same guest path {}",
                mount.guest.display()
            )));
        }
    }
    for (key, value) in &caps.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(Error::invalid(format!(
                "invalid environment variable name {key:?} (must be non-empty, without '=' or NUL)"
            )));
        }
        if value.contains('\0') {
            return Err(Error::invalid(format!(
                "environment variable {key} contains a NUL byte"
            )));
        }
    }
    if let Some(workdir) = &caps.workdir {
        absolute_clean("workdir", workdir)?;
        for reserved in RESERVED_GUEST_PATHS {
            if workdir.starts_with(reserved) {
                return Err(Error::invalid(format!(
                    "workdir {} is inside {reserved}",
                    workdir.display()
                )));
            }
        }
    }
    if let Some(container) = &caps.container {
        if container.image.trim().is_empty() {
            return Err(Error::invalid(
                "container image is empty: name an image (a path or an engine image name)",
            ));
        }
        if container.image.contains('\0') {
            return Err(Error::invalid("container image contains a NUL byte"));
        }
        if let Some(workspace) = &container.workspace {
            absolute_clean("container workspace", workspace)?;
        }
    }
    if let Some(agent) = &caps.agent {
        agent_name(agent)?;
    }
    if let crate::caps::Net::Allow(rules) = &caps.net {
        for rule in rules {
            net_rule(rule)?;
        }
    }
    secrets(caps)?;
    let limits = &caps.limits;
    let positive = [
        ("timeout", limits.timeout.as_nanos() > 0),
        ("cpu_time", limits.cpu_time.as_nanos() > 0),
        ("memory", limits.memory.bytes() >= 1 << 20),
        ("processes", limits.processes > 0),
        ("open_files", limits.open_files >= 8),
        ("disk", limits.disk.bytes() >= 1 << 16),
        ("file_size", limits.file_size.bytes() > 0),
    ];
    for (name, ok) in positive {
        if !ok {
            return Err(Error::invalid(format!(
                "limit {name} is too small (timeout/cpu_time > 0, memory >= 1M, processes >= 1, open_files >= 8, disk >= 64K)"
            )));
        }
    }
    if !(limits.cpus.is_finite() && limits.cpus >= 0.01 && limits.cpus <= 1024.0) {
        return Err(Error::invalid(format!(
            "limit cpus must be between 0.01 and 1024 cores, got {}",
            limits.cpus
        )));
    }
    if matches!(limits.address_space, Some(a) if a.bytes() < 1 << 20) {
        return Err(Error::invalid("limit address_space is below 1M"));
    }
    Ok(())
}

/// Variables Strata sets for every run or for runs with secrets (defaults, the run CA's
/// trust): a secret's placeholder may not take their place.
const SET_BY_STRATA: [&str; 9] = [
    "PATH",
    "HOME",
    "LANG",
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
];

/// Secrets: only under a non-empty allowlist; a variable name of their own; a printable
/// value; hosts in the allowlist's name syntax.
fn secrets(caps: &Caps) -> Result<()> {
    if caps.secrets.is_empty() {
        return Ok(());
    }
    if !matches!(&caps.net, crate::caps::Net::Allow(rules) if !rules.is_empty()) {
        return Err(Error::invalid(
            "secrets need a network allowlist (net allow:HOST,...): they are sent by the egress proxy",
        ));
    }
    let mut names = HashSet::new();
    for secret in &caps.secrets {
        let name = &secret.env;
        let valid_name = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(Error::invalid(format!(
                "secret variable name {name:?} is invalid: use letters, digits and '_', not starting with a digit"
            )));
        }
        if caps.env.contains_key(name)
            || crate::egress::PROXY_VARIABLES.contains(&name.as_str())
            || SET_BY_STRATA.contains(&name.as_str())
        {
            return Err(Error::invalid(format!(
                "secret variable {name} would replace another variable (caps env, a proxy variable, or one Strata sets: PATH, HOME, LANG, the CA trust variables)"
            )));
        }
        if !names.insert(name) {
            return Err(Error::invalid(format!(
                "two secrets use the variable {name}"
            )));
        }
        if secret.value.is_empty() || secret.value.chars().any(|c| c.is_control()) {
            return Err(Error::invalid(format!(
                "secret {name}: the value must be non-empty printable text (no CR, LF, NUL or other control characters: it goes into request headers)"
            )));
        }
        if secret.hosts.is_empty() {
            return Err(Error::invalid(format!(
                "secret {name}: name the hosts it may be sent to"
            )));
        }
        for host in &secret.hosts {
            let rule = NetRule {
                host: host.clone(),
                port: None,
            };
            crate::egress::EgressPolicy::new(std::slice::from_ref(&rule))
                .map_err(|e| Error::invalid(format!("secret {name}: host {host:?}: {e}")))?;
            if host.parse::<std::net::IpAddr>().is_ok() || host.contains('/') {
                return Err(Error::invalid(format!(
                    "secret {name}: host {host:?} is an address; bind secrets to host names (HTTPS certificates name hosts)"
                )));
            }
        }
    }
    Ok(())
}

/// An agent name: 1 to 64 of `a-z 0-9 _ - .`, starting with a letter or digit. Narrow on
/// purpose: it names host state (an id registry entry) and appears in receipts and logs.
pub(crate) fn agent_name(name: &str) -> Result<()> {
    let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.".contains(c);
    let starts_well = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.is_empty() || name.len() > 64 || !starts_well || !name.chars().all(valid_char) {
        return Err(Error::invalid(format!(
            "agent name {name:?} is invalid: use 1 to 64 characters of a-z, 0-9, '_', '-' and '.', starting with a letter or digit"
        )));
    }
    Ok(())
}

pub(crate) fn tool(tool: &Tool) -> Result<()> {
    match tool {
        Tool::Command { argv } => {
            let program = argv
                .first()
                .ok_or_else(|| Error::invalid("command argv is empty: name a program to run"))?;
            if program.is_empty() {
                return Err(Error::invalid("command argv[0] is an empty string"));
            }
            if let Some(arg) = argv.iter().find(|a| a.contains('\0')) {
                return Err(Error::invalid(format!(
                    "command argument {arg:?} contains a NUL byte"
                )));
            }
        }
        Tool::Script { source, .. } => {
            if source.contains('\0') {
                return Err(Error::invalid("script source contains a NUL byte"));
            }
        }
        Tool::Wasm { module, args } => {
            if module.as_os_str().is_empty() {
                return Err(Error::invalid("wasm module path is empty"));
            }
            if args.iter().any(|a| a.contains('\0')) {
                return Err(Error::invalid("wasm argument contains a NUL byte"));
            }
        }
    }
    Ok(())
}

/// The strict rule syntax of [`crate::egress`]: an accepted rule always compiles into an
/// [`crate::egress::EgressPolicy`].
pub(crate) fn net_rule(rule: &NetRule) -> Result<()> {
    crate::egress::validate_rule(rule)
}

fn absolute_clean(what: &str, path: &Path) -> Result<()> {
    let text = path.to_string_lossy();
    if !path.is_absolute() {
        return Err(Error::invalid(format!("{what} {text:?} must be absolute")));
    }
    if text.contains('\0') {
        return Err(Error::invalid(format!(
            "{what} {text:?} contains a NUL byte"
        )));
    }
    if path
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        || text.split('/').any(|part| part == "." || part == "..")
    {
        return Err(Error::invalid(format!(
            "{what} {text:?} contains '.' or '..'; give a normalized path"
        )));
    }
    Ok(())
}

impl Tool {
    /// Checks the tool for mistakes no backend could run (empty argv, NUL bytes).
    pub fn validate(&self) -> Result<()> {
        tool(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::Access;
    use crate::ErrorKind;

    fn assert_invalid(caps: &Caps, needle: &str) {
        let err = caps.validate().expect_err(needle);
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert!(
            err.to_string().contains(needle),
            "{err} should mention {needle}"
        );
    }

    #[test]
    fn rejects_agent_names_that_are_not_plain_identifiers() {
        for bad in [
            "",
            "Alice",
            "a/b",
            "../x",
            ".hidden",
            "a b",
            "a\0b",
            &"x".repeat(65),
        ] {
            assert_invalid(&Caps::new().agent(bad), "agent name");
        }
        for good in ["alice", "agent-7", "build_bot.v2", &"x".repeat(64)] {
            Caps::new().agent(good).validate().expect(good);
        }
    }

    #[test]
    fn rejects_relative_dotdot_and_reserved_paths() {
        assert_invalid(&Caps::new().read_only("data"), "must be absolute");
        assert_invalid(&Caps::new().read_only("/data/../etc"), "'..'");
        assert_invalid(
            &Caps::new().mount("/x", "/proc/1", Access::ReadOnly),
            "/proc",
        );
        assert_invalid(&Caps::new().mount("/x", "/dev", Access::ReadWrite), "/dev");
        let root = Caps::new().mount("/x", "/", Access::ReadOnly);
        root.validate()
            .expect("a root grant is valid caps (the wasm backend takes it)");
        let err =
            no_root_mount(&root, BackendKind::Process).expect_err("not for the process backend");
        assert!(err.to_string().contains("root cannot be a mount"), "{err}");
        assert_invalid(
            &Caps::new()
                .read_only("/a")
                .mount("/b", "/a", Access::ReadOnly),
            "same guest path",
        );
        assert_invalid(&Caps::new().workdir("rel"), "must be absolute");
    }

    #[test]
    fn rejects_bad_env_and_limits() {
        assert_invalid(
            &Caps::new().env("A=B", "x"),
            "invalid environment variable name",
        );
        assert_invalid(
            &Caps::new().env("", "x"),
            "invalid environment variable name",
        );
        assert_invalid(&Caps::new().env("A", "x\0y"), "NUL");
        assert_invalid(&Caps::new().timeout(std::time::Duration::ZERO), "timeout");
        let mut caps = Caps::new();
        caps.limits.processes = 0;
        assert_invalid(&caps, "processes");
    }

    #[test]
    fn accepts_defaults_and_normal_grants() {
        Caps::new()
            .read_only("/usr/share")
            .read_write("/tmp/out")
            .env("A", "1")
            .workdir("/work")
            .validate()
            .expect("valid");
    }

    #[test]
    fn rejects_empty_argv() {
        let err = Tool::Command { argv: vec![] }
            .validate()
            .expect_err("empty");
        assert!(err.to_string().contains("argv is empty"));
    }
}
