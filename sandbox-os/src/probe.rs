//! One-time host probe for the process backend (`strata doctor`, fail-closed checks).

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use sandbox_core::Check;

use crate::cgroup::{self, Layout};
use crate::sys;

/// What this host offers the process backend.
#[derive(Clone, Debug)]
pub struct HostProbe {
    /// Landlock ABI (0 = unavailable).
    pub landlock_abi: i32,
    /// seccomp filters can be installed.
    pub seccomp: bool,
    /// The helper could create user, mount, pid, net, ipc, uts and cgroup namespaces
    /// (`None`: not probed; the run itself fails closed if they cannot be created).
    pub namespaces: Option<Result<(), String>>,
    /// Where per-run cgroups go, or why there are none.
    pub cgroup: Result<Layout, String>,
    /// Caller's effective uid and gid.
    pub ids: (u32, u32),
}

/// The on-disk form of the cheap probe ([`HostProbe::cached_in`]).
#[derive(Debug, Serialize, Deserialize)]
struct StoredProbe {
    /// What the probe is valid for ([`probe_key`]).
    key: String,
    landlock_abi: i32,
    seccomp: bool,
    cgroup: Result<Layout, String>,
}

/// What a cached probe depends on: this build, the boot, the kernel, the effective ids and
/// the process's cgroups.
fn probe_key() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let (uid, gid) = sys::ids();
    format!(
        "{}|{}|{}|{uid}:{gid}|{}",
        env!("CARGO_PKG_VERSION"),
        read("/proc/sys/kernel/random/boot_id").trim(),
        read("/proc/sys/kernel/osrelease").trim(),
        read("/proc/self/cgroup").trim()
    )
}

/// Writes `value` to `path` atomically (a private temporary file renamed over it).
fn write_private(dir: &Path, path: &Path, value: &StoredProbe) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".host-probe.{}.tmp", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let written = file
        .write_all(&bytes)
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// What `strata-helper probe` prints (one JSON line).
#[derive(Debug, Serialize, Deserialize)]
pub struct HelperProbe {
    /// `unshare` of every namespace Strata uses succeeded in a child.
    pub namespaces_ok: bool,
    /// The error otherwise.
    pub error: Option<String>,
}

impl HostProbe {
    /// The cheap probe (no child process), computed once per process. Runs use it; a
    /// missing namespace feature then fails the run closed in the helper.
    pub fn cached() -> HostProbe {
        static CACHE: OnceLock<HostProbe> = OnceLock::new();
        CACHE
            .get_or_init(|| HostProbe {
                landlock_abi: sys::landlock_abi(),
                seccomp: sys::seccomp_available(),
                namespaces: None,
                cgroup: cgroup::detect(),
                ids: sys::ids(),
            })
            .clone()
    }

    /// Like [`HostProbe::cached`], but kept across processes in `dir/host-probe.json` (for
    /// short-lived embedders such as the CLI). The file is trusted only for the same Strata
    /// version, boot, kernel, effective ids and cgroup membership, and only while every
    /// cgroup base directory it names still exists; otherwise the host is probed again and
    /// the file rewritten. A stale or forged file cannot weaken a run: landlock, seccomp
    /// and the cgroup are enforced and reported by the helper, which fails closed.
    pub fn cached_in(dir: &Path) -> HostProbe {
        let key = probe_key();
        let path = dir.join("host-probe.json");
        let stored = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<StoredProbe>(&bytes).ok())
            .filter(|stored| stored.key == key)
            .filter(|stored| match &stored.cgroup {
                Ok(layout) => layout.bases().iter().all(|base| base.is_dir()),
                Err(_) => true,
            });
        if let Some(stored) = stored {
            // What probing would also have done: sweep the empty run cgroups of embedders
            // that no longer exist (a SIGKILLed CLI cannot remove its own).
            if let Ok(layout) = &stored.cgroup {
                crate::cgroup_cleanup::sweep_stale(&layout.bases());
            }
            return HostProbe {
                landlock_abi: stored.landlock_abi,
                seccomp: stored.seccomp,
                namespaces: None,
                cgroup: stored.cgroup,
                ids: sys::ids(),
            };
        }
        let probe = HostProbe::cached();
        let stored = StoredProbe {
            key,
            landlock_abi: probe.landlock_abi,
            seccomp: probe.seccomp,
            cgroup: probe.cgroup.clone(),
        };
        if let Err(e) = write_private(dir, &path, &stored) {
            tracing::debug!(path = %path.display(), error = %e, "host probe not cached");
        }
        probe
    }

    /// The full probe, using `helper` to test namespace creation in a child process (the
    /// embedding process itself is never forked or unshared). Used by `strata doctor`.
    pub fn run(helper: Option<&Path>) -> Self {
        let namespaces = match helper {
            Some(helper) => probe_namespaces(helper),
            None => Err("strata-helper binary not found".to_string()),
        };
        HostProbe {
            namespaces: Some(namespaces),
            ..HostProbe::cached()
        }
    }

    /// The probe as doctor checks.
    pub fn checks(&self) -> Vec<Check> {
        let mut checks = vec![
            Check::new(
                "landlock",
                self.landlock_abi > 0,
                if self.landlock_abi > 0 {
                    format!("ABI {}", self.landlock_abi)
                } else {
                    "not available (kernel without landlock, or not in the lsm= list)".to_string()
                },
            ),
            Check::new(
                "seccomp",
                self.seccomp,
                if self.seccomp {
                    "filters available"
                } else {
                    "not available"
                },
            ),
            Check::new(
                "namespaces",
                matches!(self.namespaces, Some(Ok(()))),
                match &self.namespaces {
                    Some(Ok(())) => "user, mount, pid, net, ipc, uts, cgroup".to_string(),
                    Some(Err(e)) => e.clone(),
                    None => "not probed".to_string(),
                },
            ),
        ];
        checks.push(match &self.cgroup {
            Ok(layout) => Check::new("cgroup", true, format!("{} (memory, pids)", layout.name())),
            Err(e) => Check::new(
                "cgroup",
                false,
                format!("{e}; memory and processes fall back to rlimits"),
            ),
        });
        checks
    }
}

fn probe_namespaces(helper: &Path) -> Result<(), String> {
    let output = Command::new(helper)
        .arg("probe")
        .env_clear()
        .output()
        .map_err(|e| format!("cannot run {}: {e}", helper.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let probe: HelperProbe = serde_json::from_str(text.trim())
        .map_err(|e| format!("helper probe printed {text:?}: {e}"))?;
    if probe.namespaces_ok {
        Ok(())
    } else {
        Err(probe
            .error
            .unwrap_or_else(|| "namespace creation failed".into()))
    }
}

/// `strata-helper probe`: tries to create the namespaces in a forked child and prints the
/// result as JSON. Returns the exit code.
pub fn helper_probe() -> i32 {
    let result = match sys::fork() {
        Ok(sys::Fork::Child) => {
            let flags = libc::CLONE_NEWUSER
                | libc::CLONE_NEWNS
                | libc::CLONE_NEWPID
                | libc::CLONE_NEWNET
                | libc::CLONE_NEWIPC
                | libc::CLONE_NEWUTS
                | libc::CLONE_NEWCGROUP;
            let code = match sys::unshare(flags) {
                Ok(()) => 0,
                Err(e) => e.raw_os_error().unwrap_or(255).clamp(1, 255),
            };
            sys::exit_now(code)
        }
        Ok(sys::Fork::Parent(pid)) => match sys::wait4(pid, 0) {
            Ok(Some((_, status, _))) if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 => HelperProbe {
                namespaces_ok: true,
                error: None,
            },
            Ok(Some((_, status, _))) => HelperProbe {
                namespaces_ok: false,
                error: Some(format!(
                    "unshare(user|mount|pid|net|ipc|uts|cgroup) failed: {} (is kernel.unprivileged_userns_clone or user.max_user_namespaces 0, or an AppArmor userns restriction on?)",
                    std::io::Error::from_raw_os_error(libc::WEXITSTATUS(status))
                )),
            },
            _ => HelperProbe {
                namespaces_ok: false,
                error: Some("probe child vanished".into()),
            },
        },
        Err(e) => HelperProbe {
            namespaces_ok: false,
            error: Some(format!("fork: {e}")),
        },
    };
    match serde_json::to_string(&result) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(dir: &Path) -> serde_json::Value {
        let bytes = std::fs::read(dir.join("host-probe.json")).expect("cache file");
        serde_json::from_slice(&bytes).expect("json")
    }

    #[test]
    fn the_probe_cache_is_used_only_for_the_same_host_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fresh = HostProbe::cached_in(dir.path());
        let mut file = stored(dir.path());
        assert_eq!(file["landlock_abi"], fresh.landlock_abi);
        // A hit is read from the file, not probed again.
        file["landlock_abi"] = 99.into();
        std::fs::write(dir.path().join("host-probe.json"), file.to_string()).expect("write");
        assert_eq!(HostProbe::cached_in(dir.path()).landlock_abi, 99);
        // Another boot, kernel, id or cgroup: probed again and rewritten.
        file["key"] = "another boot".into();
        std::fs::write(dir.path().join("host-probe.json"), file.to_string()).expect("write");
        assert_eq!(
            HostProbe::cached_in(dir.path()).landlock_abi,
            fresh.landlock_abi
        );
        assert_eq!(stored(dir.path())["key"], probe_key().as_str());
    }
}
