//! Turns `Tool` + `Caps` into the helper's [`Spec`] (host side, before anything runs).
//!
//! Everything that depends on the host goes through [`HostView`], so planning is unit-tested
//! with a fake host and no root.

use std::io;
use std::path::{Path, PathBuf};

use sandbox_core::{Access, Caps, Error, Result, ScriptLanguage, Tool};

use crate::protocol::{Command, FileSpec, LinkSpec, MountSpec, NetMode, Rlimit, RlimitSpec, Spec};

/// The host file-system facts planning needs.
pub trait HostView {
    /// `realpath(path)`.
    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf>;
    /// Whether the (canonical) path is a directory.
    fn is_dir(&self, path: &Path) -> io::Result<bool>;
    /// The target of `path` when it is a symlink.
    fn symlink_target(&self, path: &Path) -> Option<PathBuf>;
}

/// The real host.
pub struct RealHost;

impl HostView for RealHost {
    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
        std::fs::canonicalize(path)
    }
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
    /// A memory cgroup will cap memory (otherwise `RLIMIT_AS` does).
    pub memory_cgroup: bool,
    /// A pids cgroup will cap processes (otherwise `RLIMIT_NPROC` does).
    pub pids_cgroup: bool,
    /// The tool runs under a host identity of its own, and the embedder's ids appear
    /// inside at [`crate::identity::EMBEDDER_INSIDE_ID`].
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

/// Builds the sandbox's shape and the command to run in it. Refuses (with
/// `InvalidRequest`) anything no sandbox could honour: missing mount sources, a
/// `Tool::Wasm` (another backend's job), bad caps.
pub fn plan(
    tool: &Tool,
    caps: &Caps,
    facts: &Facts,
    host: &dyn HostView,
) -> Result<(Spec, Command)> {
    tool.validate()?;
    caps.validate()?;
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
    let program = argv[0].clone();

    let mut env: Vec<String> = caps.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for (key, value) in [
        ("PATH", DEFAULT_PATH),
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
    ] {
        if !caps.env.contains_key(key) {
            env.push(format!("{key}={value}"));
        }
    }

    let mut links = Vec::new();
    let mut mounts: Vec<MountSpec> = Vec::new();
    let user_targets: Vec<&Path> = caps.mounts.iter().map(|m| m.guest.as_path()).collect();
    for system in caps.system.paths() {
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
        mounts.push(MountSpec {
            source,
            target: path.to_path_buf(),
            writable: false,
            is_dir,
            exec: true,
        });
    }
    for mount in &caps.mounts {
        let source = host.canonicalize(&mount.host).map_err(|e| {
            Error::invalid(format!(
                "mount source {} is not accessible: {e}",
                mount.host.display()
            ))
        })?;
        let is_dir = host.is_dir(&source).map_err(|e| {
            Error::invalid(format!(
                "mount source {} is not accessible: {e}",
                mount.host.display()
            ))
        })?;
        mounts.push(MountSpec {
            source,
            target: mount.guest.clone(),
            writable: mount.access == Access::ReadWrite,
            is_dir,
            exec: true,
        });
    }
    mounts.sort_by_key(|m| m.target.components().count());

    let workdir = caps.effective_workdir().to_path_buf();
    let in_mount = mounts.iter().any(|m| workdir.starts_with(&m.target));
    let workdir_is_scratch = !workdir.starts_with("/tmp") && !in_mount;

    let etc_mounted = mounts.iter().any(|m| {
        Path::new("/etc/passwd").starts_with(&m.target)
            || Path::new("/etc/group").starts_with(&m.target)
    });
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

    let limits = &caps.limits;
    let cpu_secs = limits.cpu_time.as_secs_f64().ceil().max(1.0) as u64;
    let mut rlimits = vec![
        RlimitSpec {
            resource: Rlimit::Cpu,
            soft: cpu_secs,
            hard: cpu_secs + 1,
        },
        RlimitSpec {
            resource: Rlimit::Fsize,
            soft: limits.file_size.bytes(),
            hard: limits.file_size.bytes(),
        },
        RlimitSpec {
            resource: Rlimit::Nofile,
            soft: u64::from(limits.open_files),
            hard: u64::from(limits.open_files),
        },
        RlimitSpec {
            resource: Rlimit::Core,
            soft: 0,
            hard: 0,
        },
    ];
    let address_space = limits
        .address_space
        .map(|a| a.bytes())
        .or((!facts.memory_cgroup).then_some(limits.memory.bytes()));
    if let Some(bytes) = address_space {
        rlimits.push(RlimitSpec {
            resource: Rlimit::As,
            soft: bytes,
            hard: bytes,
        });
    }
    if !facts.pids_cgroup {
        rlimits.push(RlimitSpec {
            resource: Rlimit::Nproc,
            soft: u64::from(limits.processes),
            hard: u64::from(limits.processes),
        });
    }

    let net =
        match caps.net {
            sandbox_core::Net::None => NetMode::Isolated,
            sandbox_core::Net::Host => NetMode::Host,
            sandbox_core::Net::Allow(ref rules) if rules.is_empty() => NetMode::Isolated,
            sandbox_core::Net::Allow(_) => return Err(Error::unenforceable(
                "net: allowlist",
                "the process backend has no egress proxy yet; use net none, or host (unrestricted)",
            )),
            _ => return Err(Error::unenforceable("net", "unknown network policy")),
        };

    let command = Command {
        program,
        argv,
        env,
        timeout_ms: u64::try_from(limits.timeout.as_millis()).unwrap_or(u64::MAX),
    };
    let spec = Spec {
        workdir,
        workdir_is_scratch,
        links,
        mounts,
        files,
        scratch_bytes: limits.disk.bytes(),
        scratch_inodes: (limits.disk.bytes() / 8192).clamp(256, 1 << 20),
        net,
        uid: facts.uid,
        gid: facts.gid,
        host_ids: None,
        rlimits,
        landlock: true,
        require_landlock: true,
        cgroup_procs: Vec::new(),
        fault: None,
        image: None,
    };
    Ok((spec, command))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

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

    impl HostView for FakeHost {
        fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
            let p = path.to_str().unwrap_or_default();
            if self.dirs.contains(&p) || self.files.contains(&p) {
                Ok(path.to_path_buf())
            } else {
                Err(io::Error::from_raw_os_error(libc::ENOENT))
            }
        }
        fn is_dir(&self, path: &Path) -> io::Result<bool> {
            Ok(self.dirs.contains(&path.to_str().unwrap_or_default()))
        }
        fn symlink_target(&self, path: &Path) -> Option<PathBuf> {
            self.links.get(path.to_str()?).map(PathBuf::from)
        }
    }

    fn facts() -> Facts {
        Facts {
            uid: 1000,
            gid: 1000,
            memory_cgroup: true,
            pids_cgroup: true,
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
            .mounts
            .iter()
            .map(|m| m.target.to_str().unwrap_or_default())
            .collect();
        assert_eq!(targets, ["/usr", "/etc/ld.so.cache", "/etc/alternatives"]);
        assert!(spec.mounts.iter().all(|m| !m.writable));
        let links: Vec<_> = spec
            .links
            .iter()
            .map(|l| l.path.to_str().unwrap_or_default())
            .collect();
        assert_eq!(links, ["/bin", "/sbin", "/lib", "/lib64"]);
        assert!(!spec
            .mounts
            .iter()
            .any(|m| m.target == Path::new("/etc/hostname")));
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
            memory_cgroup: false,
            pids_cgroup: false,
            ..facts()
        };
        let (spec, _command) = plan(
            &Tool::command(["true"]),
            &Caps::new(),
            &no_cgroup,
            &FakeHost::debian(),
        )
        .expect("plan");
        let has = |r: Rlimit| spec.rlimits.iter().any(|l| l.resource == r);
        assert!(has(Rlimit::As) && has(Rlimit::Nproc));
        let (spec, _command) = plan(
            &Tool::command(["true"]),
            &Caps::new(),
            &facts(),
            &FakeHost::debian(),
        )
        .expect("plan");
        let has = |r: Rlimit| spec.rlimits.iter().any(|l| l.resource == r);
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
    fn allowlisted_network_fails_closed_until_the_proxy_exists() {
        let caps = Caps::new().net("allow:example.com:443".parse().expect("net"));
        let err = plan(
            &Tool::command(["true"]),
            &caps,
            &facts(),
            &FakeHost::debian(),
        )
        .expect_err("allow");
        assert_eq!(err.kind(), sandbox_core::ErrorKind::Unenforceable);
    }
}
