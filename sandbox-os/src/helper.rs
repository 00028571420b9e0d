//! The `strata-helper` binary's logic: builds the sandbox and supervises the tool.
//!
//! Three processes, so the embedding process never forks:
//! - **supervisor** (spawned by the host with `posix_spawn`): reads the [`Spec`], joins the
//!   run's cgroup, creates the namespaces, forks the init, relays the [`Command`] and the
//!   events, enforces the deadline, and kills everything when the host asks or disappears
//!   (its control socket closes).
//! - **init** (pid 1 of the new pid namespace): builds the root filesystem, drops every
//!   privilege, installs landlock and seccomp, reports `Ready`, waits for the command, forks
//!   the tool, reaps orphans, and exits when the tool's main process exits, which makes the
//!   kernel kill every process left in the namespace.
//! - **tool**: sets rlimits and executes the program.
//!
//! A sandbox runs exactly one command. Building it before the command arrives is what makes
//! the warm pool possible: the expensive part happens ahead of time.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::egress_link::{self, EGRESS_FD};
use crate::egress_transparent::{self, Transparent};
use crate::fs_policy;
use crate::identity::{EMBEDDER_INSIDE_ID, NEWGIDMAP, NEWUIDMAP};
use crate::protocol::{
    self, Command, EndReason, Enforced, Event, Fault, FrameBuffer, HostMessage, LandlockStatus,
    NetMode, Rlimit, SetupStage, Spec,
};
use crate::rootfs;
use crate::seccomp;
use crate::sys;
use crate::userns;

/// `CAP_DAC_OVERRIDE`.
const CAP_DAC_OVERRIDE: u32 = 1;
/// `CAP_FOWNER`.
const CAP_FOWNER: u32 = 3;

/// The fd on which the helper receives its control socket.
pub const CONTROL_FD: RawFd = 3;

/// The fd on which the helper of a live sandbox receives init's channel (see
/// [`crate::live`]); fd 4 is the egress link or unused.
pub const LIVE_FD: RawFd = 5;

/// How long building a sandbox (after the command arrived) may take before the run is
/// refused; the tool's own timeout starts when it is executed.
pub const SETUP_DEADLINE: Duration = Duration::from_secs(30);

/// Entry point of the `strata-helper` binary. Never returns.
pub fn main() -> ! {
    let args: Vec<String> = std::env::args().collect();
    let code = match args.get(1).map(String::as_str) {
        Some("run") => supervise(),
        Some("probe") => crate::probe::helper_probe(),
        _ => {
            eprintln!("strata-helper is started by the strata library; it is not a command to run by hand");
            2
        }
    };
    sys::exit_now(code)
}

fn send(control: &UnixStream, event: &Event) {
    let mut buf = Vec::new();
    if protocol::write_frame(&mut buf, event).is_ok() {
        let _ = sys::send_all(control.as_raw_fd(), &buf);
    }
}

fn setup_failed(
    stage: SetupStage,
    step: impl Into<String>,
    err: &io::Error,
    unenforceable: Option<&str>,
) -> Event {
    Event::SetupFailed {
        stage,
        step: step.into(),
        errno: err.raw_os_error().unwrap_or(0),
        message: err.to_string(),
        unenforceable: unenforceable.map(str::to_string),
    }
}

fn supervise() -> i32 {
    // Nothing of the embedder's fd table survives: only stdio, the control socket and
    // (for a run under an allowlist) the egress link, which is closed below otherwise.
    if sys::close_fds_from(LIVE_FD + 1).is_err() {
        return 3;
    }
    // SAFETY: the host dup2'ed the control socket onto fd 3 for us and nothing else owns it.
    let control = unsafe { UnixStream::from_raw_fd(CONTROL_FD) };
    if sys::set_cloexec(CONTROL_FD).is_err() {
        return 3;
    }
    let spec: Spec = match protocol::read_frame(&control) {
        Ok(Some(spec)) => spec,
        _ => return 4,
    };
    if let Err(e) = spec.run.check_version() {
        let err = io::Error::new(io::ErrorKind::InvalidData, e.to_string());
        send(
            &control,
            &setup_failed(SetupStage::Spec, "read the run spec", &err, None),
        );
        return 0;
    }
    sys::ignore_signal(libc::SIGPIPE);
    let live = match take_fd(LIVE_FD) {
        Some(channel) if spec.live => Some(channel),
        None if spec.live => {
            let err = io::Error::new(io::ErrorKind::NotFound, "no live channel (fd 5)");
            send(
                &control,
                &setup_failed(SetupStage::Processes, "find the live channel", &err, None),
            );
            return 0;
        }
        // Not a live sandbox: a stray fd 5 of the embedder is closed unused.
        _ => None,
    };
    let host_ids = sys::ids();
    // The supervisor is outside the tool's reach; when the run's memory limit is hit, the
    // OOM killer must pick the tool, not this process (init goes back to 0 at once).
    // Lowering below 0 needs CAP_SYS_RESOURCE: an unprivileged helper keeps 0.
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
    let maps = IdMaps::new(&spec, host_ids);
    let egress = match take_fd(EGRESS_FD) {
        Some(link) if spec.net() == NetMode::Egress => Some(UnixStream::from(link)),
        None if spec.net() == NetMode::Egress => {
            let err = io::Error::new(io::ErrorKind::NotFound, "no egress link (fd 4)");
            send(
                &control,
                &setup_failed(SetupStage::Network, "find the egress link", &err, None),
            );
            return 0;
        }
        // Not a run under an allowlist: a stray fd 4 of the embedder is closed unused.
        _ => None,
    };
    if let Err(event) = prepare_namespaces(&spec, host_ids, &maps) {
        send(&control, &event);
        return 0;
    }
    if let Some(link) = egress {
        // In the new network namespace now: the proxy's listener goes to the host, and the
        // helper keeps no copy of it (nor of the link) before init is forked.
        let transparent = match (&spec.run.net, &spec.image) {
            (sandbox_core::Net::Allow(rules), None) => Transparent::plan(rules),
            _ => Transparent::default(),
        };
        let sent = egress_transparent::bind_listeners(&transparent)
            .and_then(|listeners| egress_link::send_listeners(&link, listeners));
        if let Err(e) = sent {
            send(
                &control,
                &setup_failed(
                    SetupStage::Network,
                    "hand the egress listener to the host",
                    &e,
                    Some("net: egress only through the allowlist proxy"),
                ),
            );
            return 0;
        }
    }
    let pipes = sys::pipe().and_then(|status| sys::pipe().map(|go| (status, go)));
    let ((status_r, status_w), (go_r, go_w)) = match pipes {
        Ok(p) => p,
        Err(e) => {
            send(
                &control,
                &setup_failed(SetupStage::Processes, "init pipes", &e, None),
            );
            return 0;
        }
    };
    let init = match sys::fork() {
        Ok(sys::Fork::Child) => {
            drop((status_r, go_w, control));
            init_main(&spec, &maps, status_w, go_r, live)
        }
        Ok(sys::Fork::Parent(pid)) => pid,
        Err(e) => {
            send(
                &control,
                &setup_failed(SetupStage::Processes, "fork init", &e, None),
            );
            return 0;
        }
    };
    drop((status_w, go_r, live));
    // Only init and the tool use the run's stdio: without the supervisor's copies, the
    // host sees end of file on the output as soon as the tool's processes are gone.
    sys::close_stdio();
    supervise_init(&control, status_r, go_w, init, spec.timeout());
    0
}

/// Takes ownership of `fd` if it is open (set close-on-exec).
fn take_fd(fd: RawFd) -> Option<OwnedFd> {
    sys::set_cloexec(fd).ok()?;
    // SAFETY: `fd` is open (fcntl succeeded on it) and nothing else in this process owns
    // it: the host passed it at spawn, and every other fd above 2 but the control socket
    // was closed.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The user namespace's uid and gid maps: `(inside, host, count)` lines.
#[derive(Debug)]
struct IdMaps {
    uid: Vec<(u32, u32, u32)>,
    gid: Vec<(u32, u32, u32)>,
}

impl IdMaps {
    /// With [`Spec::host_ids`]: the tool's inside ids map to them, and the helper's own
    /// (the embedder's) ids appear at [`EMBEDDER_INSIDE_ID`]. Without: the tool's inside ids
    /// map to the helper's own.
    fn new(spec: &Spec, (host_uid, host_gid): (u32, u32)) -> IdMaps {
        match spec.host_ids {
            Some(ids) => IdMaps {
                uid: vec![(spec.uid, ids.uid, 1), (EMBEDDER_INSIDE_ID, host_uid, 1)],
                gid: vec![(spec.gid, ids.gid, 1), (EMBEDDER_INSIDE_ID, host_gid, 1)],
            },
            None => IdMaps {
                uid: vec![(spec.uid, host_uid, 1)],
                gid: vec![(spec.gid, host_gid, 1)],
            },
        }
    }

    fn text(lines: &[(u32, u32, u32)]) -> String {
        lines
            .iter()
            .map(|(inside, host, count)| format!("{inside} {host} {count}\n"))
            .collect()
    }
}

/// A child forked before `unshare` that stays in the initial user namespace and writes the
/// new namespace's maps: only a process with `CAP_SETUID` outside a user namespace may map
/// ids other than its own into it.
struct Mapper {
    pid: libc::pid_t,
    go: Option<OwnedFd>,
}

impl Mapper {
    fn spawn(maps: &IdMaps) -> io::Result<Mapper> {
        let (go_r, go_w) = sys::pipe()?;
        let target = std::process::id();
        let uid_map = IdMaps::text(&maps.uid);
        let gid_map = IdMaps::text(&maps.gid);
        let (uid_lines, gid_lines) = (maps.uid.clone(), maps.gid.clone());
        match sys::fork()? {
            sys::Fork::Child => {
                drop(go_w);
                let mut byte = [0u8; 1];
                let code = match sys::read(go_r.as_raw_fd(), &mut byte) {
                    Ok(1) if sys::ids().0 == 0 => {
                        std::fs::write(format!("/proc/{target}/uid_map"), &uid_map)
                            .and_then(|()| {
                                std::fs::write(format!("/proc/{target}/gid_map"), &gid_map)
                            })
                            .map_or_else(|e| e.raw_os_error().unwrap_or(libc::EIO), |()| 0)
                    }
                    // Unprivileged: shadow's setuid helpers check the maps against
                    // /etc/subuid and /etc/subgid and write them.
                    Ok(1) => {
                        let mapped = |tool: &str, lines: &[(u32, u32, u32)]| {
                            std::process::Command::new(tool)
                                .arg(target.to_string())
                                .args(lines.iter().flat_map(|(inside, host, count)| {
                                    [inside.to_string(), host.to_string(), count.to_string()]
                                }))
                                .stdin(std::process::Stdio::null())
                                .stdout(std::process::Stdio::null())
                                .status()
                                .is_ok_and(|s| s.success())
                        };
                        if mapped(NEWUIDMAP, &uid_lines) && mapped(NEWGIDMAP, &gid_lines) {
                            0
                        } else {
                            libc::EPERM
                        }
                    }
                    _ => 0, // the supervisor gave up before unsharing
                };
                sys::exit_now(code)
            }
            sys::Fork::Parent(pid) => Ok(Mapper {
                pid,
                go: Some(go_w),
            }),
        }
    }

    /// Lets the mapper write the maps (the caller has unshared its user namespace) and
    /// waits for it.
    fn write_maps(mut self) -> io::Result<()> {
        if let Some(go) = self.go.take() {
            sys::write(go.as_raw_fd(), &[1])?;
        }
        match sys::wait4(self.pid, 0)? {
            Some((_, status, _)) if libc::WIFEXITED(status) => {
                self.pid = 0;
                match libc::WEXITSTATUS(status) {
                    0 => Ok(()),
                    errno => Err(io::Error::from_raw_os_error(errno)),
                }
            }
            _ => {
                self.pid = 0;
                Err(io::Error::other("the id mapper died"))
            }
        }
    }
}

impl Drop for Mapper {
    fn drop(&mut self) {
        self.go = None;
        if self.pid > 0 {
            let _ = sys::wait4(self.pid, 0);
        }
    }
}

/// Creates the namespaces in the supervisor, so the init forked next is pid 1 of a new pid
/// namespace and the supervisor keeps watching from outside it.
fn prepare_namespaces(
    spec: &Spec,
    (host_uid, _host_gid): (u32, u32),
    maps: &IdMaps,
) -> Result<(), Event> {
    if spec.host_ids.is_some() && (spec.uid == EMBEDDER_INSIDE_ID || spec.gid == EMBEDDER_INSIDE_ID)
    {
        return Err(setup_failed(
            SetupStage::IdMaps,
            "map identities",
            &io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("inside id {EMBEDDER_INSIDE_ID} is reserved for the embedder's files"),
            ),
            None,
        ));
    }
    let mapper = match spec.host_ids {
        Some(_) => Some(Mapper::spawn(maps).map_err(|e| {
            setup_failed(
                SetupStage::IdMaps,
                "fork id mapper",
                &e,
                Some("identity: per-agent host ids"),
            )
        })?),
        None => None,
    };
    if host_uid == 0 {
        // Root: drop supplementary groups before they are frozen by setgroups=deny.
        sys::clear_groups().map_err(|e| {
            setup_failed(SetupStage::Identity, "drop supplementary groups", &e, None)
        })?;
    }
    // Single-threaded (see `sys::fork`): writing `0` moves this process whole, with the
    // cheap per-thread migration on cgroup v1 (`RunCgroup::procs_files`).
    for procs in &spec.cgroup_procs {
        let joined = if spec.fault == Some(Fault::Cgroup) {
            Err(io::Error::from_raw_os_error(libc::EACCES))
        } else {
            std::fs::write(procs, "0")
        };
        joined.map_err(|e| {
            setup_failed(
                SetupStage::Cgroup,
                format!("join cgroup {}", procs.display()),
                &e,
                Some("resources: cgroup memory and pids limits"),
            )
        })?;
    }
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    if spec.net() != NetMode::Host {
        flags |= libc::CLONE_NEWNET;
    }
    let unshared = if spec.fault == Some(Fault::Namespaces) {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    } else {
        sys::unshare(flags)
    };
    unshared.map_err(|e| {
        let failure = userns::Failure::Create(e.raw_os_error().unwrap_or(0));
        if userns::withheld(failure) {
            userns::refusal(failure, "create namespaces")
        } else {
            setup_failed(
                SetupStage::Namespaces,
                "create namespaces",
                &e,
                Some("isolation: user, mount, pid, ipc, uts and network namespaces"),
            )
        }
    })?;
    // The namespace's first uses of its capabilities: where a host hands out powerless
    // user namespaces (AppArmor), this is where it shows.
    let powerless = |step: &'static str, e: io::Error| {
        let failure = userns::Failure::Powerless {
            step,
            errno: e.raw_os_error().unwrap_or(0),
        };
        if userns::withheld(failure) {
            userns::refusal(failure, step)
        } else {
            setup_failed(SetupStage::IdMaps, step, &e, None)
        }
    };
    std::fs::write("/proc/self/setgroups", "deny").map_err(|e| powerless("write setgroups", e))?;
    match mapper {
        Some(mapper) => mapper.write_maps().map_err(|e| {
            setup_failed(
                SetupStage::IdMaps,
                "write uid_map and gid_map",
                &e,
                Some("identity: per-agent host ids"),
            )
        })?,
        None => {
            std::fs::write("/proc/self/uid_map", IdMaps::text(&maps.uid))
                .map_err(|e| powerless("write uid_map", e))?;
            std::fs::write("/proc/self/gid_map", IdMaps::text(&maps.gid))
                .map_err(|e| powerless("write gid_map", e))?;
        }
    }
    sys::set_hostname("strata")
        .map_err(|e| setup_failed(SetupStage::Namespaces, "set hostname", &e, None))?;
    if spec.net() != NetMode::Host {
        sys::loopback_up()
            .map_err(|e| setup_failed(SetupStage::Network, "bring up loopback", &e, None))?;
    }
    Ok(())
}

/// The supervisor's loop: relay the command to init, events to the host, enforce the
/// deadline, and kill init (and with it the whole pid namespace) when needed.
fn supervise_init(
    control: &UnixStream,
    status_r: OwnedFd,
    go_w: OwnedFd,
    init: libc::pid_t,
    timeout: Duration,
) {
    let pidfd = sys::pidfd_open(init).ok();
    let mut go_w = Some(go_w);
    let mut from_init = FrameBuffer::default();
    let mut from_host = FrameBuffer::default();
    let mut deadline: Option<Instant> = None;
    let mut tool_timeout = Duration::ZERO;
    let mut started = false;
    let mut killed: Option<EndReason> = None;
    let mut exited_sent = false;
    let mut status_open = true;
    let mut host_open = true;
    let mut buf = vec![0u8; 64 * 1024];
    let kill_init = |killed: &mut Option<EndReason>, reason: EndReason| {
        if killed.is_none() {
            *killed = Some(reason);
        }
        let _ = sys::kill(init, libc::SIGKILL);
    };
    loop {
        let timeout_ms = match (deadline, &killed) {
            (_, Some(_)) | (None, None) => -1,
            (Some(deadline), None) => {
                let now = Instant::now();
                if now >= deadline {
                    0
                } else {
                    i32::try_from((deadline - now).as_millis())
                        .unwrap_or(i32::MAX)
                        .max(1)
                }
            }
        };
        let mut fds = [
            pollfd(host_open.then_some(control.as_raw_fd())),
            pollfd(status_open.then_some(status_r.as_raw_fd())),
            pollfd(pidfd.as_ref().map(|p| p.as_raw_fd())),
        ];
        if sys::poll(&mut fds, timeout_ms).is_err() {
            kill_init(&mut killed, EndReason::Internal);
        }
        if killed.is_none() && deadline.is_some_and(|d| Instant::now() >= d) {
            let reason = if tool_timeout.is_zero() || !started {
                EndReason::SetupTimeout
            } else {
                EndReason::Wall
            };
            kill_init(&mut killed, reason);
        }
        if fds[0].revents != 0 {
            match sys::read(control.as_raw_fd(), &mut buf) {
                Ok(0) | Err(_) => {
                    // The embedder is gone: nothing may outlive it.
                    host_open = false;
                    kill_init(&mut killed, EndReason::HostGone);
                }
                Ok(n) => {
                    from_host.push(&buf[..n]);
                    while let Ok(Some(message)) = from_host.next_frame::<HostMessage>() {
                        match message {
                            HostMessage::Run { command } => {
                                if let Some(go) = go_w.take() {
                                    // Until the tool starts, building the sandbox gets its own
                                    // generous deadline; the tool's timeout starts at exec.
                                    deadline = Some(Instant::now() + SETUP_DEADLINE);
                                    tool_timeout = timeout;
                                    if write_frame_fd(&go, &command).is_err() {
                                        kill_init(&mut killed, EndReason::Internal);
                                    }
                                }
                            }
                            HostMessage::Kill { reason } => kill_init(&mut killed, reason),
                        }
                    }
                }
            }
        }
        if fds[1].revents != 0 {
            match sys::read(status_r.as_raw_fd(), &mut buf) {
                Ok(0) | Err(_) => status_open = false,
                Ok(n) => {
                    from_init.push(&buf[..n]);
                    while let Ok(Some(event)) = from_init.next_frame::<Event>() {
                        match event {
                            Event::Exited {
                                wait_status,
                                user_cpu_us,
                                system_cpu_us,
                                max_rss_bytes,
                                scratch_full,
                                ..
                            } => {
                                // Init reaped every process of the run: report at once; the
                                // namespaces are torn down after the host has its result.
                                exited_sent = true;
                                send(
                                    control,
                                    &Event::Exited {
                                        wait_status,
                                        killed,
                                        user_cpu_us,
                                        system_cpu_us,
                                        max_rss_bytes,
                                        scratch_full,
                                    },
                                );
                            }
                            Event::Started => {
                                started = true;
                                deadline = Some(Instant::now() + tool_timeout);
                                send(control, &event);
                            }
                            other => send(control, &other),
                        }
                    }
                }
            }
        }
        let init_gone = match &pidfd {
            Some(_) => fds[2].revents != 0,
            None => !status_open,
        };
        if init_gone && !status_open {
            break;
        }
    }
    let _ = sys::wait4(init, libc::__WALL);
    if !exited_sent {
        let usage = sys::children_usage();
        send(
            control,
            &Event::Exited {
                wait_status: None,
                killed: killed.or(Some(EndReason::InitDied)),
                user_cpu_us: usage.user_us,
                system_cpu_us: usage.system_us,
                max_rss_bytes: usage.max_rss,
                scratch_full: false,
            },
        );
    }
}

fn pollfd(fd: Option<RawFd>) -> libc::pollfd {
    libc::pollfd {
        fd: fd.unwrap_or(-1),
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Writes one frame to a pipe.
fn write_frame_fd<T: serde::Serialize>(fd: &OwnedFd, value: &T) -> io::Result<()> {
    let mut buf = Vec::new();
    protocol::write_frame(&mut buf, value)?;
    let mut rest = &buf[..];
    while !rest.is_empty() {
        match sys::write(fd.as_raw_fd(), rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one frame from a blocking pipe; `None` on end of file.
pub(crate) fn read_frame_fd<T: for<'de> serde::Deserialize<'de>>(fd: &OwnedFd) -> Option<T> {
    let mut frames = FrameBuffer::default();
    let mut buf = [0u8; 4096];
    loop {
        if let Ok(Some(value)) = frames.next_frame::<T>() {
            return Some(value);
        }
        match sys::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => return None,
            Ok(n) => frames.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

fn init_main(spec: &Spec, maps: &IdMaps, status: OwnedFd, go: OwnedFd, live: Option<OwnedFd>) -> ! {
    if let Err(event) = init_run(spec, maps, &status, &go, live) {
        let _ = write_frame_fd(&status, &event);
    }
    sys::exit_now(0)
}

fn unenforceable(stage: SetupStage, step: &str, message: String, guarantee: &str) -> Event {
    Event::SetupFailed {
        stage,
        step: step.into(),
        errno: 0,
        message,
        unenforceable: Some(guarantee.into()),
    }
}

fn init_run(
    spec: &Spec,
    maps: &IdMaps,
    status: &OwnedFd,
    go: &OwnedFd,
    live: Option<OwnedFd>,
) -> Result<(), Event> {
    // Every disposition back to its default once here (the embedder's ignored signals
    // survive its exec of the helper), so each tool forked below only restores SIGPIPE.
    // As pid 1 of its namespace, init gets no signal it has no handler for anyway.
    sys::reset_signals();
    sys::ignore_signal(libc::SIGPIPE);
    // The helper holds -1000 where the host lets it (it is never the OOM killer's choice);
    // init must not, or every tool it forks would inherit it and nothing in the sandbox
    // could be killed at its memory limit. Raising is always allowed, and this is the last
    // point where /proc/self is the host's and writable (landlock comes later). At 0, the
    // OOM killer picks the largest process: the tool's (killing init ends the sandbox,
    // which is the right end too).
    let _ = std::fs::write("/proc/self/oom_score_adj", "0");
    // If the supervisor dies (host SIGKILLed it), init dies, and with it the namespace.
    sys::set_parent_death_signal(libc::SIGKILL)
        .map_err(|e| setup_failed(SetupStage::Processes, "parent death signal", &e, None))?;
    // The tool shares our uid; non-dumpable keeps /proc/1/{mem,exe,environ} out of its reach.
    sys::set_not_dumpable()
        .map_err(|e| setup_failed(SetupStage::Processes, "set non-dumpable", &e, None))?;
    // New files get exactly the modes setup asks for.
    sys::umask(0);

    let built = rootfs::build(spec).map_err(|e| Event::SetupFailed {
        stage: SetupStage::RootFs,
        step: e.stage,
        errno: e.source.raw_os_error().unwrap_or(0),
        message: e.source.to_string(),
        unenforceable: None,
    })?;

    // A tool under its own host identity keeps CAP_DAC_OVERRIDE and CAP_FOWNER in its user
    // namespace: they reach only files owned by ids mapped into it (its own and the
    // embedder's), so it can use the embedder's files in its grants while everything it
    // creates belongs to its own id. No CAP_CHOWN, CAP_SETUID, CAP_SETFCAP or CAP_MKNOD.
    let kept: &[(u32, &str)] = if spec.host_ids.is_some() {
        &[
            (CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"),
            (CAP_FOWNER, "CAP_FOWNER"),
        ]
    } else {
        &[]
    };
    let keep_mask = kept.iter().fold(0u64, |mask, (cap, _)| mask | (1 << cap));
    // unshare left us with the embedder's host ids (needed above: sysctls such as
    // vm.memfd_noexec only take writes from host uid 0). Take the tool's ids, which the
    // maps point at its own host identity; capabilities in the namespace stay until below.
    sys::become_ids(spec.uid, spec.gid).map_err(|e| {
        setup_failed(
            SetupStage::Identity,
            "take the tool's ids",
            &e,
            Some("identity: per-agent host ids"),
        )
    })?;
    sys::drop_capabilities_except(keep_mask).map_err(|e| {
        setup_failed(
            SetupStage::Capabilities,
            "drop capabilities",
            &e,
            Some("privileges: capability drop"),
        )
    })?;
    sys::set_no_new_privs().map_err(|e| {
        setup_failed(
            SetupStage::NoNewPrivs,
            "no_new_privs",
            &e,
            Some("privileges: no_new_privs"),
        )
    })?;

    let abi = sys::landlock_abi();
    let landlock = if !spec.landlock {
        fs_policy::Status {
            abi,
            status: LandlockStatus::NotEnforced,
            scoped: false,
        }
    } else if spec.fault == Some(Fault::Landlock) {
        fs_policy::Status {
            abi: 0,
            status: LandlockStatus::NotEnforced,
            scoped: false,
        }
    } else {
        fs_policy::enforce(&fs_policy::rules(spec), abi).map_err(|e| {
            unenforceable(
                SetupStage::Landlock,
                "install landlock rules",
                e.to_string(),
                "fs: landlock",
            )
        })?
    };
    if spec.require_landlock && !landlock.status.is_enforced() {
        return Err(Event::SetupFailed {
            stage: SetupStage::Landlock,
            step: "check landlock".into(),
            errno: libc::ENOSYS,
            message: format!(
                "landlock is not enforced by this kernel (ABI {})",
                landlock.abi
            ),
            unenforceable: Some("fs: landlock".into()),
        });
    }

    if sys::real_ids() != (spec.uid, spec.gid) {
        return Err(unenforceable(
            SetupStage::Identity,
            "check the tool's ids",
            format!(
                "init runs as {:?}, not the planned uid {} gid {}",
                sys::real_ids(),
                spec.uid,
                spec.gid
            ),
            "identity: per-agent host ids",
        ));
    }
    let filters = seccomp::build().map_err(|e| {
        unenforceable(
            SetupStage::Seccomp,
            "build the filter",
            e.to_string(),
            "syscalls: seccomp",
        )
    })?;
    if spec.fault == Some(Fault::Seccomp) {
        return Err(unenforceable(
            SetupStage::Seccomp,
            "install the filter",
            "simulated failure".into(),
            "syscalls: seccomp",
        ));
    }
    seccomp::install(&filters).map_err(|e| {
        unenforceable(
            SetupStage::Seccomp,
            "install the filter",
            e.to_string(),
            "syscalls: seccomp",
        )
    })?;

    let enforced = Enforced {
        namespaces: namespaces(spec),
        landlock_abi: landlock.abi,
        landlock_status: landlock.status,
        landlock_scoped: landlock.scoped,
        seccomp_allowed: seccomp::ALLOWED.len(),
        seccomp_denied: seccomp::DENIED.len() + seccomp::DENIED_WHEN.len(),
        no_new_privs: true,
        caps_dropped: kept.is_empty(),
        caps_kept: kept.iter().map(|(_, name)| name.to_string()).collect(),
        uid_map: maps.uid.clone(),
        gid_map: maps.gid.clone(),
        fds_closed: true,
        memfd_noexec: built.memfd_noexec,
        mounts: spec.mounts().into_iter().cloned().collect(),
        net: spec.net(),
        scratch_bytes: built
            .scratch
            .as_ref()
            .and_then(|fd| sys::fs_size(fd.as_raw_fd()).ok())
            .unwrap_or(0),
        rlimits: spec.rlimits(),
        timeout_ms: u64::try_from(spec.timeout().as_millis()).unwrap_or(u64::MAX),
    };
    let _ = write_frame_fd(
        status,
        &Event::Ready {
            enforced: Box::new(enforced),
        },
    );

    if let Some(channel) = live {
        // A live sandbox: init keeps none of the helper's stdio (each exec brings its
        // own), serves execs until the host closes the channel, then ends everything.
        sys::close_stdio();
        crate::live::init::serve(spec, &channel);
        let all = sys::children_usage();
        let _ = write_frame_fd(
            status,
            &Event::Exited {
                wait_status: None,
                killed: None,
                user_cpu_us: all.user_us,
                system_cpu_us: all.system_us,
                max_rss_bytes: all.max_rss,
                scratch_full: false,
            },
        );
        return Ok(());
    }

    // Wait for the one command this sandbox will run.
    let Some(command) = read_frame_fd::<Command>(go) else {
        return Ok(()); // the host went away before using this sandbox
    };

    let (exec_r, exec_w) =
        sys::pipe().map_err(|e| setup_failed(SetupStage::Processes, "exec pipe", &e, None))?;
    let tool = match sys::fork()
        .map_err(|e| setup_failed(SetupStage::Processes, "fork tool", &e, None))?
    {
        sys::Fork::Child => {
            drop(exec_r);
            tool_main(spec, &command, spec.workdir(), exec_w)
        }
        sys::Fork::Parent(pid) => pid,
    };
    drop(exec_w);
    if let Some(event) = read_frame_fd::<Event>(&exec_r) {
        let _ = sys::wait4(tool, 0);
        return Err(event);
    }
    drop(exec_r);
    let _ = write_frame_fd(status, &Event::Started);
    // The tool has the run's stdio now; init keeps none of it (see the supervisor).
    sys::close_stdio();

    // Reap everything; the run ends when the tool's main process exits.
    let (wait_status, usage) = loop {
        match sys::wait4(-1, libc::__WALL) {
            Ok(Some((pid, status, usage))) if pid == tool => break (Some(status), usage),
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                break (None, sys::Usage::default())
            }
            Err(_) => {}
        }
    };
    // Then everything the tool left running: as pid 1, kill(-1) reaches every other
    // process of this pid namespace. Reaped here, so the run's end is reported only when
    // nothing of it is alive.
    sys::kill_all_and_reap();
    let all = sys::children_usage();
    let scratch_full = built
        .scratch
        .as_ref()
        .and_then(|fd| sys::fs_free(fd.as_raw_fd()).ok())
        .is_some_and(|(blocks_free, _, inodes_free)| blocks_free == 0 || inodes_free == 0);
    let _ = write_frame_fd(
        status,
        &Event::Exited {
            wait_status,
            killed: None,
            user_cpu_us: all.user_us,
            system_cpu_us: all.system_us,
            max_rss_bytes: usage.max_rss.max(all.max_rss),
            scratch_full,
        },
    );
    Ok(())
}

fn namespaces(spec: &Spec) -> Vec<String> {
    let mut ns = vec!["user", "mount", "pid", "ipc", "uts", "cgroup"];
    if spec.net() != NetMode::Host {
        ns.push("net");
    }
    ns.into_iter().map(String::from).collect()
}

/// In the forked tool: sets its session, signals, rlimits and `workdir`, and executes
/// `command`; reports an `execve` failure on `exec_w`.
pub(crate) fn tool_main(spec: &Spec, command: &Command, workdir: &Path, exec_w: OwnedFd) -> ! {
    let fail = |program: &str, err: io::Error| -> ! {
        let _ = write_frame_fd(
            &exec_w,
            &Event::ExecFailed {
                program: program.to_string(),
                errno: err.raw_os_error().unwrap_or(libc::EINVAL),
            },
        );
        sys::exit_now(127)
    };
    let _ = sys::setsid();
    sys::exec_signals();
    sys::umask(0o022);
    for limit in &spec.rlimits() {
        let resource = match limit.resource {
            Rlimit::Cpu => libc::RLIMIT_CPU,
            Rlimit::Fsize => libc::RLIMIT_FSIZE,
            Rlimit::Nofile => libc::RLIMIT_NOFILE,
            Rlimit::As => libc::RLIMIT_AS,
            Rlimit::Nproc => libc::RLIMIT_NPROC,
            Rlimit::Core => libc::RLIMIT_CORE,
        };
        if let Err(e) = sys::setrlimit(resource, limit.soft, limit.hard) {
            fail(&command.program, e);
        }
    }
    if let Err(e) = std::env::set_current_dir(workdir) {
        fail(&format!("(workdir {})", workdir.display()), e);
    }
    let path = match resolve_program(&command.program, &command.env) {
        Ok(path) => path,
        Err(e) => fail(&command.program, e),
    };
    let to_c = |s: &str| CString::new(s).unwrap_or_default();
    let argv: Vec<CString> = command.argv.iter().map(|a| to_c(a)).collect();
    let envp: Vec<CString> = command.env.iter().map(|e| to_c(e)).collect();
    let Ok(cpath) = sys::cstring(&path) else {
        fail(&command.program, io::Error::from_raw_os_error(libc::EINVAL))
    };
    // Every fd but stdio is close-on-exec (the exec-report pipe closes on success).
    let err = sys::execve(&cpath, &argv, &envp);
    fail(&command.program, err)
}

/// Finds `program` like `execvp` does, but in the tool's `PATH`, not the helper's.
fn resolve_program(program: &str, env: &[String]) -> io::Result<PathBuf> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    let mut last = io::Error::from_raw_os_error(libc::ENOENT);
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(program);
        let Ok(c) = sys::cstring(&candidate) else {
            continue;
        };
        if sys::is_executable(&c) {
            return Ok(candidate);
        }
        if candidate.exists() {
            last = io::Error::from_raw_os_error(libc::EACCES);
        }
    }
    Err(last)
}
