//! Turns `Tool` + `Caps` into the helper's [`Spec`] (host side, before anything runs).
//!
//! Everything that depends on the host goes through [`HostView`], so planning is unit-tested
//! with a fake host and no root.

use std::io;
use std::path::{Path, PathBuf};

use sandbox_core::grant::HostLookup;
use sandbox_core::{Error, Result, RunSpec, ScriptLanguage, Tool};

use crate::protocol::{Command, FileSpec, LinkSpec, MountRole, MountSpec, Spec};

/// The host file-system facts planning needs: [`HostLookup`] for the caller's grants
/// (resolved without following symlinks), and these for the system directories.
pub trait HostView: HostLookup {
    /// Whether the (canonical) path is a directory.
    fn is_dir(&self, path: &Path) -> io::Result<bool>;
    /// The target of `path` when it is a symlink.
    fn symlink_target(&self, path: &Path) -> Option<PathBuf>;
}

pub use sandbox_core::grant::RealHost;

impl HostView for RealHost {
    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        std::fs::metadata(path).map(|m| m.is_dir())
    }
    fn symlink_target(&self, path: &Path) -> Option<PathBuf> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        if meta.file_type().is_symlink() {
            std::fs::read_link(path).ok()
        } else {
            None
        }
    }
}

/// Host facts that shape the spec.
#[derive(Clone, Debug)]
pub struct Facts {
    /// Caller's uid (mapped 1:1 into the sandbox).
    pub uid: u32,
    /// Caller's gid.
    pub gid: u32,
    /// A cgroup will cap memory and processes (otherwise `RLIMIT_AS` and `RLIMIT_NPROC`
    /// stand in, per process and per uid).
    pub cgroup_limits: bool,
    /// The tool runs under a host identity of its own, and the embedder's ids appear
    /// inside at `EMBEDDER_INSIDE_ID` (65533).
    pub mapped_identity: bool,
}

/// The interpreter argv for a script in the process backend.
pub fn script_argv(language: ScriptLanguage, source: &str) -> Vec<String> {
    let (program, flag) = match language {
        ScriptLanguage::Python => ("python3", "-c"),
        ScriptLanguage::Javascript => ("node", "-e"),
        ScriptLanguage::Sh => ("/bin/sh", "-c"),
        _ => ("/bin/sh", "-c"),
    };
    vec![program.to_string(), flag.to_string(), source.to_string()]
}

/// Default `PATH` inside the sandbox.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/// The host's trusted root certificates, granted read-only to runs under an allowlist.
const TRUST_STORE: [&str; 1] = ["/etc/ssl/certs"];

/// Builds the sandbox's shape and the command to run in it: the run's [`RunSpec`] (built
/// once from the caps by [`RunSpec::new`]), wrapped with what the process sandbox adds
/// (system directories, passwd and group files, the tool's inside ids). Refuses (with
/// `InvalidRequest`) a `Tool::Wasm` (another backend's job) or a bad tool. Under a
/// non-empty allowlist the host's trusted roots ([`TRUST_STORE`]) are granted too.
pub fn plan(
    tool: &Tool,
    run: RunSpec,
    facts: &Facts,
    host: &dyn HostView,
) -> Result<(Spec, Command)> {
    let argv =
        match tool {
            Tool::Command { argv } => argv.clone(),
            Tool::Script { language, source } => script_argv(*language, source),
            Tool::Wasm { .. } => return Err(Error::invalid(
                "the process backend runs commands and scripts; run Tool::Wasm on the wasm backend",
            )),
            _ => {
                return Err(Error::invalid(
                    "this tool kind is not supported by the process backend",
                ))
            }
        };
    tool.validate()?;
    match &run.net {
        sandbox_core::Net::None | sandbox_core::Net::Host => {}
        // An empty allowlist is no network at all; a non-empty one is served by the
        // egress proxy (see `egress_link`).
        sandbox_core::Net::Allow(_) => {}
        _ => return Err(Error::unenforceable("net", "unknown network policy")),
    }
    let program = argv[0].clone();

    let mut env: Vec<String> = run.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for (key, value) in [
        ("PATH", DEFAULT_PATH),
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
    ] {
        if !run.env.contains_key(key) {
            env.push(format!("{key}={value}"));
        }
    }

    let mut links = Vec::new();
    let mut system_mounts: Vec<MountSpec> = Vec::new();
    let user_targets: Vec<&Path> = run.mounts.iter().map(|m| m.target.as_path()).collect();
    // Under an allowlist the tool may speak HTTPS: the host's trusted roots (public
    // certificates) come along with the system directories.
    let egress = matches!(&run.net, sandbox_core::Net::Allow(rules) if !rules.is_empty());
    let trust: &[&str] = match (egress, run.system) {
        (true, sandbox_core::SystemDirs::Runtime) => &TRUST_STORE,
        _ => &[],
    };
    for system in run.system.paths().iter().chain(trust) {
        let path = Path::new(system);
        if user_targets.contains(&path) {
            continue;
        }
        if let Some(target) = host.symlink_target(path) {
            links.push(LinkSpec {
                path: path.to_path_buf(),
                target,
            });
            continue;
        }
        let Ok(source) = host.canonicalize(path) else {
            continue; // not on this host (e.g. /lib32)
        };
        let is_dir = host.is_dir(&source).unwrap_or(false);
        system_mounts.push(MountSpec {
            source,
            target: path.to_path_buf(),
            writable: false,
            is_dir,
            exec: true,
            role: MountRole::System,
            followed_from: None,
        });
    }

    let workdir = run.workdir.as_path();
    let mounted = |path: &Path| {
        system_mounts
            .iter()
            .chain(&run.mounts)
            .any(|m| path.starts_with(&m.target))
    };
    let workdir_is_scratch = !workdir.starts_with("/tmp") && !mounted(workdir);
    let etc_mounted = mounted(Path::new("/etc/passwd")) || mounted(Path::new("/etc/group"));
    let mut files = Vec::new();
    if !etc_mounted {
        let name = if facts.uid == 0 { "root" } else { "sandbox" };
        let group = if facts.gid == 0 { "root" } else { "sandbox" };
        let (host_user, host_group) = if facts.mapped_identity {
            let id = crate::identity::EMBEDDER_INSIDE_ID;
            (
                format!("host:x:{id}:{id}:files of the embedder:/nonexistent:/usr/sbin/nologin\n"),
                format!("host:x:{id}:\n"),
            )
        } else {
            (String::new(), String::new())
        };
        files.push(FileSpec {
            path: "/etc/passwd".into(),
            contents: format!(
                "{name}:x:{uid}:{gid}:{name}:/tmp:/bin/sh\n{host_user}nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
                uid = facts.uid,
                gid = facts.gid
            ),
        });
        files.push(FileSpec {
            path: "/etc/group".into(),
            contents: format!(
                "{group}:x:{gid}:\n{host_group}nogroup:x:65534:\n",
                gid = facts.gid
            ),
        });
    }

    let command = Command { program, argv, env };
    let spec = Spec {
        run,
        system_mounts,
        workdir_is_scratch,
        links,
        files,
        uid: facts.uid,
        gid: facts.gid,
        host_ids: None,
        fresh_ids: false,
        cgroup_limits: facts.cgroup_limits,
        landlock: true,
        require_landlock: true,
        cgroup_procs: Vec::new(),
        fault: None,
        image: None,
        live: false,
    };
    Ok((spec, command))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::protocol::{NetMode, Rlimit};
    use sandbox_core::grant::EntryKind;
    use sandbox_core::{Access, Caps};

    /// A fake host: merged /usr with /bin, /lib, /lib64 and /sbin as symlinks.
    struct FakeHost {
        links: HashMap<&'static str, &'static str>,
        dirs: Vec<&'static str>,
        files: Vec<&'static str>,
    }

    impl FakeHost {
        fn debian() -> Self {
            FakeHost {
                links: HashMap::from([
                    ("/bin", "usr/bin"),
                    ("/lib", "usr/lib"),
                    ("/lib64", "usr/lib64"),
                    ("/sbin", "usr/sbin"),
                ]),
                dirs: vec!["/usr", "/etc/alternatives", "/data", "/out"],
                files: vec!["/etc/ld.so.cache", "/etc/hostname"],
            }
        }
    }

    impl HostLookup for FakeHost {
        fn entry(&self, path: &Path) -> io::Result<EntryKind> {
            let p = path.to_str().unwrap_or_default();
            if self.links.contains_key(p) {
                Ok(EntryKind::Symlink)
            } else if self.dirs.contains(&p)
                || self.dirs.iter().any(|d| Path::new(d).starts_with(path))
                || self
                    .files
                    .iter()
                    .any(|f| Path::new(f).parent() == Some(path))
            {
                Ok(EntryKind::Dir)
            } else if self.files.contains(&p) {
                Ok(EntryKind::File)
            } else {
                Err(io::Error::from_raw_os_error(libc::ENOENT))
            }
        }
        fn link_target(&self, path: &Path) -> io::Result<PathBuf> {
            self.symlink_target(path)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
        }
        fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
            let p = path.to_str().unwrap_or_default();
            if let Some(target) = self.links.get(p).filter(|t| t.starts_with('/')) {
                Ok(PathBuf::from(target))
            } else if self.dirs.contains(&p) || self.files.contains(&p) {
                Ok(path.to_path_buf())
            } else {
                Err(io::Error::from_raw_os_error(libc::ENOENT))
            }
        }
    }

    impl HostView for FakeHost {
        fn is_dir(&self, path: &Path) -> io::Result<bool> {
            Ok(self.dirs.contains(&path.to_str().unwrap_or_default()))
        }
        fn symlink_target(&self, path: &Path) -> Option<PathBuf> {
            self.links.get(path.to_str()?).map(PathBuf::from)
        }
    }

    /// The run path: the caps become a run spec, then the process sandbox's plan.
    fn plan(
        tool: &Tool,
        caps: &sandbox_core::Caps,
        facts: &Facts,
        host: &FakeHost,
    ) -> Result<(Spec, Command)> {
        super::plan(tool, RunSpec::new(caps, host)?, facts, host)
    }

    fn facts() -> Facts {
        Facts {
            uid: 1000,
            gid: 1000,
            cgroup_limits: true,
            mapped_identity: false,
        }
    }

    #[test]
    fn system_dirs_become_read_only_mounts_and_links() {
        let (spec, _command) = plan(
            &Tool::command(["true"]),
            &Caps::new(),
            &facts(),
            &FakeHost::debian(),
        )
        .expect("plan");
        let targets: Vec<_> = spec
            .mounts()
            .into_iter()
            .map(|m| m.target.to_str().unwrap_or_default())
            .collect();
        assert_eq!(targets, ["/usr", "/etc/ld.so.cache", "/etc/alternatives"]);
        assert!(spec.mounts().into_iter().all(|m| !m.writable));
        let links: Vec<_> = spec
            .links
            .iter()
            .map(|l| l.path.to_str().unwrap_or_default())
            .collect();
        assert_eq!(links, ["/bin", "/sbin", "/lib", "/lib64"]);
        assert!(!spec
            .mounts()
            .into_iter()
            .any(|m| m.target == Path::new("/etc/hostname")));
    }

    fn roles(spec: &Spec) -> Vec<(String, MountRole, bool)> {
        spec.mounts()
            .into_iter()
            .filter(|m| m.role != MountRole::System)
            .map(|m| (m.target.display().to_string(), m.role, m.writable))
            .collect()
    }

    #[test]
    fn a_grant_through_a_planted_symlink_is_refused_unless_followed() {
        let mut host = FakeHost::debian();
        host.links.insert("/ws/src", "/secret");
        host.dirs.extend(["/ws", "/secret"]);
        let caps = Caps::new().read_only("/ws/src");
        let err = plan(&Tool::command(["true"]), &caps, &facts(), &host).expect_err("symlink");
        assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest);
        assert!(err.to_string().contains("/ws/src is a symlink"), "{err}");
        let followed = sandbox_core::Mount::new("/ws/src".into(), "/src".into(), Access::ReadOnly)
            .follow_symlinks();
        let caps = Caps::new().with_mount(followed);
        let (spec, _command) =
            plan(&Tool::command(["true"]), &caps, &facts(), &host).expect("followed");
        let grant = spec
            .mounts()
            .into_iter()
            .find(|m| m.role == MountRole::Grant)
            .expect("grant");
        assert_eq!(grant.source, Path::new("/secret"));
        assert_eq!(grant.followed_from.as_deref(), Some(Path::new("/ws/src")));
    }

    #[test]
    fn host_executed_paths_of_a_writable_grant_are_bound_read_only_after_their_pins() {
        let mut host = FakeHost::debian();
        host.dirs.extend(["/ws", "/ws/.git/hooks", "/ws/src"]);
        host.files
            .extend(["/ws/.git/config", "/ws/.envrc", "/ws/src/main.rs"]);
        let tool = Tool::command(["true"]);
        let (spec, _command) =
            plan(&tool, &Caps::new().read_write("/ws"), &facts(), &host).expect("plan");
        let expected = [
            ("/ws", MountRole::Grant, true),
            ("/ws/.git", MountRole::Pin, true),
            ("/ws/.envrc", MountRole::HostExecuted, false),
            ("/ws/.git/config", MountRole::HostExecuted, false),
            ("/ws/.git/hooks", MountRole::HostExecuted, false),
        ];
        let expected: Vec<_> = expected
            .iter()
            .map(|(t, r, w)| (t.to_string(), *r, *w))
            .collect();
        assert_eq!(roles(&spec), expected);
        let hooks = spec
            .mounts()
            .into_iter()
            .find(|m| m.target == Path::new("/ws/.git/hooks"))
            .expect("hooks");
        assert_eq!(hooks.source, Path::new("/ws/.git/hooks"));
        assert!(hooks.is_dir);

        // Read-only grants need nothing more; the opt-out drops the binds.
        let (spec, _command) =
            plan(&tool, &Caps::new().read_only("/ws"), &facts(), &host).expect("plan");
        assert_eq!(roles(&spec).len(), 1);
        let caps = Caps::new().read_write("/ws").allow_host_executed_writes();
        let (spec, _command) = plan(&tool, &caps, &facts(), &host).expect("plan");
        assert_eq!(roles(&spec).len(), 1);

        // A deeper grant of the caller's own covers what lies beneath it.
        let caps = Caps::new().read_write("/ws").read_write("/ws/.git/hooks");
        let (spec, _command) = plan(&tool, &caps, &facts(), &host).expect("plan");
        let hooks: Vec<_> = roles(&spec)
            .into_iter()
            .filter(|(t, _, _)| t == "/ws/.git/hooks")
            .collect();
        assert_eq!(
            hooks,
            [("/ws/.git/hooks".to_string(), MountRole::Grant, true)]
        );
        assert!(
            roles(&spec).contains(&("/ws/.git".to_string(), MountRole::Pin, true)),
            ".git stays pinned so it cannot be renamed aside"
        );
    }

    #[test]
    fn a_symlinked_host_executed_path_refuses_the_run_unless_opted_out() {
        let mut host = FakeHost::debian();
        host.dirs.extend(["/home/u", "/home/u/dotfiles"]);
        host.files.push("/home/u/dotfiles/bashrc");
        host.links.insert("/home/u/.bashrc", "dotfiles/bashrc");
        let tool = Tool::command(["true"]);
        let caps = Caps::new().read_write("/home/u");
        let err = plan(&tool, &caps, &facts(), &host).expect_err("symlink");
        assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest);
        assert!(
            err.to_string().contains("/home/u/.bashrc is a symlink"),
            "{err}"
        );
        let caps = caps.allow_host_executed_writes();
        plan(&tool, &caps, &facts(), &host).expect("opted out");
    }

    #[test]
    fn host_env_is_not_inherited_and_defaults_fill_gaps() {
        std::env::set_var("STRATA_PLAN_TEST_SECRET", "leak");
        let caps = Caps::new().env("HOME", "/work");
        let (spec, command) = plan(
            &Tool::command(["env"]),
            &caps,
            &facts(),
            &FakeHost::debian(),
        )
        .expect("plan");
        assert!(command.env.contains(&"HOME=/work".to_string()));
        assert!(command.env.iter().any(|e| e.starts_with("PATH=")));
        assert!(!command
            .env
            .iter()
            .any(|e| e.contains("STRATA_PLAN_TEST_SECRET")));
        assert_eq!(spec.uid, 1000);
    }

    #[test]
    fn missing_mount_source_is_an_invalid_request() {
        let caps = Caps::new().read_only("/nope");
        let err = plan(
            &Tool::command(["true"]),
            &caps,
            &facts(),
            &FakeHost::debian(),
        )
        .expect_err("missing");
        assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest);
        assert!(err.to_string().contains("/nope"), "{err}");
    }

    #[test]
    fn workdir_outside_mounts_is_private_scratch() {
        let caps = Caps::new().read_write("/out").workdir("/work");
        let (spec, _command) = plan(
            &Tool::command(["true"]),
            &caps,
            &facts(),
            &FakeHost::debian(),
        )
        .expect("plan");
        assert!(spec.workdir_is_scratch);
        let caps = Caps::new().read_write("/out").workdir("/out");
        let (spec, _command) = plan(
            &Tool::command(["true"]),
            &caps,
            &facts(),
            &FakeHost::debian(),
        )
        .expect("plan");
        assert!(!spec.workdir_is_scratch);
    }

    #[test]
    fn without_cgroups_rlimits_cap_memory_and_processes() {
        let no_cgroup = Facts {
            cgroup_limits: false,
            ..facts()
        };
        let (spec, _command) = plan(
            &Tool::command(["true"]),
            &Caps::new(),
            &no_cgroup,
            &FakeHost::debian(),
        )
        .expect("plan");
        let has = |r: Rlimit| spec.rlimits().iter().any(|l| l.resource == r);
        assert!(has(Rlimit::As) && has(Rlimit::Nproc));
        let (spec, _command) = plan(
            &Tool::command(["true"]),
            &Caps::new(),
            &facts(),
            &FakeHost::debian(),
        )
        .expect("plan");
        let has = |r: Rlimit| spec.rlimits().iter().any(|l| l.resource == r);
        assert!(!has(Rlimit::As) && !has(Rlimit::Nproc));
        assert!(has(Rlimit::Cpu) && has(Rlimit::Fsize) && has(Rlimit::Nofile));
    }

    #[test]
    fn wasm_tools_are_refused() {
        let err = plan(
            &Tool::wasm("/x.wasm", Vec::<String>::new()),
            &Caps::new(),
            &facts(),
            &FakeHost::debian(),
        )
        .expect_err("wasm");
        assert!(err.to_string().contains("wasm backend"));
    }

    #[test]
    fn allowlists_get_the_egress_namespace_and_empty_ones_none_at_all() {
        for (net, mode) in [
            ("allow:example.com:443", NetMode::Egress),
            ("allow:", NetMode::Isolated),
            ("none", NetMode::Isolated),
            ("host", NetMode::Host),
        ] {
            let caps = Caps::new().net(net.parse().expect("net"));
            let (spec, _) = plan(
                &Tool::command(["true"]),
                &caps,
                &facts(),
                &FakeHost::debian(),
            )
            .expect(net);
            assert_eq!(spec.net(), mode, "{net}");
        }
    }
}
