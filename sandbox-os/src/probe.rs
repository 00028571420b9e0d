//! One-time host probe for the process backend (`strata doctor`, fail-closed checks).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use sandbox_core::Check;

use crate::cgroup::{self, Layout};
use crate::sys;
use crate::userns;

/// What this host offers the process backend.
#[derive(Clone, Debug)]
pub struct HostProbe {
    /// Landlock ABI (0 = unavailable).
    pub landlock_abi: i32,
    /// seccomp filters can be installed.
    pub seccomp: bool,
    /// The helper could create user, mount, pid, net, ipc, uts and cgroup namespaces and use
    /// the user namespace's capabilities (`None`: not probed; the run itself fails closed if
    /// they cannot be had). The cheap probes fill in only a refusal the sysctls already
    /// show.
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
                namespaces: withheld_namespaces(),
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
                namespaces: withheld_namespaces(),
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

/// What the cheap probe knows about namespaces: withheld when the sysctls say so
/// ([`userns::withheld_by_sysctl`], read every time: two small files), else not probed.
fn withheld_namespaces() -> Option<Result<(), String>> {
    userns::withheld_by_sysctl(sys::ids().0).map(|failure| Err(userns::explain(failure)))
}

/// Runs `strata-helper probe`: whether the namespaces can be created and used here.
pub(crate) fn probe_namespaces(helper: &Path) -> Result<(), String> {
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

/// The probe child's steps, in order: creating the namespaces, then the first uses of the
/// user namespace's capabilities (where a host that hands out powerless namespaces shows).
const PROBE_STEPS: [&str; 5] = [
    "create namespaces",
    "write setgroups",
    "write uid_map",
    "write gid_map",
    "make the mount tree private",
];

/// The probe child: the steps of [`PROBE_STEPS`] until one fails. Returns the failed step's
/// index and errno.
fn probe_child() -> Option<(usize, i32)> {
    let (uid, gid) = sys::ids();
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    let steps: [&dyn Fn() -> std::io::Result<()>; 5] = [
        &|| sys::unshare(flags),
        &|| std::fs::write("/proc/self/setgroups", "deny"),
        &|| std::fs::write("/proc/self/uid_map", format!("0 {uid} 1\n")),
        &|| std::fs::write("/proc/self/gid_map", format!("0 {gid} 1\n")),
        &|| {
            sys::mount(
                None,
                Path::new("/"),
                None,
                libc::MS_REC | libc::MS_PRIVATE,
                None,
            )
        },
    ];
    steps
        .iter()
        .enumerate()
        .find_map(|(index, step)| step().err().map(|e| (index, errno(e))))
}

/// `strata-helper probe`: tries to create the namespaces in a forked child, and to use the
/// user namespace's capabilities there, and prints the result as JSON (naming the cause and
/// the remedy when the host withholds user namespaces). Returns the exit code.
pub fn helper_probe() -> i32 {
    let failed = |message: String| HelperProbe {
        namespaces_ok: false,
        error: Some(message),
    };
    let result = match sys::pipe() {
        Err(e) => failed(format!("pipe: {e}")),
        Ok((read, write)) => match sys::fork() {
            Ok(sys::Fork::Child) => {
                drop(read);
                let report = probe_child().map_or([0u8; 8], |(step, errno)| {
                    let mut bytes = [0u8; 8];
                    bytes[..4].copy_from_slice(&(step as u32 + 1).to_le_bytes());
                    bytes[4..].copy_from_slice(&(errno as u32).to_le_bytes());
                    bytes
                });
                let _ = sys::write(write.as_raw_fd(), &report);
                sys::exit_now(0)
            }
            Ok(sys::Fork::Parent(pid)) => {
                drop(write);
                let mut report = [0u8; 8];
                let read_len = sys::read(read.as_raw_fd(), &mut report).unwrap_or(0);
                let _ = sys::wait4(pid, 0);
                let step = u32::from_le_bytes([report[0], report[1], report[2], report[3]]);
                let errno = u32::from_le_bytes([report[4], report[5], report[6], report[7]]) as i32;
                match (read_len, step as usize) {
                    (8, 0) => HelperProbe {
                        namespaces_ok: true,
                        error: None,
                    },
                    (8, step) if step <= PROBE_STEPS.len() => {
                        let name = PROBE_STEPS[step - 1];
                        let failure = if step == 1 {
                            userns::Failure::Create(errno)
                        } else {
                            userns::Failure::Powerless { step: name, errno }
                        };
                        failed(if userns::withheld(failure) {
                            userns::explain(failure)
                        } else {
                            format!(
                                "{name} in a new user namespace failed: {}",
                                std::io::Error::from_raw_os_error(errno)
                            )
                        })
                    }
                    _ => failed("probe child vanished".into()),
                }
            }
            Err(e) => failed(format!("fork: {e}")),
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
