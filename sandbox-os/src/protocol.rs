//! The wire protocol between the host library and the `strata-helper` binary.
//!
//! One `AF_UNIX` stream socket (fd 3 in the helper) carries length-prefixed JSON frames:
//! the host sends one [`Spec`] (the sandbox's shape), then [`HostMessage::Run`] with the
//! [`Command`] — at once for a cold run, later for a pre-started (warm) sandbox — and
//! optionally [`HostMessage::Kill`]; the helper sends [`Event`]s. The host closing its end
//! means "the embedder is gone": the helper kills the sandbox at once.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_core::Net;
pub use sandbox_core::{EndReason, LandlockStatus, MountRole, MountSpec, RunSpec, SetupStage};
use serde::{Deserialize, Serialize};

/// Largest frame either side accepts.
pub const MAX_FRAME: usize = 16 << 20;

/// The shape of a sandbox: everything the helper needs to build it, but not what to run in
/// it. Built by the host (see `plan`) around the run's [`RunSpec`], never by the tool. Two
/// runs with equal specs can use interchangeable pre-started sandboxes: the warm pool keys
/// on the whole spec ([`Spec::pool_key`]), limits included.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// What the run enforces: the caller's grants, environment, workdir, network and every
    /// limit. The helper refuses a spec of another [`RunSpec::version`].
    pub run: RunSpec,
    /// Host system directories bound read-only so host programs can run (empty for an
    /// image root).
    pub system_mounts: Vec<MountSpec>,
    /// Workdir is private scratch space (not inside a mount), created by the helper.
    pub workdir_is_scratch: bool,
    /// Symlinks recreated in the new root (`/bin -> usr/bin` on merged-/usr systems).
    pub links: Vec<LinkSpec>,
    /// Files written into the new root (`/etc/passwd`, `/etc/group`).
    pub files: Vec<FileSpec>,
    /// Uid the tool has inside the sandbox.
    pub uid: u32,
    /// Gid the tool has inside the sandbox.
    pub gid: u32,
    /// The host identity `uid`/`gid` map to. `None`: the helper's own ids (an unprivileged
    /// embedder). `Some`: a root helper maps them, and the helper's own ids appear at
    /// [`crate::identity::EMBEDDER_INSIDE_ID`] so the tool can use the embedder's files in
    /// its grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ids: Option<crate::identity::HostIds>,
    /// Each sandbox of this shape gets host ids no other sandbox has, allocated when it is
    /// built (so `host_ids` is set per sandbox, not part of the shape).
    #[serde(default)]
    pub fresh_ids: bool,
    /// A cgroup caps the run's memory and processes as a whole; otherwise `RLIMIT_AS` and
    /// `RLIMIT_NPROC` stand in, per process and per uid.
    pub cgroup_limits: bool,
    /// Install landlock rules (false only in best-effort mode on kernels without landlock).
    pub landlock: bool,
    /// Refuse to run unless landlock is enforced.
    pub require_landlock: bool,
    /// Cgroup membership files (`cgroup.procs` on v2, `tasks` on v1) the helper joins before creating namespaces. Set per
    /// sandbox when it is built; empty in the shape.
    pub cgroup_procs: Vec<PathBuf>,
    /// Simulated failure of one layer, for fail-closed tests. Never set by callers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
    /// Container runs: an image's root file system becomes the root (an overlay with a
    /// private writable layer) instead of an empty tmpfs. `None` for process runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRootSpec>,
    /// A live sandbox: init serves exec requests on the live channel (fd
    /// [`crate::helper::LIVE_FD`] of the helper) instead of running one command.
    #[serde(default)]
    pub live: bool,
}

impl Spec {
    /// Every bind mount, system directories and grants, sorted so parents come before
    /// children (a grant's pins and read-only entries keep following it).
    pub fn mounts(&self) -> Vec<&MountSpec> {
        let mut all: Vec<&MountSpec> = self.system_mounts.iter().chain(&self.run.mounts).collect();
        all.sort_by_key(|m| m.target.components().count());
        all
    }

    /// Working directory inside the sandbox.
    pub fn workdir(&self) -> &Path {
        &self.run.workdir
    }

    /// The network namespace the run gets: the host's for [`Net::Host`]; an empty one
    /// whose only way out is the egress proxy for a non-empty allowlist; an empty one
    /// otherwise (no network, an empty allowlist, or a policy this version does not know:
    /// fail closed).
    pub fn net(&self) -> NetMode {
        match &self.run.net {
            Net::Host => NetMode::Host,
            Net::Allow(rules) if !rules.is_empty() => NetMode::Egress,
            _ => NetMode::Isolated,
        }
    }

    /// Size cap of the private scratch tmpfs (`/tmp`, workdir, `/dev/shm`), bytes.
    pub fn scratch_bytes(&self) -> u64 {
        self.run.limits.disk.bytes()
    }

    /// Inode cap of the scratch tmpfs.
    pub fn scratch_inodes(&self) -> u64 {
        (self.scratch_bytes() / 8192).clamp(256, 1 << 20)
    }

    /// The tool's wall-clock limit, from the moment it is executed.
    pub fn timeout(&self) -> Duration {
        self.run.limits.timeout
    }

    /// The `setrlimit` calls made just before exec: CPU seconds per process, file size,
    /// open files, no core dumps; `RLIMIT_AS` when the caps ask for it or no cgroup caps
    /// memory, `RLIMIT_NPROC` when no cgroup caps processes.
    pub fn rlimits(&self) -> Vec<RlimitSpec> {
        let limits = &self.run.limits;
        let cpu_secs = limits.cpu_time.as_secs_f64().ceil().max(1.0) as u64;
        let both = |resource, value| RlimitSpec {
            resource,
            soft: value,
            hard: value,
        };
        let mut rlimits = vec![
            RlimitSpec {
                resource: Rlimit::Cpu,
                soft: cpu_secs,
                hard: cpu_secs + 1,
            },
            both(Rlimit::Fsize, limits.file_size.bytes()),
            both(Rlimit::Nofile, u64::from(limits.open_files)),
            both(Rlimit::Core, 0),
        ];
        let address_space = limits
            .address_space
            .map(|a| a.bytes())
            .or((!self.cgroup_limits).then_some(limits.memory.bytes()));
        if let Some(bytes) = address_space {
            rlimits.push(both(Rlimit::As, bytes));
        }
        if !self.cgroup_limits {
            rlimits.push(both(Rlimit::Nproc, u64::from(limits.processes)));
        }
        rlimits
    }

    /// The warm pool's key: the whole spec, so two runs share pre-built sandboxes only when
    /// everything the helper and the cgroup enforce is equal.
    pub fn pool_key(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The root of a container run: an overlay of the unpacked image (read-only lower layer)
/// and a writable upper layer that is private to the run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ImageRootSpec {
    /// Canonical host path of the unpacked image (opened with `RESOLVE_NO_SYMLINKS`); never
    /// written.
    pub lower: PathBuf,
    /// Canonical host directory that keeps the writable layer between runs (its `upper`
    /// and `work` subdirectories). `None`: the writable layer lives on the run's
    /// size-capped scratch tmpfs and disappears with the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<PathBuf>,
    /// Top-level directories (and files) of the image that landlock grants full access
    /// (read, write, execute) beneath: the run's private copy of the image.
    pub writable: Vec<PathBuf>,
    /// Top-level directories that hold a granted mount: landlock grants them read and
    /// execute only, so the mount's own rights are not widened.
    pub readable: Vec<PathBuf>,
}

/// A layer whose failure a test simulates in the helper.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// `unshare` of the namespaces fails with `EPERM`.
    Namespaces,
    /// landlock reports that it is not enforced.
    Landlock,
    /// Installing the seccomp filter fails.
    Seccomp,
    /// Joining the run's cgroup fails with `EACCES`.
    Cgroup,
}

/// What to run in a built sandbox.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Command {
    /// Program to execute: a path inside the sandbox, or a name looked up in `PATH` of `env`.
    pub program: String,
    /// Full argv, including argv\[0\].
    pub argv: Vec<String>,
    /// Environment as `KEY=VALUE` strings.
    pub env: Vec<String>,
}

/// A symlink in the new root.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Absolute path of the link inside the sandbox.
    pub path: PathBuf,
    /// Link target, as on the host.
    pub target: PathBuf,
}

/// A small file created in the new root.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// Absolute path inside the sandbox.
    pub path: PathBuf,
    /// Contents.
    pub contents: String,
}

/// Network namespace handling.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NetMode {
    /// A new, empty network namespace with loopback up.
    #[default]
    Isolated,
    /// The host's network namespace.
    Host,
    /// A new, empty network namespace with loopback up, whose only way out is the host's
    /// egress proxy, listening inside it (see `egress_link`).
    Egress,
}

/// One `setrlimit` call.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RlimitSpec {
    /// Which limit.
    pub resource: Rlimit,
    /// Soft limit.
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
}

/// The rlimits Strata sets.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Rlimit {
    /// `RLIMIT_CPU`, seconds.
    Cpu,
    /// `RLIMIT_FSIZE`, bytes.
    Fsize,
    /// `RLIMIT_NOFILE`.
    Nofile,
    /// `RLIMIT_AS`, bytes.
    As,
    /// `RLIMIT_NPROC`.
    Nproc,
    /// `RLIMIT_CORE`, bytes.
    Core,
}

/// Host to helper, after the spec.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMessage {
    /// Run this command in the sandbox (once; the sandbox is single-use).
    Run {
        /// The command.
        command: Command,
    },
    /// Kill the sandbox now; `reason` is echoed in [`Event::Exited`].
    Kill {
        /// Why ([`EndReason::Output`], [`EndReason::Cancelled`], ...).
        reason: EndReason,
    },
}

/// Helper to host.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The sandbox is built and waits for its command.
    Ready {
        /// What the helper enforced.
        enforced: Box<Enforced>,
    },
    /// The tool was executed.
    Started,
    /// Building the sandbox failed; the tool never ran.
    SetupFailed {
        /// The stage that failed.
        stage: SetupStage,
        /// The step within it (e.g. `"open mount source /data"`).
        step: String,
        /// OS error number, when there is one.
        errno: i32,
        /// Extra context.
        message: String,
        /// Set when the failure means a guarantee cannot be enforced (fail closed).
        unenforceable: Option<String>,
    },
    /// `execve` of the tool failed; the tool never ran.
    ExecFailed {
        /// The program.
        program: String,
        /// OS error number.
        errno: i32,
    },
    /// The run is over and every process in the sandbox is gone.
    Exited {
        /// Raw wait status of the tool's main process, if it was reaped.
        wait_status: Option<i32>,
        /// Why the helper killed the sandbox, if it did (the wall-clock limit, or a host
        /// reason).
        killed: Option<EndReason>,
        /// User CPU time of all sandbox processes, microseconds.
        user_cpu_us: u64,
        /// System CPU time of all sandbox processes, microseconds.
        system_cpu_us: u64,
        /// Largest resident set of any sandbox process, bytes.
        max_rss_bytes: u64,
        /// The scratch tmpfs was full when the run ended.
        scratch_full: bool,
    },
}

/// What the helper enforced, for the receipt.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Enforced {
    /// Namespaces created.
    pub namespaces: Vec<String>,
    /// Landlock ABI the kernel offers (0 = none).
    pub landlock_abi: i32,
    /// How much of the landlock policy the kernel enforces.
    pub landlock_status: LandlockStatus,
    /// Landlock scopes (signal, abstract unix socket) in force.
    pub landlock_scoped: bool,
    /// Number of syscalls on the seccomp allowlist.
    pub seccomp_allowed: usize,
    /// Number of explicitly denied syscalls.
    pub seccomp_denied: usize,
    /// `no_new_privs` is set.
    pub no_new_privs: bool,
    /// Every capability set is empty.
    pub caps_dropped: bool,
    /// Capabilities the tool keeps in its own user namespace (over files of its own and
    /// the embedder's ids only), e.g. `CAP_DAC_OVERRIDE`; empty when all were dropped.
    #[serde(default)]
    pub caps_kept: Vec<String>,
    /// The user namespace's uid map as written: (inside, host, count) lines.
    #[serde(default)]
    pub uid_map: Vec<(u32, u32, u32)>,
    /// The gid map as written.
    #[serde(default)]
    pub gid_map: Vec<(u32, u32, u32)>,
    /// fds other than 0-2 were closed.
    pub fds_closed: bool,
    /// memfd executables are refused in this pid namespace (`vm.memfd_noexec=2`).
    pub memfd_noexec: bool,
    /// The bind mounts in the new root, as made.
    #[serde(default)]
    pub mounts: Vec<MountSpec>,
    /// The network namespace the sandbox has.
    pub net: NetMode,
    /// The size of the scratch tmpfs as the kernel reports it (`statfs`), bytes.
    pub scratch_bytes: u64,
    /// The `setrlimit` calls the tool's process makes before exec (it is not executed if
    /// one fails).
    #[serde(default)]
    pub rlimits: Vec<RlimitSpec>,
    /// The wall-clock limit the helper enforces from exec, milliseconds.
    pub timeout_ms: u64,
}

/// Writes one frame.
pub fn write_frame<T: Serialize>(mut w: impl Write, value: &T) -> io::Result<()> {
    let body = serde_json::to_vec(value).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf)
}

/// Reads one frame; `Ok(None)` on a clean end of stream.
pub fn read_frame<T: for<'de> Deserialize<'de>>(mut r: impl Read) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Incremental frame decoder for a non-blocking reader.
#[derive(Default)]
pub struct FrameBuffer {
    buf: Vec<u8>,
}

impl FrameBuffer {
    /// Appends bytes read from the socket.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Pops the next complete frame, if any.
    pub fn next_frame<T: for<'de> Deserialize<'de>>(&mut self) -> io::Result<Option<T>> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "frame too large",
            ));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let value = serde_json::from_slice(&self.buf[4..4 + len])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        self.buf.drain(..4 + len);
        Ok(Some(value))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A spec with no mounts, tool ids 1000, cgroup limits, default limits.
    pub(crate) fn sample_spec() -> Spec {
        Spec {
            run: RunSpec {
                version: sandbox_core::RUN_SPEC_VERSION,
                backend: sandbox_core::BackendKind::Process,
                mounts: vec![],
                system: sandbox_core::SystemDirs::Runtime,
                env: Default::default(),
                workdir: "/tmp".into(),
                net: Net::None,
                limits: Default::default(),
                agent: None,
                protect_host_executed: true,
                caps: Default::default(),
            },
            system_mounts: vec![],
            workdir_is_scratch: false,
            links: vec![],
            files: vec![],
            uid: 1000,
            gid: 1000,
            host_ids: None,
            fresh_ids: false,
            cgroup_limits: true,
            landlock: true,
            require_landlock: true,
            cgroup_procs: vec![],
            fault: None,
            image: None,
            live: false,
        }
    }

    #[test]
    fn the_pool_key_covers_every_limit() {
        let spec = sample_spec();
        let mut other = spec.clone();
        other.run.limits.cpus = 0.5;
        assert_ne!(spec.pool_key(), other.pool_key(), "cpus");
        let mut other = spec.clone();
        other.run.limits.memory = sandbox_core::ByteSize(64 << 20);
        assert_ne!(spec.pool_key(), other.pool_key(), "memory");
        let mut other = spec.clone();
        other.fresh_ids = true;
        assert_ne!(spec.pool_key(), other.pool_key(), "identity mode");
        assert_eq!(spec.pool_key(), spec.clone().pool_key());
    }

    #[test]
    fn frames_round_trip_whole_and_in_pieces() {
        let event = Event::ExecFailed {
            program: "nope".into(),
            errno: 2,
        };
        let mut wire = Vec::new();
        write_frame(&mut wire, &event).expect("write");
        write_frame(&mut wire, &event).expect("write");
        let first: Option<Event> = read_frame(&wire[..]).expect("read");
        assert_eq!(first, Some(event.clone()));
        let mut buffer = FrameBuffer::default();
        for byte in &wire {
            buffer.push(std::slice::from_ref(byte));
        }
        assert_eq!(
            buffer.next_frame::<Event>().expect("decode"),
            Some(event.clone())
        );
        assert_eq!(buffer.next_frame::<Event>().expect("decode"), Some(event));
        assert_eq!(buffer.next_frame::<Event>().expect("decode"), None);
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut buffer = FrameBuffer::default();
        buffer.push(&u32::MAX.to_le_bytes());
        assert!(buffer.next_frame::<Event>().is_err());
    }
}
