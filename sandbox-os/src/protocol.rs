//! The wire protocol between the host library and the `strata-helper` binary.
//!
//! One `AF_UNIX` stream socket (fd 3 in the helper) carries length-prefixed JSON frames:
//! the host sends one [`Spec`] (the sandbox's shape), then [`HostMessage::Run`] with the
//! [`Command`] — at once for a cold run, later for a pre-started (warm) sandbox — and
//! optionally [`HostMessage::Kill`]; the helper sends [`Event`]s. The host closing its end
//! means "the embedder is gone": the helper kills the sandbox at once.

use std::io::{self, Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Largest frame either side accepts.
pub const MAX_FRAME: usize = 16 << 20;

/// The shape of a sandbox: everything the helper needs to build it, but not what to run in
/// it. Built by the host from `Caps` (see `plan`), never by the tool. Two runs with equal
/// specs can use interchangeable pre-started sandboxes (the warm pool).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Working directory inside the sandbox.
    pub workdir: PathBuf,
    /// Workdir is private scratch space (not inside a mount), created by the helper.
    pub workdir_is_scratch: bool,
    /// Symlinks recreated in the new root (`/bin -> usr/bin` on merged-/usr systems).
    pub links: Vec<LinkSpec>,
    /// Bind mounts, sorted so parents come before children.
    pub mounts: Vec<MountSpec>,
    /// Files written into the new root (`/etc/passwd`, `/etc/group`).
    pub files: Vec<FileSpec>,
    /// Size cap of the private scratch tmpfs (`/tmp`, workdir, `/dev/shm`).
    pub scratch_bytes: u64,
    /// Inode cap of the scratch tmpfs.
    pub scratch_inodes: u64,
    /// Network namespace mode.
    pub net: NetMode,
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
    /// Resource limits applied with `setrlimit` just before exec.
    pub rlimits: Vec<RlimitSpec>,
    /// Install landlock rules (false only in best-effort mode on kernels without landlock).
    pub landlock: bool,
    /// Refuse to run unless landlock is enforced.
    pub require_landlock: bool,
    /// Cgroup `cgroup.procs` files the helper joins before creating namespaces.
    pub cgroup_procs: Vec<PathBuf>,
    /// Simulated failure of one layer, for fail-closed tests. Never set by callers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
    /// Container runs: an image's root file system becomes the root (an overlay with a
    /// private writable layer) instead of an empty tmpfs. `None` for process runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRootSpec>,
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
    /// Wall-clock limit in milliseconds from the moment the helper receives the command,
    /// enforced by the helper (the host has a backstop).
    pub timeout_ms: u64,
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

/// A bind mount of a host path.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// Canonical host path (no symlinks); opened with `RESOLVE_NO_SYMLINKS` so a swap
    /// between planning and mounting fails instead of redirecting.
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: PathBuf,
    /// Read-write (otherwise read-only, recursively).
    pub writable: bool,
    /// The source is a directory (otherwise a file).
    pub is_dir: bool,
    /// Allow executing files from it.
    pub exec: bool,
    /// Why the mount exists. The helper mounts every role alike; the receipt and the
    /// landlock rules tell them apart.
    pub role: MountRole,
    /// For a caller's grant whose symlinks were followed (`follow_symlinks`): the host path
    /// the caller gave, which resolved to `source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub followed_from: Option<PathBuf>,
}

/// What a [`MountSpec`] is for.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum MountRole {
    /// A host system directory (`/usr`, ...) so host programs can run.
    System,
    /// A path the caller granted.
    Grant,
    /// A host-executed path inside a writable grant, bound read-only over it.
    HostExecuted,
    /// A directory between a writable grant's root and a host-executed path, bound onto
    /// itself (still writable) so it cannot be renamed or removed.
    Pin,
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
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NetMode {
    /// A new, empty network namespace with loopback up.
    Isolated,
    /// The host's network namespace.
    Host,
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
        /// Why (e.g. `"output"`, `"cancelled"`).
        reason: String,
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
        /// The step.
        stage: String,
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
        /// Why the helper killed the sandbox, if it did (`"wall"`, or a host reason).
        killed: Option<String>,
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
    /// `fully_enforced`, `partially_enforced` or `not_enforced`.
    pub landlock_status: String,
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
mod tests {
    use super::*;

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
