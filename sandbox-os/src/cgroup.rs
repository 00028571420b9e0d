//! Per-run cgroups: memory, pids and CPU accounting for the whole sandbox, on cgroup v2
//! (what most machines have) and v1 (what some CI hosts and older distributions have).
//!
//! The host creates one cgroup per run under `<own cgroup>/strata/`, writes the limits,
//! and hands the `cgroup.procs` paths to the helper, which joins them before it creates
//! namespaces so every sandbox process is inside. After the run the host reads the
//! counters (peak memory, OOM kills, refused forks), kills anything still inside, and
//! removes the cgroup.

use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where this host's cgroup controllers are, for the calling process.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Layout {
    /// Unified hierarchy: one base directory with `memory` and `pids` enabled.
    V2 {
        /// `<mount>/<own cgroup>/strata`.
        base: PathBuf,
    },
    /// Legacy hierarchies: one base per controller.
    V1 {
        /// `<memory mount>/<own cgroup>/strata`.
        memory: PathBuf,
        /// `<pids mount>/<own cgroup>/strata`.
        pids: PathBuf,
        /// `<cpuacct mount>/<own cgroup>/strata`, for CPU accounting, if mounted.
        cpuacct: Option<PathBuf>,
        /// `<cpu mount>/<own cgroup>/strata`, for the CPU quota, if mounted separately from
        /// cpuacct (when they share a hierarchy, `cpuacct` serves both).
        cpu: Option<PathBuf>,
        /// `<freezer mount>/<own cgroup>/strata`, to pause live sandboxes, if mounted and
        /// writable (one-shot runs do not join it).
        #[serde(default)]
        freezer: Option<PathBuf>,
    },
}

impl Layout {
    /// The base directories runs are created in (one per v1 controller).
    pub fn bases(&self) -> Vec<&Path> {
        match self {
            Layout::V2 { base } => vec![base],
            Layout::V1 {
                memory,
                pids,
                cpuacct,
                cpu,
                freezer,
            } => {
                let mut v = vec![memory.as_path(), pids.as_path()];
                v.extend(cpuacct.as_deref());
                v.extend(cpu.as_deref());
                v.extend(freezer.as_deref());
                v
            }
        }
    }

    /// `"cgroup v2"` or `"cgroup v1"`.
    pub fn name(&self) -> &'static str {
        match self {
            Layout::V2 { .. } => "cgroup v2",
            Layout::V1 { .. } => "cgroup v1",
        }
    }
}

/// One mounted cgroup hierarchy from `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    /// Mount point.
    pub mount: PathBuf,
    /// `true` for cgroup2.
    pub unified: bool,
    /// Controllers (v1 super options such as `memory`, `pids`, `cpu`, `cpuacct`).
    pub controllers: Vec<String>,
}

/// Parses cgroup mounts out of `/proc/self/mountinfo` text. Pure.
pub fn parse_mountinfo(text: &str) -> Vec<Hierarchy> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if fields.len() < 5 || right.len() < 3 {
            continue;
        }
        let (fstype, super_opts) = (right[0], right[2]);
        let mount = PathBuf::from(fields[4].replace("\\040", " "));
        match fstype {
            "cgroup2" => out.push(Hierarchy {
                mount,
                unified: true,
                controllers: Vec::new(),
            }),
            "cgroup" => out.push(Hierarchy {
                mount,
                unified: false,
                controllers: super_opts.split(',').map(str::to_string).collect(),
            }),
            _ => {}
        }
    }
    out
}

/// Parses `/proc/self/cgroup`: (controllers, path) per line; v2's line has no controllers.
pub fn parse_proc_cgroup(text: &str) -> Vec<(Vec<String>, PathBuf)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            let controllers = if controllers.is_empty() {
                Vec::new()
            } else {
                controllers.split(',').map(str::to_string).collect()
            };
            Some((controllers, PathBuf::from(path)))
        })
        .collect()
}

/// Picks the layout from parsed mount and membership data. Pure. Prefers v2 when the
/// unified hierarchy offers both `memory` and `pids` (`v2_controllers` is the content of
/// its `cgroup.controllers`).
pub fn choose_layout(
    mounts: &[Hierarchy],
    membership: &[(Vec<String>, PathBuf)],
    v2_controllers: Option<&str>,
) -> Option<Layout> {
    let own = |controller: Option<&str>| -> PathBuf {
        membership
            .iter()
            .find(|(ctrls, _)| match controller {
                Some(c) => ctrls.iter().any(|x| x == c),
                None => ctrls.is_empty(),
            })
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| PathBuf::from("/"))
    };
    let under = |mount: &Path, own: PathBuf| {
        mount
            .join(own.strip_prefix("/").unwrap_or(&own))
            .join("strata")
    };
    if let (Some(unified), Some(ctrls)) = (mounts.iter().find(|h| h.unified), v2_controllers) {
        let has = |c: &str| ctrls.split_whitespace().any(|x| x == c);
        if has("memory") && has("pids") {
            return Some(Layout::V2 {
                base: under(&unified.mount, own(None)),
            });
        }
    }
    let v1 = |name: &str| {
        mounts
            .iter()
            .find(|h| !h.unified && h.controllers.iter().any(|c| c == name))
    };
    let memory = v1("memory")?;
    let pids = v1("pids")?;
    let cpuacct = v1("cpuacct").map(|h| under(&h.mount, own(Some("cpuacct"))));
    let cpu = v1("cpu")
        .map(|h| under(&h.mount, own(Some("cpu"))))
        .filter(|cpu| Some(cpu) != cpuacct.as_ref());
    let freezer = v1("freezer").map(|h| under(&h.mount, own(Some("freezer"))));
    Some(Layout::V1 {
        memory: under(&memory.mount, own(Some("memory"))),
        pids: under(&pids.mount, own(Some("pids"))),
        cpuacct,
        cpu,
        freezer,
    })
}

/// Detects the layout and checks that Strata can create cgroups there. `Err` says why not.
pub fn detect() -> Result<Layout, String> {
    let mountinfo =
        fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("read mountinfo: {e}"))?;
    let membership = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("read /proc/self/cgroup: {e}"))?;
    let mounts = parse_mountinfo(&mountinfo);
    let membership = parse_proc_cgroup(&membership);
    let v2_controllers = mounts.iter().find(|h| h.unified).and_then(|h| {
        let own = membership
            .iter()
            .find(|(c, _)| c.is_empty())
            .map(|(_, p)| p.clone())?;
        fs::read_to_string(
            h.mount
                .join(own.strip_prefix("/").unwrap_or(&own))
                .join("cgroup.controllers"),
        )
        .ok()
    });
    let mut layout =
        choose_layout(&mounts, &membership, v2_controllers.as_deref()).ok_or_else(|| {
            "no cgroup hierarchy with memory and pids controllers is mounted".to_string()
        })?;
    // The freezer only serves pausing live sandboxes: without it they pause with signals.
    if let Layout::V1 { freezer, .. } = &mut layout {
        if freezer
            .as_deref()
            .is_some_and(|base| probe_base(base).is_err())
        {
            *freezer = None;
        }
    }
    for base in layout.bases() {
        probe_base(base)?;
    }
    crate::cgroup_cleanup::sweep_stale(&layout.bases());
    if let Layout::V2 { base } = &layout {
        // Children of `strata/` need the controllers delegated to them.
        fs::write(base.join("cgroup.subtree_control"), "+memory +pids")
            .map_err(|e| format!("cannot enable memory and pids in {}: {e}", base.display()))?;
        let _ = fs::write(base.join("cgroup.subtree_control"), "+cpu");
    }
    Ok(layout)
}

/// Creates `base` if needed and proves that runs can be created in it.
fn probe_base(base: &Path) -> Result<(), String> {
    match fs::create_dir(base) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", base.display())),
    }
    // The directory may exist (made by another user): prove we can create runs in it.
    let probe = base.join(format!(
        "probe-{}-{}",
        std::process::id(),
        NEXT_RUN.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir(&probe)
        .map_err(|e| format!("cannot create cgroups in {}: {e}", base.display()))?;
    let _ = fs::remove_dir(&probe);
    Ok(())
}

/// The limits a run's cgroup holds, as read back from the kernel after writing them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Memory limit, bytes (the kernel rounds to pages).
    pub memory_bytes: u64,
    /// Process and thread limit.
    pub pids: u64,
    /// CPU bandwidth: quota and period, microseconds (`None`: no CPU controller).
    pub cpu: Option<(u64, u64)>,
}

impl Applied {
    /// The CPU bandwidth in cores, if a quota is set.
    pub fn cpus(&self) -> Option<f64> {
        self.cpu
            .filter(|(_, period)| *period > 0)
            .map(|(quota, period)| quota as f64 / period as f64)
    }
}

/// The CFS period Strata uses, in microseconds.
const CPU_PERIOD_US: u64 = 100_000;

fn quota_us(cpus: f64) -> u64 {
    ((cpus * CPU_PERIOD_US as f64).round() as u64).max(1000)
}

/// Counters read after the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Peak memory, bytes.
    pub peak_memory: u64,
    /// Processes killed by the OOM killer in this cgroup.
    pub oom_kills: u64,
    /// Forks refused by the pids limit.
    pub pids_refused: u64,
    /// CPU time of every process that ran in it, microseconds.
    pub cpu_us: Option<u64>,
    /// The limits the cgroup held.
    pub applied: Applied,
}

/// One run's cgroup(s). Removed on drop (after killing anything left inside).
#[derive(Debug)]
pub struct RunCgroup {
    dirs: Vec<PathBuf>,
    version2: bool,
    applied: Applied,
    /// The file CPU usage is read from (`cpu.stat` on v2, `cpuacct.usage` on v1), if any.
    cpu_usage_file: Option<PathBuf>,
    /// The directory that freezes the run (`cgroup.freeze` on v2, the v1 freezer's
    /// `freezer.state`), for runs created freezable.
    freezer: Option<PathBuf>,
}

static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

/// How long every task of a run may stall on memory within [`THRASH_WINDOW`] before the
/// run is taken to be thrashing at its memory limit: 1 s.
pub const THRASH_STALL: Duration = Duration::from_secs(1);
/// The window of [`THRASH_STALL`]: 2 s (unprivileged PSI triggers need whole multiples of
/// 2 s).
pub const THRASH_WINDOW: Duration = Duration::from_secs(2);

impl RunCgroup {
    /// Creates the run's cgroup(s), writes the memory, process and CPU limits of `limits`
    /// and reads them back ([`RunCgroup::applied`]). A `freezable` run (a live sandbox) can
    /// be frozen: on v2 always, on v1 when the freezer hierarchy is mounted and writable.
    pub fn create(
        layout: &Layout,
        limits: &sandbox_core::Limits,
        freezable: bool,
    ) -> io::Result<Self> {
        let memory = limits.memory.bytes();
        let pids = limits.processes;
        let name = format!(
            "run-{}-{}",
            std::process::id(),
            NEXT_RUN.fetch_add(1, Ordering::Relaxed)
        );
        let mut run = RunCgroup {
            dirs: Vec::new(),
            version2: matches!(layout, Layout::V2 { .. }),
            applied: Applied::default(),
            cpu_usage_file: None,
            freezer: None,
        };
        match layout {
            Layout::V2 { base } => {
                let dir = run.make(base, &name)?;
                if freezable && dir.join("cgroup.freeze").exists() {
                    run.freezer = Some(dir.clone());
                }
                fs::write(dir.join("memory.max"), memory.to_string())?;
                let _ = fs::write(dir.join("memory.swap.max"), "0");
                fs::write(dir.join("pids.max"), pids.to_string())?;
                run.applied.memory_bytes = read_number(&dir.join("memory.max"))?;
                run.applied.pids = read_number(&dir.join("pids.max"))?;
                if dir.join("cpu.max").exists() {
                    let quota = format!("{} {CPU_PERIOD_US}", quota_us(limits.cpus));
                    fs::write(dir.join("cpu.max"), quota)?;
                    let text = fs::read_to_string(dir.join("cpu.max"))?;
                    let mut parts = text.split_whitespace().map(str::parse::<u64>);
                    if let (Some(Ok(quota)), Some(Ok(period))) = (parts.next(), parts.next()) {
                        run.applied.cpu = Some((quota, period));
                    }
                }
            }
            Layout::V1 {
                memory: memory_base,
                pids: pids_base,
                cpuacct,
                cpu,
                freezer,
            } => {
                if let (true, Some(base)) = (freezable, freezer) {
                    run.freezer = Some(run.make(base, &name)?);
                }
                let mem = run.make(memory_base, &name)?;
                fs::write(mem.join("memory.limit_in_bytes"), memory.to_string())?;
                // Swap accounting is optional; where present, memory+swap gets the same cap.
                let _ = fs::write(mem.join("memory.memsw.limit_in_bytes"), memory.to_string());
                run.applied.memory_bytes = read_number(&mem.join("memory.limit_in_bytes"))?;
                let pid = run.make(pids_base, &name)?;
                fs::write(pid.join("pids.max"), pids.to_string())?;
                run.applied.pids = read_number(&pid.join("pids.max"))?;
                for (base, sets_quota) in [(cpuacct, cpu.is_none()), (cpu, true)] {
                    let Some(base) = base else { continue };
                    let dir = run.make(base, &name)?;
                    if sets_quota && dir.join("cpu.cfs_quota_us").exists() {
                        fs::write(dir.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
                        fs::write(
                            dir.join("cpu.cfs_quota_us"),
                            quota_us(limits.cpus).to_string(),
                        )?;
                        let quota = read_number(&dir.join("cpu.cfs_quota_us"))?;
                        let period = read_number(&dir.join("cpu.cfs_period_us"))?;
                        run.applied.cpu = Some((quota, period));
                    }
                }
            }
        }
        let usage_name = if run.version2 {
            "cpu.stat"
        } else {
            "cpuacct.usage"
        };
        run.cpu_usage_file = run
            .dirs
            .iter()
            .map(|dir| dir.join(usage_name))
            .find(|file| file.exists());
        Ok(run)
    }

    fn make(&mut self, base: &Path, name: &str) -> io::Result<PathBuf> {
        let dir = base.join(name);
        fs::create_dir(&dir)?;
        self.dirs.push(dir.clone());
        Ok(dir)
    }

    /// CPU time used so far by every process in the run, microseconds.
    pub fn cpu_usage_us(&self) -> Option<u64> {
        let text = fs::read_to_string(self.cpu_usage_file.as_ref()?).ok()?;
        if self.version2 {
            return text
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok());
        }
        text.trim().parse::<u64>().ok().map(|ns| ns / 1000)
    }

    /// A PSI trigger on the run's memory pressure (cgroup v2 with pressure stall
    /// information): its descriptor turns readable-priority (`POLLPRI`) when every task of
    /// the run stalled on memory for [`THRASH_STALL`] within a [`THRASH_WINDOW`]. At the
    /// memory limit without swap, a tool whose file pages are reclaimed and faulted back in
    /// forever thrashes instead of meeting the OOM killer (seen under emulation, where a
    /// refault is slow); the supervisor ends such a run as the memory limit. `None` on
    /// cgroup v1 or without PSI.
    pub fn memory_pressure_trigger(&self) -> Option<std::os::fd::OwnedFd> {
        use std::io::Write;
        if !self.version2 {
            return None;
        }
        let dir = self.dirs.first()?;
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(dir.join("memory.pressure"))
            .ok()?;
        let trigger = format!(
            "full {} {}\0",
            THRASH_STALL.as_micros(),
            THRASH_WINDOW.as_micros()
        );
        file.write_all(trigger.as_bytes()).ok()?;
        Some(file.into())
    }

    /// The files the helper writes itself (`0`) into: `cgroup.procs` on v2, `tasks` on v1.
    ///
    /// On v1 the helper, single-threaded, moves its one thread: the kernel then skips the
    /// global thread-group lock that a `cgroup.procs` write takes, whose first taker waits
    /// for an RCU grace period (5.8 ms median measured here, against 0.25 ms for `tasks`).
    /// Its children are forked from that thread, so every process of the sandbox is inside
    /// either way. v2 has no such file for domain cgroups.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        let file = if self.version2 {
            "cgroup.procs"
        } else {
            "tasks"
        };
        self.dirs.iter().map(|d| d.join(file)).collect()
    }

    /// Reads the counters.
    pub fn stats(&self) -> Stats {
        let read = |dir: &Path, file: &str| fs::read_to_string(dir.join(file)).unwrap_or_default();
        let field = |text: &str, key: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
                .unwrap_or(0)
        };
        let mut stats = Stats {
            applied: self.applied,
            ..Stats::default()
        };
        for dir in &self.dirs {
            if self.version2 {
                stats.peak_memory = read(dir, "memory.peak").trim().parse().unwrap_or(0);
                stats.oom_kills = field(&read(dir, "memory.events"), "oom_kill ");
                stats.pids_refused = field(&read(dir, "pids.events"), "max ");
                stats.cpu_us = Some(field(&read(dir, "cpu.stat"), "usage_usec "));
            } else if dir.join("memory.max_usage_in_bytes").exists() {
                stats.peak_memory = read(dir, "memory.max_usage_in_bytes")
                    .trim()
                    .parse()
                    .unwrap_or(0);
                stats.oom_kills = field(&read(dir, "memory.oom_control"), "oom_kill ");
            } else if dir.join("pids.max").exists() {
                stats.pids_refused = field(&read(dir, "pids.events"), "max ");
            } else if dir.join("cpuacct.usage").exists() {
                stats.cpu_us = read(dir, "cpuacct.usage")
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .map(|ns| ns / 1000);
            }
        }
        stats
    }

    /// Pids still inside (should be none once the helper is reaped).
    pub fn live_pids(&self) -> Vec<libc::pid_t> {
        let mut pids: Vec<libc::pid_t> = self
            .dirs
            .iter()
            .flat_map(|d| {
                fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Whether the run can be frozen ([`RunCgroup::freeze`]).
    pub fn freezable(&self) -> bool {
        self.freezer.is_some()
    }

    /// Freezes (`true`) or thaws every process of the run, and waits (at most 1 s) until the
    /// kernel reports it done. `Ok(false)`: the run has no freezer.
    ///
    /// # Errors
    /// The kernel refused, or did not finish freezing in time (the run is thawed again).
    pub fn freeze(&self, frozen: bool) -> io::Result<bool> {
        let Some(dir) = &self.freezer else {
            return Ok(false);
        };
        let (file, value, done) = match (self.version2, frozen) {
            (true, true) => ("cgroup.freeze", "1", "frozen 1"),
            (true, false) => ("cgroup.freeze", "0", "frozen 0"),
            (false, true) => ("freezer.state", "FROZEN", "FROZEN"),
            (false, false) => ("freezer.state", "THAWED", "THAWED"),
        };
        let state = if self.version2 {
            "cgroup.events"
        } else {
            "freezer.state"
        };
        fs::write(dir.join(file), value)?;
        for _ in 0..500 {
            let text = fs::read_to_string(dir.join(state))?;
            if text.lines().any(|line| line.trim() == done) {
                return Ok(true);
            }
            // v1 retries a freeze that is stuck in FREEZING when it is written again.
            if !self.version2 && frozen {
                let _ = fs::write(dir.join(file), value);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if frozen {
            let _ = self.freeze(false);
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the cgroup did not finish freezing within 1 s",
        ))
    }

    /// Kills every process still inside (a frozen run is thawed once they are signalled,
    /// so the kill takes effect without them running).
    pub fn kill_all(&self) {
        for _ in 0..50 {
            if self.version2 {
                if let Some(dir) = self.dirs.first() {
                    let _ = fs::write(dir.join("cgroup.kill"), "1");
                }
            }
            let pids = self.live_pids();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = crate::sys::kill(pid, libc::SIGKILL);
            }
            if let Some(dir) = &self.freezer {
                let (file, value) = if self.version2 {
                    ("cgroup.freeze", "0")
                } else {
                    ("freezer.state", "THAWED")
                };
                let _ = fs::write(dir.join(file), value);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Reads a cgroup file holding one number (`max` reads as `u64::MAX`).
fn read_number(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)?;
    let text = text.trim();
    if text == "max" {
        return Ok(u64::MAX);
    }
    text.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} holds {text:?}, not a number", path.display()),
        )
    })
}

impl Drop for RunCgroup {
    /// Kills anything left inside, then hands the (empty) directories to the cleanup
    /// thread: `rmdir` of a cgroup can block for milliseconds and nothing of the run is
    /// alive any more.
    fn drop(&mut self) {
        self.kill_all();
        crate::cgroup_cleanup::remove_later(std::mem::take(&mut self.dirs));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_MOUNTINFO: &str = "\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
22 1 0:21 / /proc rw - proc proc rw";

    #[test]
    fn v1_layout_nests_under_own_cgroup() {
        let mounts = parse_mountinfo(V1_MOUNTINFO);
        let membership = parse_proc_cgroup("8:pids:/\n4:memory:/session/abc\n2:cpuacct:/\n0::/\n");
        let layout = choose_layout(&mounts, &membership, Some("")).expect("layout");
        assert_eq!(
            layout,
            Layout::V1 {
                memory: "/sys/fs/cgroup/memory/session/abc/strata".into(),
                pids: "/sys/fs/cgroup/pids/strata".into(),
                cpuacct: Some("/sys/fs/cgroup/cpuacct/strata".into()),
                cpu: Some("/sys/fs/cgroup/cpu/strata".into()),
                freezer: None,
            }
        );
    }

    #[test]
    fn v2_is_preferred_when_it_has_the_controllers() {
        let mounts =
            parse_mountinfo("30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate");
        let membership = parse_proc_cgroup("0::/user.slice/session-1.scope\n");
        let layout =
            choose_layout(&mounts, &membership, Some("cpuset cpu io memory pids")).expect("layout");
        assert_eq!(
            layout,
            Layout::V2 {
                base: "/sys/fs/cgroup/user.slice/session-1.scope/strata".into()
            }
        );
        assert_eq!(choose_layout(&mounts, &membership, Some("cpu io")), None);
    }
}
