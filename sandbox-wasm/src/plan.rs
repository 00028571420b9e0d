//! From caps to a WASI plan: which directories are preopened, with which permissions, which
//! environment and arguments, which sockets, and what cannot be enforced here. Only the
//! mount checks touch the host (a mount must be an existing directory, named without
//! symlinks unless the mount follows them).
//!
//! Host-executed paths ([`sandbox_core::HOST_EXECUTED`]) inside a writable preopen cannot be
//! made read-only here: a preopen's permissions hold for everything beneath it, and
//! wasmtime-wasi resolves paths (including symlinks the module plants) itself, so a
//! path-based filter in front of it could be walked around. A run whose writable preopen
//! holds one is refused when strict (with the ways out: the process backend or layered
//! mode, which bind them read-only; a read-only grant; or the caller's explicit opt-out),
//! and carries a gap in its receipt with best-effort.

use std::path::{Path, PathBuf};

use sandbox_core::grant;
use sandbox_core::{Access, Capability, Caps, EgressPolicy, Error, Net, Result, Strictness};

/// One preopened directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Preopen {
    /// The resolved host path: absolute, without symlinks. Opened with
    /// `RESOLVE_NO_SYMLINKS`, so a swap after planning fails the run.
    pub host: PathBuf,
    pub guest: String,
    pub access: Access,
    /// The caller's host path when the mount followed symlinks to reach `host`.
    pub followed_from: Option<PathBuf>,
}

/// Sockets a run may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NetPlan {
    /// No sockets at all (preview 1 has none; preview 2 TCP, UDP and name lookup are off).
    None,
    /// Preview 2 TCP connections and name lookups checked against this allowlist (see
    /// [`crate::egress`]); no listening, no UDP.
    Allow {
        /// The compiled rules (the host's own addresses are added per run).
        policy: EgressPolicy,
        /// The rules as written, for the receipt.
        rules: Vec<String>,
    },
    /// The host's network, unrestricted.
    Host,
}

/// What a run gets, derived from its caps.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub preopens: Vec<Preopen>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub net: NetPlan,
    /// Bytes of linear memory and tables.
    pub memory: u64,
    /// Guarantees asked for that this backend does not enforce (best-effort only).
    pub gaps: Vec<(Capability, String)>,
}

fn guest_str(path: &Path) -> Result<String> {
    path.to_str().map(str::to_owned).ok_or_else(|| {
        Error::invalid(format!(
            "wasm backend: guest path {} is not valid UTF-8 (WASI paths are strings)",
            path.display()
        ))
    })
}

/// Maps `caps` (already validated by `Caps::validate`) to a plan, refusing in strict mode
/// what cannot be enforced.
pub(crate) fn plan(caps: &Caps, strictness: Strictness) -> Result<Plan> {
    if !caps.secrets.is_empty() {
        return Err(Error::unenforceable(
            "net: secrets at egress",
            "the wasm backend's sockets carry no proxy to substitute secrets; use the process backend",
        ));
    }
    let mut gaps = Vec::new();
    let mut preopens = Vec::with_capacity(caps.mounts.len());
    let mut unprotected = Vec::new();
    for mount in &caps.mounts {
        let grant = grant::resolve(mount, &grant::RealHost)?;
        if !grant.is_dir {
            return Err(Error::invalid(format!(
                "wasm backend: mount {} is not a directory; WASI can only preopen directories (mount its parent directory instead)",
                mount.host.display()
            )));
        }
        if mount.access == Access::ReadWrite && caps.protect_host_executed {
            let found = grant::host_executed(&grant.resolved, &grant::RealHost);
            if let Some(err) = found.refusal(&grant.resolved) {
                return Err(err);
            }
            unprotected.extend(
                found
                    .read_only
                    .iter()
                    .map(|(rel, _)| grant.resolved.join(rel).display().to_string()),
            );
        }
        preopens.push(Preopen {
            host: grant.resolved,
            guest: guest_str(&mount.guest)?,
            access: mount.access,
            followed_from: grant.followed_symlinks.then_some(grant.requested),
        });
    }
    if !unprotected.is_empty() {
        let found = unprotected.join(", ");
        if strictness == Strictness::Strict {
            return Err(Error::unenforceable_strict(
                "fs: host-executed paths read-only",
                format!(
                    "the wasm backend cannot make {found} read-only inside a writable preopen; run it in the process backend or layered (wasm inside the process sandbox), grant the directory read-only, or let the tool write host-executed paths (protect_host_executed: false)"
                ),
            ));
        }
        gaps.push((
            Capability::Fs,
            format!("host-executed paths writable inside writable preopens: {found}"),
        ));
    }
    let cwd = match &caps.workdir {
        None => None,
        Some(dir) => {
            if !caps.mounts.iter().any(|m| dir.starts_with(&m.guest)) {
                return Err(Error::invalid(format!(
                    "wasm backend: workdir {} is not inside a mount (this backend has no private scratch directory)",
                    dir.display()
                )));
            }
            Some(guest_str(dir)?)
        }
    };
    let net = net_plan(&caps.net)?;
    let memory = caps
        .limits
        .address_space
        .map_or(caps.limits.memory.bytes(), |a| {
            a.bytes().min(caps.limits.memory.bytes())
        });
    Ok(Plan {
        preopens,
        env: caps
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cwd,
        net,
        memory,
        gaps,
    })
}

fn net_plan(net: &Net) -> Result<NetPlan> {
    match net {
        Net::None => Ok(NetPlan::None),
        Net::Host => Ok(NetPlan::Host),
        Net::Allow(rules) => Ok(NetPlan::Allow {
            policy: EgressPolicy::new(rules)?,
            rules: rules.iter().map(ToString::to_string).collect(),
        }),
        // Net is non-exhaustive: refuse what this version does not know.
        #[allow(unreachable_patterns)]
        other => Err(Error::unenforceable(
            format!("net: {other}"),
            "unknown network policy for the wasm backend",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::{ByteSize, NetRule};

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().expect("tempdir")
    }

    #[test]
    fn mounts_become_preopens_with_their_access() {
        let (a, b) = (tmp(), tmp());
        let caps = Caps::new()
            .mount(a.path(), "/data", Access::ReadOnly)
            .mount(b.path(), "/out", Access::ReadWrite);
        let plan = plan(&caps, Strictness::Strict).expect("plan");
        assert_eq!(plan.preopens.len(), 2);
        assert_eq!(plan.preopens[0].guest, "/data");
        assert_eq!(plan.preopens[0].access, Access::ReadOnly);
        assert_eq!(plan.preopens[1].access, Access::ReadWrite);
        assert!(plan.env.is_empty());
        assert_eq!(plan.net, NetPlan::None);
    }

    #[test]
    fn file_mounts_and_missing_sources_are_invalid() {
        let dir = tmp();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        for host in [file, dir.path().join("missing")] {
            let caps = Caps::new().read_only(host);
            let err = plan(&caps, Strictness::Strict).expect_err("refused");
            assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest, "{err}");
        }
    }

    #[test]
    fn symlinked_mount_sources_are_refused_unless_followed() {
        let (real, links) = (tmp(), tmp());
        let link = links.path().join("src");
        std::os::unix::fs::symlink(real.path(), &link).expect("symlink");
        let caps = Caps::new().mount(&link, "/data", Access::ReadOnly);
        let err = plan(&caps, Strictness::Strict).expect_err("symlink");
        assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest);
        assert!(err.to_string().contains("is a symlink"), "{err}");
        let mount = sandbox_core::Mount::new(link.clone(), "/data".into(), Access::ReadOnly)
            .follow_symlinks();
        let plan = plan(&Caps::new().with_mount(mount), Strictness::Strict).expect("follow");
        let real = std::fs::canonicalize(real.path()).expect("canonical");
        assert_eq!(plan.preopens[0].host, real);
        assert_eq!(
            plan.preopens[0].followed_from.as_deref(),
            Some(link.as_path())
        );
    }

    #[test]
    fn host_executed_paths_in_writable_preopens_are_unenforceable_here() {
        let ws = tmp();
        std::fs::create_dir_all(ws.path().join(".git/hooks")).expect("hooks");
        let caps = Caps::new().mount(ws.path(), "/ws", Access::ReadWrite);
        let err = plan(&caps, Strictness::Strict).expect_err("strict");
        assert_eq!(err.kind(), sandbox_core::ErrorKind::Unenforceable);
        assert!(err.to_string().contains(".git/hooks"), "{err}");
        let p = plan(&caps, Strictness::BestEffort).expect("best effort");
        assert!(p.gaps.iter().any(|(_, why)| why.contains(".git/hooks")));
        plan(
            &caps.clone().allow_host_executed_writes(),
            Strictness::Strict,
        )
        .expect("opt-out");
        let ro = Caps::new().mount(ws.path(), "/ws", Access::ReadOnly);
        plan(&ro, Strictness::Strict).expect("read-only grants need nothing");
    }

    #[test]
    fn workdir_outside_mounts_is_refused() {
        let dir = tmp();
        let caps = Caps::new()
            .mount(dir.path(), "/w", Access::ReadWrite)
            .workdir("/elsewhere");
        assert!(plan(&caps, Strictness::Strict).is_err());
        let caps = caps.workdir("/w/sub");
        assert_eq!(
            plan(&caps, Strictness::Strict)
                .expect("plan")
                .cwd
                .as_deref(),
            Some("/w/sub")
        );
    }

    #[test]
    fn allowlists_compile_every_rule_kind_into_the_shared_policy() {
        let rules: Vec<NetRule> = [
            "example.com:443",
            "*.example.org",
            "10.1.2.3",
            "192.0.2.0/24:8080",
        ]
        .iter()
        .map(|r| r.parse().expect("rule"))
        .collect();
        let caps = Caps::new().net(Net::Allow(rules.clone()));
        let p = plan(&caps, Strictness::Strict).expect("strict: names are enforceable now");
        assert!(p.gaps.is_empty(), "{:?}", p.gaps);
        let NetPlan::Allow {
            policy,
            rules: written,
        } = &p.net
        else {
            panic!("not an allowlist: {:?}", p.net)
        };
        assert_eq!(policy, &EgressPolicy::new(&rules).expect("policy"));
        assert_eq!(written[0], "example.com:443");
        assert!(policy.check_name("example.com", 443).is_allowed());
        assert!(!policy.check_name("example.com", 22).is_allowed());
        let ip: std::net::IpAddr = "10.1.2.3".parse().expect("ip");
        assert!(policy.check_addr("10.1.2.3", ip, 443).is_allowed());
    }

    #[test]
    fn empty_allowlist_denies_everything() {
        let p = plan(&Caps::new().net(Net::Allow(vec![])), Strictness::Strict).expect("plan");
        let NetPlan::Allow { policy, .. } = &p.net else {
            panic!("not an allowlist")
        };
        assert!(policy.is_empty());
        let ip: std::net::IpAddr = "127.0.0.1".parse().expect("ip");
        assert!(!policy.check_addr("127.0.0.1", ip, 80).is_allowed());
        assert!(!policy.check_lookup("localhost").is_allowed());
    }

    #[test]
    fn address_space_tightens_the_memory_budget() {
        let mut caps = Caps::new().memory(ByteSize::mib(256));
        caps.limits.address_space = Some(ByteSize::mib(64));
        assert_eq!(
            plan(&caps, Strictness::Strict).expect("plan").memory,
            64 << 20
        );
    }
}
