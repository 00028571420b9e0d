//! Trust tiers: named ceilings on what a run may ask for.
//!
//! The presets follow the seeds' table (files / network / tools):
//!
//! | tier     | files                     | network           | tools                      |
//! |----------|---------------------------|-------------------|----------------------------|
//! | `high`   | any host path, read-write | any, host network | any program                |
//! | `medium` | the home directory only   | an allowlist      | approved programs only     |
//! | `low`    | `/tmp` only, read-only    | none              | read-only: no writable grant |
//!
//! The system directories every program needs ([`sandbox_core::SystemDirs`]) are read-only and
//! allowed in every tier; so is each run's private `/tmp`. Secrets are `high` only. An
//! embedder defines its own tiers by filling in a [`Tier`]. [`Tier::check`] returns what a
//! request asks for beyond its tier; an empty list means the tier allows it.
//!
//! A tier decides on the host path a grant *binds*, not the one it names: `--ro-follow
//! /tmp/x/link` with `link -> /etc` is a read of `/etc`. The check itself touches no file
//! system, so it is given grants already resolved on the host and pinned there
//! ([`sandbox_core::grant::pin`], the resolution every backend applies: each component looked up
//! without following symlinks, and `canonicalize` for a grant that follows them); the
//! `strata` facade pins every run's grants before its tier is checked and runs the pinned
//! grants, so the path checked is the path bound. Given a grant that still follows
//! symlinks (not pinned), a tier that limits paths cannot know where it leads and lists
//! it as a [`Need`]; [`Tier::check_on_host`] resolves and checks in one call.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use sandbox_core::caps::{Access, Caps, Net};
use sandbox_core::error::{Error, Result};
use sandbox_core::grant::{self, HostLookup, Pinned};
use sandbox_core::tool::{ScriptLanguage, Tool};

/// A ceiling on what runs may ask for. `rank` orders tiers for delegation (a higher rank is
/// more trusted): an agent may delegate only to an agent of the same or a lower rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// The name refusals and receipts use.
    pub name: String,
    /// Trust order: `low` = 0, `medium` = 1, `high` = 2.
    pub rank: u8,
    /// Which host paths may be granted.
    pub paths: PathScope,
    /// Whether read-write grants are allowed (within `paths`).
    pub writes: bool,
    /// Which network policies are allowed.
    pub network: NetScope,
    /// Which programs may run.
    pub programs: ProgramScope,
    /// Whether secrets may be injected.
    pub secrets: bool,
}

/// Which host paths a tier may grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathScope {
    /// Any path.
    Any,
    /// Only paths at or below one of these absolute directories (compared component by
    /// component after removing `.` and `..` lexically).
    Within(Vec<PathBuf>),
}

/// Which network policies a tier allows. Ordered: each allows what the ones before it do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetScope {
    /// [`Net::None`] only.
    None,
    /// [`Net::None`] or an allowlist ([`Net::Allow`]) through the egress proxy.
    Allowlist,
    /// Anything, including [`Net::Host`].
    Any,
}

/// Which programs a tier lets run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramScope {
    /// Any program.
    Any,
    /// Only these names (the last component of `argv[0]`; scripts count as their
    /// interpreter `python3`, `node` or `sh`; WebAssembly modules as `wasm`).
    Only(BTreeSet<String>),
}

/// Something a request asks for beyond its tier.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Need {
    /// The capability, named as grants name it: `read:PATH`, `write:PATH`, `net:allow`,
    /// `net:host`, `program:NAME`, `secrets`.
    pub capability: String,
    /// Why the tier does not cover it.
    pub detail: String,
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.capability, self.detail)
    }
}

/// The programs the `medium` preset approves: shells, interpreters, build tools and
/// read-only file utilities.
pub const MEDIUM_PROGRAMS: &[&str] = &[
    "sh", "bash", "dash", "python", "python3", "node", "git", "make", "cargo", "rustc", "npm",
    "pip", "pytest", "cat", "ls", "head", "tail", "wc", "grep", "find", "sort", "uniq", "diff",
    "echo", "true", "false", "env", "pwd", "stat", "wasm",
];

impl Tier {
    /// The names of the built-in presets, lowest first.
    pub const PRESETS: [&'static str; 3] = ["low", "medium", "high"];

    /// `high` (system): any path read-write, any network, any program, secrets.
    pub fn high() -> Tier {
        Tier {
            name: "high".into(),
            rank: 2,
            paths: PathScope::Any,
            writes: true,
            network: NetScope::Any,
            programs: ProgramScope::Any,
            secrets: true,
        }
    }

    /// `medium` (user): paths within `home` (read-write), an allowlist network, the
    /// programs of [`MEDIUM_PROGRAMS`]; no secrets.
    pub fn medium(home: impl Into<PathBuf>) -> Tier {
        Tier {
            name: "medium".into(),
            rank: 1,
            paths: PathScope::Within(vec![home.into()]),
            writes: true,
            network: NetScope::Allowlist,
            programs: ProgramScope::Only(MEDIUM_PROGRAMS.iter().map(|p| p.to_string()).collect()),
            secrets: false,
        }
    }

    /// `low` (untrusted): read-only paths within `/tmp`, no network, any program (it can
    /// write only its private `/tmp`), no secrets.
    pub fn low() -> Tier {
        Tier {
            name: "low".into(),
            rank: 0,
            paths: PathScope::Within(vec![PathBuf::from("/tmp")]),
            writes: false,
            network: NetScope::None,
            programs: ProgramScope::Any,
            secrets: false,
        }
    }

    /// A preset by name; `medium` uses `home` as its directory. `None` for other names.
    pub fn preset(name: &str, home: &Path) -> Option<Tier> {
        match name {
            "high" => Some(Tier::high()),
            "medium" => Some(Tier::medium(home)),
            "low" => Some(Tier::low()),
            _ => None,
        }
    }

    /// The home the `medium` preset grants when the caller names none: `$HOME` when it is
    /// an absolute path, else `/home`.
    pub fn default_home() -> PathBuf {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .unwrap_or_else(|| PathBuf::from("/home"))
    }

    /// The tier `name`: one of `defined` (the embedder's own, which win by name), else a
    /// preset ([`Tier::preset`]) with `home` ([`Tier::default_home`] when `None`). The one
    /// lookup the facade, the CLI and both bindings use.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the tier and every tier known.
    pub fn lookup(name: &str, defined: &[Tier], home: Option<&Path>) -> Result<Tier> {
        if let Some(tier) = defined.iter().find(|t| t.name == name) {
            return Ok(tier.clone());
        }
        let home = home.map_or_else(Tier::default_home, Path::to_path_buf);
        Tier::preset(name, &home).ok_or_else(|| {
            let mut known: Vec<String> = Tier::PRESETS.iter().map(|s| s.to_string()).collect();
            known.extend(
                defined
                    .iter()
                    .map(|t| t.name.clone())
                    .filter(|n| !Tier::PRESETS.contains(&n.as_str())),
            );
            Error::invalid(format!(
                "unknown tier {name:?} (known: {})",
                known.join(", ")
            ))
        })
    }

    /// Adds programs to the approved list (no effect on [`ProgramScope::Any`]).
    pub fn approve_programs<I, S>(mut self, programs: I) -> Tier
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let ProgramScope::Only(list) = &mut self.programs {
            list.extend(programs.into_iter().map(Into::into));
        }
        self
    }

    /// Everything `tool` with `caps` asks for beyond this tier, in a stable order. Empty
    /// when the tier allows the request. Assumes `caps` passed [`Caps::validate`] (host
    /// paths absolute).
    ///
    /// Host paths are decided as written (after removing `.` and `..` lexically): give
    /// caps whose grants were pinned on the host ([`sandbox_core::grant::pin`]), or use
    /// [`Tier::check_on_host`]. A grant that follows symlinks is not pinned, so under a
    /// tier that limits paths it is a need of its own (`read:PATH` or `write:PATH`,
    /// saying so) whatever path it names.
    pub fn check(&self, tool: &Tool, caps: &Caps) -> Vec<Need> {
        let mut needs: BTreeSet<Need> = self.check_caps(caps).into_iter().collect();
        needs.extend(self.check_program(tool));
        needs.into_iter().collect()
    }

    /// The part of [`Tier::check`] about the program `tool` runs: a need when the tier
    /// approves only some programs and this is not one of them (a live sandbox checks each
    /// exec with this; its caps were checked when it started).
    pub fn check_program(&self, tool: &Tool) -> Vec<Need> {
        let ProgramScope::Only(approved) = &self.programs else {
            return Vec::new();
        };
        let program = program_name(tool);
        if approved.contains(&program) {
            return Vec::new();
        }
        vec![Need {
            capability: format!("program:{program}"),
            detail: format!("not an approved program of tier {}", self.name),
        }]
    }

    /// The part of [`Tier::check`] about the caps (grants, network, secrets), whatever
    /// runs under them.
    pub fn check_caps(&self, caps: &Caps) -> Vec<Need> {
        let mut needs = BTreeSet::new();
        for mount in &caps.mounts {
            let host = lexical(&mount.host);
            let writable = mount.access == Access::ReadWrite;
            let verb = if writable { "write" } else { "read" };
            if mount.follow_symlinks && self.paths != PathScope::Any {
                needs.insert(Need {
                    capability: format!("{verb}:{}", host.display()),
                    detail: format!(
                        "the grant follows symlinks and was not resolved, so tier {} cannot tell where it leads (resolve it first: grant::pin)",
                        self.name
                    ),
                });
            } else if !self.paths.covers(&host) {
                needs.insert(Need {
                    capability: format!("{verb}:{}", host.display()),
                    detail: format!("tier {} grants only {}", self.name, self.paths),
                });
            } else if writable && !self.writes {
                needs.insert(Need {
                    capability: format!("write:{}", host.display()),
                    detail: format!("tier {} grants no read-write paths", self.name),
                });
            }
        }
        let net = match caps.net {
            Net::None => None,
            Net::Allow(_) => Some((NetScope::Allowlist, "net:allow")),
            Net::Host => Some((NetScope::Any, "net:host")),
            // A network policy this version does not know needs the widest scope.
            _ => Some((NetScope::Any, "net:host")),
        };
        if let Some((scope, capability)) = net {
            if scope > self.network {
                needs.insert(Need {
                    capability: capability.into(),
                    detail: format!("tier {} allows network: {}", self.name, self.network),
                });
            }
        }
        if !caps.secrets.is_empty() && !self.secrets {
            needs.insert(Need {
                capability: "secrets".into(),
                detail: format!("tier {} injects no secrets", self.name),
            });
        }
        needs.into_iter().collect()
    }
}

impl Tier {
    /// [`Tier::check`] on `caps` with its grants resolved on `host` and pinned first
    /// ([`sandbox_core::grant::pin`]): each need names the path the grant would bind. Returns the
    /// pinned caps too: run those, so the paths checked are the paths bound (a symlink
    /// swapped in later refuses the run instead of redirecting it).
    ///
    /// # Errors
    /// As [`sandbox_core::grant::pin`]: [`sandbox_core::Error::InvalidRequest`] for a grant that does not
    /// exist or holds a symlink it does not follow (no backend would run it either).
    pub fn check_on_host<H: HostLookup + ?Sized>(
        &self,
        tool: &Tool,
        caps: &Caps,
        host: &H,
    ) -> sandbox_core::Result<(Vec<Need>, Pinned)> {
        let pinned = grant::pin(caps, host)?;
        Ok((self.check(tool, &pinned.caps), pinned))
    }
}

impl PathScope {
    /// Whether `path` (absolute, lexically clean) is inside the scope.
    pub fn covers(&self, path: &Path) -> bool {
        match self {
            PathScope::Any => true,
            PathScope::Within(roots) => roots.iter().any(|root| path.starts_with(lexical(root))),
        }
    }
}

impl fmt::Display for PathScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathScope::Any => f.write_str("any path"),
            PathScope::Within(roots) if roots.is_empty() => f.write_str("no host paths"),
            PathScope::Within(roots) => {
                let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
                write!(f, "paths within {}", roots.join(", "))
            }
        }
    }
}

impl fmt::Display for NetScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetScope::None => "none",
            NetScope::Allowlist => "an allowlist",
            NetScope::Any => "any",
        })
    }
}

/// The name a tool's program is approved under (see [`ProgramScope::Only`]).
pub fn program_name(tool: &Tool) -> String {
    match tool {
        Tool::Command { argv } => argv
            .first()
            .map(|p| match p.rsplit_once('/') {
                Some((_, name)) => name.to_string(),
                None => p.clone(),
            })
            .unwrap_or_default(),
        Tool::Script { language, .. } => match language {
            ScriptLanguage::Python => "python3",
            ScriptLanguage::Javascript => "node",
            ScriptLanguage::Sh => "sh",
            // Never on an approved list: a tier with one refuses it.
            _ => "unknown-interpreter",
        }
        .to_string(),
        Tool::Wasm { .. } => "wasm".to_string(),
        _ => "unknown-tool".to_string(),
    }
}

/// `path` with `.` removed and `..` applied lexically (never above `/`).
pub fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if out.parent().is_some() {
                    out.pop();
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::caps::NetRule;

    fn caps() -> Caps {
        Caps::new()
    }

    fn names(needs: &[Need]) -> Vec<&str> {
        needs.iter().map(|n| n.capability.as_str()).collect()
    }

    #[test]
    fn low_tier_refuses_a_home_read_a_write_network_and_secrets() {
        let c = caps()
            .read_only("/home/alice/notes")
            .read_write("/tmp/out")
            .net(Net::Allow(vec!["example.com"
                .parse::<NetRule>()
                .expect("rule")]));
        let needs = Tier::low().check(&Tool::command(["cat"]), &c);
        assert_eq!(
            names(&needs),
            ["net:allow", "read:/home/alice/notes", "write:/tmp/out"]
        );
        assert!(Tier::low()
            .check(&Tool::command(["cat"]), &caps().read_only("/tmp/in"))
            .is_empty());
    }

    #[test]
    fn dot_dot_does_not_leave_the_tier_scope_unnoticed() {
        let needs = Tier::low().check(
            &Tool::command(["cat"]),
            &caps().read_only("/tmp/../etc/shadow"),
        );
        assert_eq!(names(&needs), ["read:/etc/shadow"]);
        let home = Tier::medium("/home/alice");
        let needs = home.check(&Tool::command(["cat"]), &caps().read_only("/home/alice2/x"));
        assert_eq!(names(&needs), ["read:/home/alice2/x"]);
    }

    #[test]
    fn medium_tier_allows_its_home_an_allowlist_and_approved_programs_only() {
        let tier = Tier::medium("/home/alice");
        let c = caps()
            .read_write("/home/alice/ws")
            .net(Net::Allow(vec!["pypi.org"
                .parse::<NetRule>()
                .expect("rule")]));
        assert!(tier
            .check(&Tool::command(["/usr/bin/python3", "x.py"]), &c)
            .is_empty());
        let needs = tier.check(&Tool::command(["curl", "x"]), &c.clone().net(Net::Host));
        assert_eq!(names(&needs), ["net:host", "program:curl"]);
        let tier = tier.approve_programs(["curl"]);
        assert!(tier.check(&Tool::command(["curl"]), &c).is_empty());
    }

    #[test]
    fn high_tier_allows_everything() {
        let c = caps().read_write("/etc").net(Net::Host);
        assert!(Tier::high()
            .check(&Tool::command(["anything"]), &c)
            .is_empty());
    }

    #[test]
    fn scripts_and_modules_count_as_their_interpreter() {
        assert_eq!(
            program_name(&Tool::script(ScriptLanguage::Python, "1")),
            "python3"
        );
        assert_eq!(
            program_name(&Tool::wasm("/m.wasm", Vec::<String>::new())),
            "wasm"
        );
        assert_eq!(program_name(&Tool::command(["/usr/bin/env", "x"])), "env");
    }

    /// A host where `/tmp/x/link -> /etc`, `/tmp/x/ok -> /tmp/real` and `/tmp/x/hop ->
    /// /tmp/x/link` are symlinks; everything else named is a directory.
    struct LinkHost;

    impl LinkHost {
        fn link(path: &Path) -> Option<&'static str> {
            match path.to_str()? {
                "/tmp/x/link" => Some("/etc"),
                "/tmp/x/ok" => Some("/tmp/real"),
                "/tmp/x/hop" => Some("/tmp/x/link"),
                _ => None,
            }
        }
    }

    impl HostLookup for LinkHost {
        fn entry(&self, path: &Path) -> std::io::Result<grant::EntryKind> {
            if LinkHost::link(path).is_some() {
                return Ok(grant::EntryKind::Symlink);
            }
            match path.to_str() {
                Some("/" | "/tmp" | "/tmp/x" | "/tmp/real" | "/etc" | "/etc/ssl") => {
                    Ok(grant::EntryKind::Dir)
                }
                _ => Err(std::io::ErrorKind::NotFound.into()),
            }
        }
        fn link_target(&self, path: &Path) -> std::io::Result<PathBuf> {
            LinkHost::link(path)
                .map(PathBuf::from)
                .ok_or_else(|| std::io::ErrorKind::InvalidInput.into())
        }
        fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf> {
            let mut out = PathBuf::from("/");
            for part in path.components().skip(1) {
                out.push(part);
                while let Some(target) = LinkHost::link(&out) {
                    out = PathBuf::from(target);
                }
                self.entry(&out)?;
            }
            Ok(out)
        }
    }

    fn follow(host: &str, access: Access) -> Caps {
        caps().with_mount(
            sandbox_core::Mount::new(host.into(), "/data".into(), access).follow_symlinks(),
        )
    }

    #[test]
    fn a_followed_symlink_from_tmp_into_etc_is_checked_where_it_leads() {
        let cat = Tool::command(["cat"]);
        // `strata run --tier low --ro-follow /tmp/x/link` with link -> /etc: a read of /etc.
        for path in ["/tmp/x/link", "/tmp/x/hop"] {
            let (needs, pinned) = Tier::low()
                .check_on_host(&cat, &follow(path, Access::ReadOnly), &LinkHost)
                .expect("resolves");
            assert_eq!(names(&needs), ["read:/etc"], "{path}");
            assert_eq!(pinned.caps.mounts[0].host, PathBuf::from("/etc"));
            assert_eq!(pinned.followed[0].requested, PathBuf::from(path));
        }
        // Below the link too.
        let (needs, _) = Tier::low()
            .check_on_host(
                &cat,
                &follow("/tmp/x/link/ssl", Access::ReadOnly),
                &LinkHost,
            )
            .expect("resolves");
        assert_eq!(names(&needs), ["read:/etc/ssl"]);
        // A link that stays inside the tier's paths is allowed, and what runs is pinned:
        // the resolved path, no longer following symlinks.
        let (needs, pinned) = Tier::low()
            .check_on_host(&cat, &follow("/tmp/x/ok", Access::ReadOnly), &LinkHost)
            .expect("resolves");
        assert!(needs.is_empty(), "{needs:?}");
        let mount = &pinned.caps.mounts[0];
        assert_eq!(mount.host, PathBuf::from("/tmp/real"));
        assert_eq!(mount.guest, PathBuf::from("/data"));
        assert!(!mount.follow_symlinks);
        // A higher tier allows the read of /etc; the pinned grant binds /etc itself.
        let (needs, pinned) = Tier::high()
            .check_on_host(&cat, &follow("/tmp/x/link", Access::ReadWrite), &LinkHost)
            .expect("resolves");
        assert!(needs.is_empty());
        assert_eq!(pinned.caps.mounts[0].host, PathBuf::from("/etc"));
    }

    #[test]
    fn a_symlink_in_a_plain_grant_under_a_tier_is_refused_before_the_tier_decides() {
        let err = Tier::low()
            .check_on_host(
                &Tool::command(["cat"]),
                &caps().read_only("/tmp/x/link/ssl"),
                &LinkHost,
            )
            .expect_err("a plain grant does not follow its symlink");
        assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest);
        assert!(
            err.to_string().contains("/tmp/x/link is a symlink"),
            "{err}"
        );
    }

    #[test]
    fn an_unresolved_grant_that_follows_symlinks_is_a_need_under_a_scoped_tier() {
        let cat = Tool::command(["cat"]);
        let needs = Tier::low().check(&cat, &follow("/tmp/x/link", Access::ReadOnly));
        assert_eq!(names(&needs), ["read:/tmp/x/link"]);
        assert!(needs[0].detail.contains("follows symlinks"), "{needs:?}");
        assert!(Tier::high()
            .check(&cat, &follow("/tmp/x/link", Access::ReadOnly))
            .is_empty());
    }

    #[test]
    fn presets_are_found_by_name_and_ranked() {
        let home = Path::new("/root");
        let ranks: Vec<u8> = Tier::PRESETS
            .iter()
            .map(|n| Tier::preset(n, home).map(|t| t.rank).unwrap_or(99))
            .collect();
        assert_eq!(ranks, [0, 1, 2]);
        assert!(Tier::preset("root", home).is_none());
    }
}
