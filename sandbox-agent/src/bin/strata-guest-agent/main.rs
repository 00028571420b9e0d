//! Strata's guest agent: the far end of Strata's agent channel, in a microVM or a pod.
//!
//! Modes (the first argument):
//! - none: PID 1's successor inside the microVM (`/init` execs it). It opens the
//!   virtio-serial port named `org.strata.agent` and serves one run on it (below), then waits
//!   to be switched off.
//! - `serve`: serves one run on its standard input and output, then exits. This is how the
//!   cluster backend reaches a pod: the pod's exec stream (through the API server and the
//!   kubelet) runs `strata-guest-agent serve` in the claimed pod. It runs as the pod's
//!   unprivileged user: it mounts nothing (a request with disks is refused), leaves the clock
//!   and the network as the pod has them, and mixes the host's entropy in without a reseed.
//! - `pod`: the pod's entrypoint. Reaps orphans (it is the container's PID 1) and waits;
//!   exits on `SIGTERM`. Nothing about a run is known when the pod starts, so every warm pod
//!   of a template is the same.
//! - `relay SOCKET`: the host side of a microVM's network forward (see [`relay`]).
//!
//! One run: the agent says [`AgentMsg::Ready`], answers the host's [`HostMsg::Hello`] with
//! [`AgentMsg::Welcome`] (a VM restored from a snapshot resumes here, waiting for that
//! hello), and runs one [`RunRequest`]: in a VM the guest clock set to the host's, host
//! entropy mixed into the guest RNG and a forced reseed, the run's disks mounted
//! (`nosuid,nodev`); then the command with exactly the given environment, rlimits and
//! working directory (empty: the agent's own), in its own process group, stdin fed from the
//! host's chunks, stdout and stderr forwarded up to the output cap, the wall-clock limit
//! enforced here too (the host kills the whole VM a little later regardless); the host
//! closing the channel kills the tool. Once the tool started it reports [`AgentMsg::Applied`]
//! (what it applied, read back: disks found mounted, the machine's memory, its cgroup's
//! limits, the tool's own rlimits); then [`AgentMsg::Exit`] and sends each
//! read-write grant back as a tar stream.
//!
//! Live mode ([`HostMsg::Live`] instead of a run, see [`live`]): the machine is set up the
//! same way, then the agent starts one exec after another until the host closes the
//! channel.
//!
//! Linux only; runs as root in a VM, as the pod's user in a pod.

mod conn;
mod files;
mod live;

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sandbox_agent::protocol::{
    encode, AgentMsg, Applied, Decoder, GuestExit, GuestLimit, GuestMount, GuestRlimits, HostMsg,
    OutStream, RunRequest, CHUNK, MAX_REPORT, PORT_NAME, PROTOCOL_VERSION,
};
// Where the agent runs decides what it may do to its machine: in a VM (PID 1's successor)
// it is root and owns the machine; in a pod (`serve`) it is unprivileged and the pod's
// machine is not its to change.
use sandbox_agent::Place;

/// `_IO('R', 0x07)`: reseed the kernel's CRNG from its input pool now (root only).
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// The channel's sending half, shared by the output forwarders.
type Port = Arc<Mutex<Box<dyn Write + Send>>>;
/// The channel's receiving half.
type Reader = Box<dyn Read + Send>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("relay") => relay(args.get(2).map(String::as_str).unwrap_or_default()),
        Some("serve") => serve_stdio(),
        Some("pod") => pod_entrypoint(),
        Some(other) => {
            eprintln!("strata-guest-agent: unknown mode {other:?} (modes: serve, pod, relay)");
            std::process::exit(2)
        }
        None => serve_vm(),
    }
}

/// The microVM mode: one run on the virtio-serial port, then wait to be switched off.
fn serve_vm() -> ! {
    let port_path = match find_port(Duration::from_secs(10)) {
        Some(path) => path,
        None => fatal(&format!("no virtio-serial port named {PORT_NAME}")),
    };
    let port = match OpenOptions::new().read(true).write(true).open(&port_path) {
        Ok(file) => file,
        Err(e) => fatal(&format!("open {}: {e}", port_path.display())),
    };
    let reader = match port.try_clone() {
        Ok(file) => file,
        Err(e) => fatal(&format!("dup port: {e}")),
    };
    // The guest's OOM killer never picks the agent (it would leave the host without a
    // report); tools are made its first pick (see `run`).
    oom_score_adj(b"-1000\0");
    // Free the page cache boot filled (zeroed on free: init_on_free=1), so a snapshot
    // taken now skips those pages and every restored VM loads and holds less.
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    let port: Port = Arc::new(Mutex::new(Box::new(port)));
    // A refusal leaves the VM waiting too: the host reads the error and switches it off.
    let _ = serve_one(Place::Vm, &port, Box::new(reader));
    // The host switches the VM off; PID 1 must not exit (that would panic the kernel).
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

/// The `serve` mode: one run on standard input and output, then exit (0 once the run was
/// reported, 1 if it was refused or the host went away first).
fn serve_stdio() -> ! {
    let port: Port = Arc::new(Mutex::new(Box::new(std::io::stdout())));
    let served = serve_one(Place::Pod, &port, Box::new(std::io::stdin()));
    std::process::exit(if served { 0 } else { 1 })
}

/// The `pod` mode: the container's PID 1. Reaps every child that ends (orphans of exec'd
/// runs are re-parented here) and exits on `SIGTERM`, which PID 1 would otherwise ignore.
fn pod_entrypoint() -> ! {
    extern "C" fn on_term(_: libc::c_int) {
        // SAFETY: `_exit` is async-signal-safe and ends the process at once.
        unsafe { libc::_exit(0) }
    }
    // SAFETY: installs a handler that only calls the async-signal-safe `_exit`; no other
    // thread exists yet.
    unsafe {
        libc::signal(
            libc::SIGTERM,
            on_term as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGINT,
            on_term as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// One conversation: ready, hello, welcome, one run, its report, exit and archives.
/// `false` if the agent refused (the error is sent) or the host went away before the run.
fn serve_one(place: Place, port: &Port, mut reader: Reader) -> bool {
    let kernel = || {
        rustix::system::uname()
            .release()
            .to_string_lossy()
            .into_owned()
    };
    send(
        port,
        &AgentMsg::Ready {
            version: PROTOCOL_VERSION,
            kernel: kernel(),
        },
    );
    let mut decoder = Decoder::new();
    // A VM restored from a snapshot resumes in this wait: the hello is the host's first word
    // to every run.
    match read_msg(&mut reader, &mut decoder) {
        Some(HostMsg::Hello { version }) if version == PROTOCOL_VERSION => {}
        Some(HostMsg::Hello { version }) => {
            return refuse(
                port,
                &format!(
                    "protocol version {version} not supported (agent speaks {PROTOCOL_VERSION})"
                ),
            )
        }
        None => return false,
        other => return refuse(port, &format!("expected hello, got {other:?}")),
    }
    send(
        port,
        &AgentMsg::Welcome {
            version: PROTOCOL_VERSION,
            kernel: kernel(),
        },
    );
    let (request, live) = match read_msg(&mut reader, &mut decoder) {
        Some(HostMsg::Run(request)) => (request, false),
        Some(HostMsg::Live(request)) => (request, true),
        None => return false,
        other => return refuse(port, &format!("expected run, got {other:?}")),
    };
    if let Err(message) = prepare(place, &request) {
        return refuse(port, &message);
    }
    if live {
        if place == Place::Vm {
            mount_devpts();
        }
        let mut seen = applied(&request, None);
        seen.rlimits = live::probe_rlimits(request.rlimits);
        send(port, &AgentMsg::Applied { applied: seen });
        live::serve(
            place,
            port,
            reader,
            decoder,
            request.rlimits,
            &request.mounts,
        );
        return true;
    }
    let mounts = request.mounts.clone();
    let report = request.report.clone();
    let status = run(place, port, request, reader, decoder);
    if let Some(report) = report {
        let mut data = std::fs::read(&report).unwrap_or_default();
        data.truncate(MAX_REPORT);
        send(port, &AgentMsg::Report { data });
    }
    send(port, &AgentMsg::Exit { status });
    for (index, mount) in mounts.iter().enumerate() {
        if mount.writable {
            send_archive(port, index as u32, mount);
        }
    }
    true
}

/// Readies the machine for `request`: clock, network, entropy and disks in a VM; in a pod
/// only the entropy (no reseed: that needs root) and a refusal of disks. Then the
/// request's files.
fn prepare(place: Place, request: &RunRequest) -> Result<(), String> {
    match place {
        Place::Vm => {
            set_clock(request.clock_unix_ns);
            network_up(request.network)?;
            reseed(&request.entropy, true);
            mount_all(&request.mounts)?;
        }
        Place::Pod => {
            if !request.mounts.is_empty() {
                return Err(format!(
                    "a pod has no disks: {} mount(s) requested",
                    request.mounts.len()
                ));
            }
            reseed(&request.entropy, false);
        }
    }
    for file in &request.files {
        let path = std::path::Path::new(&file.path);
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(path, &file.data));
        if let Err(e) = written {
            return Err(format!("write {}: {e}", file.path));
        }
    }
    Ok(())
}

/// The host side of the VM's one network forward (run by QEMU's user-mode network for each
/// guest connection to the proxy address, stdin and stdout being that connection): joins
/// it to the run's egress proxy socket, then exits.
fn relay(socket: &str) -> ! {
    let code = match std::os::unix::net::UnixStream::connect(socket) {
        Ok(stream) => {
            let upstream = stream.try_clone();
            let to_proxy = thread::spawn(move || {
                if let Ok(mut upstream) = upstream {
                    let _ = std::io::copy(&mut std::io::stdin(), &mut upstream);
                    let _ = upstream.shutdown(std::net::Shutdown::Write);
                }
            });
            // Unbuffered: std's stdout holds bytes until a newline, and a response body
            // need not end with one.
            let mut from = stream;
            let mut out = std::io::stdout().lock();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = to_proxy.join();
            0
        }
        Err(e) => {
            eprintln!("strata-guest-agent relay: {socket}: {e}");
            1
        }
    };
    std::process::exit(code)
}

/// Loopback up always; with `network`, `eth0` at `10.0.2.15/24` (no route: the only
/// reachable address is the proxy's, on the link).
fn network_up(network: bool) -> Result<(), String> {
    let mut steps = vec![vec!["link", "set", "lo", "up"]];
    if network {
        steps.push(vec!["addr", "add", "10.0.2.15/24", "dev", "eth0"]);
        steps.push(vec!["link", "set", "eth0", "up"]);
    }
    for step in steps {
        let status = Command::new("/bin/ip")
            .args(&step)
            .env_clear()
            .status()
            .map_err(|e| format!("ip {}: {e}", step.join(" ")))?;
        if !status.success() && network {
            return Err(format!("ip {} failed ({status})", step.join(" ")));
        }
    }
    Ok(())
}

/// Mounts a devpts at `/dev/pts` (the guest's `/init` mounts none), so a live sandbox's
/// tty execs get terminals; `/dev/ptmx` finds it there. A failure leaves tty execs failing
/// to open a terminal, and says so on the console.
fn mount_devpts() {
    use rustix::mount::{mount, MountFlags};
    let _ = std::fs::create_dir_all("/dev/pts");
    if let Err(e) = mount(
        "devpts",
        "/dev/pts",
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        Some(c"ptmxmode=0666,mode=0620"),
    ) {
        eprintln!("strata-guest-agent: mount devpts: {e}");
    }
}

/// Sets the guest's wall clock to the host's (a restored VM wakes with the snapshot's).
fn set_clock(unix_ns: u64) {
    if unix_ns == 0 {
        return;
    }
    let now = rustix::time::Timespec {
        tv_sec: (unix_ns / 1_000_000_000) as i64,
        tv_nsec: (unix_ns % 1_000_000_000) as _,
    };
    if let Err(e) = rustix::time::clock_settime(rustix::time::ClockId::Realtime, now) {
        eprintln!("strata-guest-agent: clock_settime: {e}");
    }
}

/// `BLKFLSBUF`: drop the block device's cached pages (a restored VM may hold pages of the
/// placeholder disk its snapshot was taken with).
const BLKFLSBUF: libc::c_ulong = 0x1261;

/// The block device whose virtio serial is `serial`.
fn disk_by_serial(serial: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir("/sys/block").ok()?;
    entries.flatten().find_map(|entry| {
        let found = std::fs::read_to_string(entry.path().join("serial")).ok()?;
        (found.trim() == serial).then(|| PathBuf::from("/dev").join(entry.file_name()))
    })
}

fn mount_all(mounts: &[GuestMount]) -> Result<(), String> {
    use rustix::mount::{mount, MountFlags};
    for m in mounts {
        let dev = disk_by_serial(&m.serial)
            .ok_or_else(|| format!("no disk with serial {} in the guest", m.serial))?;
        let file = OpenOptions::new()
            .read(true)
            .open(&dev)
            .map_err(|e| format!("open {}: {e}", dev.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: BLKFLSBUF takes no argument; the descriptor is open for the whole call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKFLSBUF) };
        if rc != 0 {
            return Err(format!(
                "BLKFLSBUF {}: {}",
                dev.display(),
                std::io::Error::last_os_error()
            ));
        }
        drop(file);
        std::fs::create_dir_all(&m.target).map_err(|e| format!("mkdir {}: {e}", m.target))?;
        let mut flags = MountFlags::NOSUID | MountFlags::NODEV;
        if !m.writable {
            flags |= MountFlags::RDONLY;
        }
        let data: Option<&std::ffi::CStr> = if m.writable { None } else { Some(c"noload") };
        mount(dev.as_path(), m.target.as_str(), "ext4", flags, data)
            .map_err(|e| format!("mount {} on {}: {e}", dev.display(), m.target))?;
    }
    Ok(())
}

/// Sends `mount`'s tree as a tar stream in [`AgentMsg::Archive`] chunks, then
/// [`AgentMsg::ArchiveEnd`]. Symbolic links are archived as links (never followed);
/// devices, FIFOs and sockets as headers without data; hard links as links to the first
/// path seen. The host decides what it accepts.
fn send_archive(port: &Port, index: u32, mount: &GuestMount) {
    let writer = ArchiveChunks {
        port: Arc::clone(port),
        mount: index,
        buf: Vec::with_capacity(CHUNK),
    };
    let mut builder = tar::Builder::new(writer);
    let result = archive_tree(&mut builder, std::path::Path::new(&mount.target))
        .and_then(|()| builder.into_inner())
        .and_then(|mut chunks| chunks.flush());
    send(
        port,
        &AgentMsg::ArchiveEnd {
            mount: index,
            error: result.err().map(|e| e.to_string()),
        },
    );
}

struct ArchiveChunks {
    port: Port,
    mount: u32,
    buf: Vec<u8>,
}

impl Write for ArchiveChunks {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let room = CHUNK - self.buf.len();
        let take = bytes.len().min(room);
        self.buf.extend_from_slice(&bytes[..take]);
        if self.buf.len() == CHUNK {
            self.flush()?;
        }
        Ok(take)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let data = std::mem::take(&mut self.buf);
            send(
                &self.port,
                &AgentMsg::Archive {
                    mount: self.mount,
                    data,
                },
            );
        }
        Ok(())
    }
}

fn archive_tree(
    builder: &mut tar::Builder<ArchiveChunks>,
    root: &std::path::Path,
) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut seen = std::collections::HashMap::<(u64, u64), PathBuf>::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = rel.join(entry.file_name());
            if path.as_os_str() == "lost+found" {
                continue;
            }
            let meta = std::fs::symlink_metadata(entry.path())?;
            let ft = meta.file_type();
            let mut header = tar::Header::new_gnu();
            header.set_mode(meta.mode() & 0o7777);
            header.set_mtime(meta.mtime().max(0) as u64);
            header.set_size(0);
            if ft.is_dir() {
                header.set_entry_type(tar::EntryType::Directory);
                builder.append_data(&mut header, &path, std::io::empty())?;
                stack.push(path);
            } else if ft.is_symlink() {
                header.set_entry_type(tar::EntryType::Symlink);
                let target = std::fs::read_link(entry.path())?;
                builder.append_link(&mut header, &path, target)?;
            } else if ft.is_file()
                && meta.nlink() > 1
                && seen.contains_key(&(meta.dev(), meta.ino()))
            {
                header.set_entry_type(tar::EntryType::Link);
                let first = seen[&(meta.dev(), meta.ino())].clone();
                builder.append_link(&mut header, &path, first)?;
            } else if ft.is_file() {
                if meta.nlink() > 1 {
                    seen.insert((meta.dev(), meta.ino()), path.clone());
                }
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(meta.len());
                let file = File::open(entry.path())?;
                builder.append_data(&mut header, &path, file.take(meta.len()))?;
            } else {
                let kind = if ft.is_char_device() {
                    tar::EntryType::Char
                } else if ft.is_block_device() {
                    tar::EntryType::Block
                } else if ft.is_fifo() {
                    tar::EntryType::Fifo
                } else {
                    // A socket: tar has no type for it; announce it as a FIFO (refused alike).
                    tar::EntryType::Fifo
                };
                header.set_entry_type(kind);
                let rdev = meta.rdev();
                header.set_device_major(libc::major(rdev))?;
                header.set_device_minor(libc::minor(rdev))?;
                builder.append_data(&mut header, &path, std::io::empty())?;
            }
        }
    }
    Ok(())
}

/// `/dev/vportNpM` whose sysfs `name` is [`PORT_NAME`], waiting for the device node.
fn find_port(timeout: Duration) -> Option<PathBuf> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/class/virtio-ports") {
            for entry in entries.flatten() {
                let name = std::fs::read_to_string(entry.path().join("name")).unwrap_or_default();
                let dev = PathBuf::from("/dev").join(entry.file_name());
                if name.trim() == PORT_NAME && dev.exists() {
                    return Some(dev);
                }
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn read_msg(reader: &mut dyn Read, decoder: &mut Decoder) -> Option<HostMsg> {
    let mut buf = [0u8; 64 * 1024];
    loop {
        match decoder.next_msg::<HostMsg>() {
            Ok(Some(msg)) => return Some(msg),
            Ok(None) => {}
            Err(e) => {
                eprintln!("strata-guest-agent: {e}");
                return None;
            }
        }
        match reader.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => decoder.feed(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

fn send(port: &Port, msg: &AgentMsg) {
    let frame = match encode(msg) {
        Ok(frame) => frame,
        Err(e) => {
            eprintln!("strata-guest-agent: {e}");
            return;
        }
    };
    let mut guard = match port.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    let _ = guard.write_all(&frame).and_then(|()| guard.flush());
}

/// Sends the refusal; `false`, for [`serve_one`] to return.
fn refuse(port: &Port, message: &str) -> bool {
    send(
        port,
        &AgentMsg::Error {
            message: message.to_string(),
        },
    );
    false
}

fn fatal(message: &str) -> ! {
    eprintln!("strata-guest-agent: {message}");
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

/// Mixes the host's bytes into the input pool (a write to `/dev/urandom`), then, with
/// `force`, makes the CRNG reseed from it, so guests restored from one snapshot diverge
/// before any tool reads randomness.
fn reseed(entropy: &[u8], force: bool) {
    let Ok(mut urandom) = OpenOptions::new().write(true).open("/dev/urandom") else {
        eprintln!("strata-guest-agent: cannot open /dev/urandom");
        return;
    };
    let _ = urandom.write_all(entropy);
    if !force {
        return;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: RNDRESEEDCRNG takes no argument; the descriptor is open for the whole call.
    let rc = unsafe { libc::ioctl(urandom.as_raw_fd(), RNDRESEEDCRNG) };
    if rc != 0 {
        eprintln!(
            "strata-guest-agent: RNDRESEEDCRNG: {}",
            std::io::Error::last_os_error()
        );
    }
}

struct Flags {
    killed: AtomicBool,
    output: AtomicBool,
    wall: AtomicBool,
}

fn kill_group(pgid: u32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pgid as i32) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

fn run(place: Place, port: &Port, req: RunRequest, reader: Reader, decoder: Decoder) -> GuestExit {
    let Some((program, args)) = req.argv.split_first() else {
        return GuestExit::SpawnFailed {
            errno: libc::EINVAL,
            message: "empty argv".into(),
        };
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(&req.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if !req.cwd.is_empty() {
        cmd.current_dir(&req.cwd);
    }
    let limits = req.rlimits;
    // SAFETY: the closure runs between fork and exec; it only makes setrlimit system
    // calls (async-signal-safe) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || set_rlimits(limits));
    }
    // In a VM the guest's RAM is the run's memory limit, and the guest's OOM killer must take
    // the tool, never the agent (-1000 since it started) or the layer inside, which ends its
    // own tool at its cgroup's limit and reports it: a plain tool is made the first pick, a
    // run with a report (the layer inside) keeps the agent's -1000 and raises its tool
    // itself.
    let first_pick = place == Place::Vm && req.report.is_none();
    // SAFETY: the closure runs between fork and exec; it only makes open, write and close
    // system calls on a fixed path (async-signal-safe) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if first_pick {
                oom_score_adj(b"1000\0");
            }
            Ok(())
        });
    }
    let ooms_before = oom_kills();
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            return GuestExit::SpawnFailed {
                errno: e.raw_os_error().unwrap_or(0),
                message: e.to_string(),
            }
        }
    };
    let pgid = child.id();
    send(
        port,
        &AgentMsg::Applied {
            applied: applied(&req, Some(pgid)),
        },
    );
    let flags = Arc::new(Flags {
        killed: AtomicBool::new(false),
        output: AtomicBool::new(false),
        wall: AtomicBool::new(false),
    });
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut forwarders = Vec::new();
    if let Some(out) = child.stdout.take() {
        forwarders.push(forward(
            out,
            OutStream::Stdout,
            port,
            &req,
            &flags,
            pgid,
            &done_tx,
        ));
    }
    if let Some(err) = child.stderr.take() {
        forwarders.push(forward(
            err,
            OutStream::Stderr,
            port,
            &req,
            &flags,
            pgid,
            &done_tx,
        ));
    }
    drop(done_tx);
    let stdin = child.stdin.take();
    listen_host(reader, decoder, stdin, Arc::clone(&flags), pgid);
    let status = wait_with_deadline(
        &mut child,
        Duration::from_millis(req.timeout_ms),
        &flags,
        pgid,
    );
    // Stragglers in the group would hold the pipes open.
    kill_group(pgid);
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut open = forwarders.len();
    while open > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(()) => open -= 1,
            Err(_) => break,
        }
    }
    let out_of_memory = place == Place::Vm
        && oom_kills() > ooms_before
        && (status.and_then(|s| s.signal()) == Some(libc::SIGKILL)
            || req
                .report
                .as_deref()
                .is_some_and(|r| std::fs::metadata(r).map_or(true, |m| m.len() == 0)));
    if flags.killed.load(Ordering::SeqCst) {
        GuestExit::Killed
    } else if out_of_memory {
        GuestExit::Limit {
            limit: GuestLimit::Memory,
        }
    } else if flags.output.load(Ordering::SeqCst) {
        GuestExit::Limit {
            limit: GuestLimit::Output,
        }
    } else if flags.wall.load(Ordering::SeqCst) {
        GuestExit::Limit {
            limit: GuestLimit::Wall,
        }
    } else {
        match status {
            Some(status) => match (status.code(), status.signal()) {
                (Some(code), _) => GuestExit::Exited { code },
                (None, Some(signal)) => GuestExit::Signaled { signal },
                (None, None) => GuestExit::Exited { code: -1 },
            },
            None => GuestExit::Exited { code: -1 },
        }
    }
}

/// Writes `value` (NUL-terminated) to this process's `oom_score_adj`; failures are
/// ignored (the kernel default then applies). Async-signal-safe.
fn oom_score_adj(value: &[u8]) {
    // SAFETY: a NUL-terminated literal path; the buffer outlives the calls; the descriptor
    // is closed before returning.
    unsafe {
        let fd = libc::open(
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        );
        if fd >= 0 {
            let len = value.len().saturating_sub(1);
            let _ = libc::write(fd, value.as_ptr().cast(), len);
            libc::close(fd);
        }
    }
}

/// The guest kernel's count of OOM kills so far (`/proc/vmstat` `oom_kill`).
fn oom_kills() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|n| n.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// What was applied for the tool (`pid`, started and not yet reaped), read back: the
/// request's disks found at their targets, the machine's memory, the agent's cgroup limits
/// and the tool's own resource limits (none without a tool).
fn applied(req: &RunRequest, pid: Option<u32>) -> Applied {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mount_points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .collect();
    let mounts = req
        .mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| mount_points.contains(&m.target.replace(' ', "\\040").as_str()))
        .map(|(i, _)| i as u32)
        .collect();
    let memory_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        });
    let cgroup_dir = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| {
            let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
            Some(PathBuf::from("/sys/fs/cgroup").join(path.trim_start_matches('/')))
        });
    let cgroup_value = |file: &str| {
        let text = std::fs::read_to_string(cgroup_dir.as_ref()?.join(file)).ok()?;
        text.trim().parse::<u64>().ok()
    };
    Applied {
        mounts,
        memory_total,
        cgroup_memory_max: cgroup_value("memory.max"),
        cgroup_pids_max: cgroup_value("pids.max"),
        rlimits: pid.and_then(tool_rlimits),
    }
}

/// The soft limits of process `pid` from `/proc/PID/limits` (`unlimited` reads as 0).
fn tool_rlimits(pid: u32) -> Option<GuestRlimits> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let soft = |name: &str| -> Option<u64> {
        let rest = text.lines().find_map(|l| l.strip_prefix(name))?;
        match rest.split_whitespace().next()? {
            "unlimited" => Some(0),
            value => value.parse().ok(),
        }
    };
    Some(GuestRlimits {
        cpu_seconds: soft("Max cpu time")?,
        file_size: soft("Max file size")?,
        open_files: soft("Max open files")?,
    })
}

fn set_rlimits(limits: GuestRlimits) -> std::io::Result<()> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    let pairs = [
        (Resource::Cpu, limits.cpu_seconds),
        (Resource::Fsize, limits.file_size),
        (Resource::Nofile, limits.open_files),
    ];
    for (resource, value) in pairs {
        if value == 0 {
            continue;
        }
        let limit = Rlimit {
            current: Some(value),
            maximum: Some(value),
        };
        setrlimit(resource, limit).map_err(std::io::Error::from)?;
    }
    Ok(())
}

fn forward(
    mut from: impl Read + Send + 'static,
    stream: OutStream,
    port: &Port,
    req: &RunRequest,
    flags: &Arc<Flags>,
    pgid: u32,
    done: &mpsc::Sender<()>,
) -> thread::JoinHandle<()> {
    let port = Arc::clone(port);
    let flags = Arc::clone(flags);
    let cap = req.output_cap;
    let done = done.clone();
    thread::spawn(move || {
        let mut sent: u64 = 0;
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let room = cap.saturating_sub(sent);
            let take = (n as u64).min(room) as usize;
            if take > 0 {
                send(
                    &port,
                    &AgentMsg::Output {
                        stream,
                        data: buf[..take].to_vec(),
                    },
                );
                sent += take as u64;
            }
            if take < n {
                flags.output.store(true, Ordering::SeqCst);
                kill_group(pgid);
                break;
            }
        }
        let _ = done.send(());
    })
}

/// Reads the host's stdin chunks and kill requests while the tool runs. The host closing
/// the channel counts as a kill: nobody is left to read the tool's output.
fn listen_host(
    mut reader: Reader,
    mut decoder: Decoder,
    stdin: Option<std::process::ChildStdin>,
    flags: Arc<Flags>,
    pgid: u32,
) {
    // Bounded: a host streaming faster than the tool reads waits (at most 64 chunks are
    // buffered in the guest).
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(64);
    if let Some(mut stdin) = stdin {
        thread::spawn(move || {
            for chunk in rx {
                if stdin.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
    }
    thread::spawn(move || {
        let mut tx = Some(tx);
        while let Some(msg) = read_msg(&mut reader, &mut decoder) {
            match msg {
                HostMsg::Stdin { data } => {
                    if let Some(tx) = &tx {
                        let _ = tx.send(data);
                    }
                }
                HostMsg::StdinEnd => tx = None,
                HostMsg::Kill => {
                    flags.killed.store(true, Ordering::SeqCst);
                    kill_group(pgid);
                }
                _ => {}
            }
        }
        flags.killed.store(true, Ordering::SeqCst);
        kill_group(pgid);
    });
}

fn wait_with_deadline(
    child: &mut Child,
    timeout: Duration,
    flags: &Flags,
    pgid: u32,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(200);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            flags.wall.store(true, Ordering::SeqCst);
            kill_group(pgid);
            return child.wait().ok();
        }
        thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}
