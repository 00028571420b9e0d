//! The agent's live mode ([`HostMsg::Live`]): after the machine is set up, one exec after
//! another until the host closes the channel.
//!
//! Threads: this module's [`serve`] reads the host's messages; each exec has one writer of
//! its stdin (fed from a bounded queue, answering [`AgentMsg::InputTaken`] so the host keeps
//! few bytes in flight) and one forwarder per output stream; one reaper waits for every
//! child of the agent (in a VM the agent is PID 1, so orphans of execs are re-parented to
//! it and reaped here too) and reports an exec's main process with [`AgentMsg::Ended`].
//! The host closing the channel kills every exec's process group.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use sandbox_agent::protocol::{
    AgentMsg, Decoder, GuestMount, GuestRlimits, HostMsg, LiveExec, OutStream, TermSize,
};
use sandbox_agent::Place;

use crate::conn::Conns;
use crate::{kill_group, oom_score_adj, read_msg, send, set_clock, set_rlimits, Port, Reader};

/// Stdin chunks queued per exec before the writer blocks (the host's window keeps far
/// fewer in flight).
const STDIN_QUEUE: usize = 64;

/// What the agent knows of one exec.
struct Exec {
    id: u64,
    /// Its stdin queue; `None` once the host ended it or the writer stopped.
    stdin: Option<SyncSender<Vec<u8>>>,
    /// Its terminal's master, for a tty exec.
    terminal: Option<Arc<File>>,
}

/// The running execs by pid (an exec is recorded before the reaper can see it end: the
/// table is locked across its spawn), and their pids by id.
#[derive(Default)]
struct Table {
    execs: HashMap<i32, Exec>,
    ids: HashMap<u64, i32>,
}

#[derive(Default)]
struct Shared {
    table: Mutex<Table>,
    /// Signalled when a child was started (the reaper waits for one when there is none).
    started: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Serves the live sandbox on `port` until the host closes the channel; every exec's
/// process group is killed then.
pub(crate) fn serve(
    place: Place,
    port: &Port,
    mut reader: Reader,
    mut decoder: Decoder,
    rlimits: GuestRlimits,
    mounts: &[GuestMount],
) {
    let shared = Arc::new(Shared::default());
    let conns = Arc::new(Conns::default());
    {
        let shared = Arc::clone(&shared);
        let port = Arc::clone(port);
        thread::spawn(move || reap(&shared, &port));
    }
    while let Some(msg) = read_msg(&mut reader, &mut decoder) {
        match msg {
            HostMsg::Exec(exec) => start(place, port, &shared, exec, rlimits),
            HostMsg::Input { id, data } => {
                let queue = {
                    let table = shared.lock();
                    let pid = table.ids.get(&id).copied();
                    pid.and_then(|pid| table.execs.get(&pid))
                        .and_then(|exec| exec.stdin.clone())
                };
                if let Some(queue) = queue {
                    let _ = queue.send(data);
                }
            }
            HostMsg::InputEnd { id } => {
                let mut table = shared.lock();
                if let Some(pid) = table.ids.get(&id).copied() {
                    if let Some(exec) = table.execs.get_mut(&pid) {
                        exec.stdin = None;
                    }
                }
            }
            HostMsg::Signal { pid, signal } => {
                // Only an exec's own group: the agent and the kernel's threads are not the
                // host's to signal.
                if shared.lock().execs.contains_key(&pid) {
                    signal_group(pid, signal);
                }
            }
            HostMsg::SetClock { unix_ns } => set_clock(unix_ns),
            HostMsg::Resize { pid, rows, cols } => {
                let terminal = shared
                    .lock()
                    .execs
                    .get(&pid)
                    .and_then(|exec| exec.terminal.clone());
                if let Some(terminal) = terminal {
                    set_size(&terminal, TermSize { rows, cols });
                }
            }
            HostMsg::Connect {
                id,
                port: guest_port,
            } => conns.open(port, id, guest_port),
            HostMsg::ConnData { id, data } => conns.data(id, data),
            HostMsg::ConnEnd { id } => conns.end(id),
            HostMsg::ConnTaken { id, bytes } => conns.taken(id, bytes),
            HostMsg::File { id, op } => crate::files::serve(port, id, op),
            HostMsg::Kill => kill_all(&shared),
            HostMsg::Finish => {
                // Nothing writes to a grant while its tree goes back: in the VM every
                // process but the agent (PID 1) is killed, also those that left their
                // exec's session.
                conns.close_all();
                kill_all(&shared);
                if place == Place::Vm {
                    // SAFETY: kill(2) of every process but PID 1 (this agent); no memory is
                    // shared.
                    let _ = unsafe { libc::kill(-1, libc::SIGKILL) };
                    thread::sleep(Duration::from_millis(50));
                }
                for (index, mount) in mounts.iter().enumerate() {
                    if mount.writable {
                        crate::send_archive(port, index as u32, mount);
                    }
                }
            }
            HostMsg::Hello { .. }
            | HostMsg::Run(_)
            | HostMsg::Live(_)
            | HostMsg::Stdin { .. }
            | HostMsg::StdinEnd => {
                eprintln!("strata-guest-agent: live mode ignores a message out of place");
            }
        }
    }
    conns.close_all();
    kill_all(&shared);
}

fn kill_all(shared: &Shared) {
    let pids: Vec<i32> = shared.lock().execs.keys().copied().collect();
    for pid in pids {
        kill_group(pid as u32);
    }
}

fn signal_group(pid: i32, signal: i32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        // SAFETY: a plain kill(2) of a process group; no memory is shared.
        let _ = unsafe { libc::kill(-pid.as_raw_nonzero().get(), signal) };
    }
}

/// Starts `exec`; answers [`AgentMsg::Started`] or [`AgentMsg::ExecFailed`].
fn start(place: Place, port: &Port, shared: &Arc<Shared>, exec: LiveExec, limits: GuestRlimits) {
    let LiveExec {
        id,
        argv,
        env,
        cwd,
        tty,
    } = exec;
    let Some((program, args)) = argv.split_first() else {
        send(
            port,
            &AgentMsg::ExecFailed {
                id,
                errno: libc::EINVAL,
            },
        );
        return;
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(&env)
        .current_dir(if cwd.is_empty() { "/" } else { cwd.as_str() });
    let terminal = match tty.map(open_terminal).transpose() {
        Ok(Some((master, slave))) => {
            let stdio = (slave.try_clone(), slave.try_clone());
            let (Ok(out), Ok(err)) = stdio else {
                send(
                    port,
                    &AgentMsg::ExecFailed {
                        id,
                        errno: libc::EMFILE,
                    },
                );
                return;
            };
            cmd.stdin(slave).stdout(out).stderr(err);
            Some(Arc::new(master))
        }
        Ok(None) => {
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            None
        }
        Err(errno) => {
            send(port, &AgentMsg::ExecFailed { id, errno });
            return;
        }
    };
    let first_pick = place == Place::Vm;
    let controlling = terminal.is_some();
    // SAFETY: the closure runs between fork and exec; it makes only setsid, ioctl,
    // setrlimit and open/write/close system calls (async-signal-safe) and allocates
    // nothing.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::setsid().map_err(std::io::Error::from)?;
            if controlling && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            set_rlimits(limits)?;
            if first_pick {
                // The guest's OOM killer takes a tool, never the agent.
                oom_score_adj(b"1000\0");
            }
            Ok(())
        });
    }
    // Held across the spawn: the reaper cannot look for this pid before it is recorded.
    let mut table = shared.lock();
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            drop(table);
            send(
                port,
                &AgentMsg::ExecFailed {
                    id,
                    errno: e.raw_os_error().unwrap_or(libc::ENOEXEC),
                },
            );
            return;
        }
    };
    let pid = child.id() as i32;
    let (queue, queued) = mpsc::sync_channel::<Vec<u8>>(STDIN_QUEUE);
    table.execs.insert(
        pid,
        Exec {
            id,
            stdin: Some(queue),
            terminal: terminal.clone(),
        },
    );
    table.ids.insert(id, pid);
    drop(table);
    shared.started.notify_all();
    drop(cmd);
    send(port, &AgentMsg::Started { id, pid });
    if let Some(master) = terminal {
        serve_terminal(port, id, master, queued);
        return;
    }
    if let Some(mut stdin) = child.stdin.take() {
        let port = Arc::clone(port);
        thread::spawn(move || {
            for chunk in queued {
                if stdin.write_all(&chunk).is_err() {
                    break;
                }
                send(
                    &port,
                    &AgentMsg::InputTaken {
                        id,
                        bytes: chunk.len() as u64,
                    },
                );
            }
        });
    }
    for (stream, pipe) in [
        (
            OutStream::Stdout,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
        (
            OutStream::Stderr,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
    ] {
        if let Some(pipe) = pipe {
            let port = Arc::clone(port);
            thread::spawn(move || forward(pipe, id, stream, &port));
        }
    }
    // The reaper waits for the child (std's handle would reap it itself on `wait`).
    drop(child);
}

/// Forwards one stream until every process holding it closed it.
fn forward(mut pipe: Box<dyn Read + Send>, id: u64, stream: OutStream, port: &Port) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => send(
                port,
                &AgentMsg::ExecOutput {
                    id,
                    stream,
                    data: buf[..n].to_vec(),
                },
            ),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    send(port, &AgentMsg::OutputEnd { id, stream });
}

/// Waits for every child of the agent; an exec's main process is reported.
fn reap(shared: &Shared, port: &Port) {
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some((pid, status))) => {
                let raw = status.as_raw();
                let pid = pid.as_raw_nonzero().get();
                let mut table = shared.lock();
                if let Some(exec) = table.execs.remove(&pid) {
                    table.ids.remove(&exec.id);
                    drop(table);
                    send(
                        port,
                        &AgentMsg::Ended {
                            id: exec.id,
                            pid,
                            wait_status: raw,
                        },
                    );
                }
            }
            // No child now: wait until an exec starts (orphans re-parented to PID 1 are
            // children too, so poll now and then while none is recorded).
            Ok(None) | Err(_) => {
                let table = shared.lock();
                let _ = shared
                    .started
                    .wait_timeout(table, Duration::from_millis(200));
            }
        }
    }
}

/// Reads back what an exec starts with: a probe process (`cat`, waiting on its stdin) is
/// started with the exec's limits, and its `/proc/PID/limits` read.
pub(crate) fn probe_rlimits(limits: GuestRlimits) -> Option<GuestRlimits> {
    let mut cmd = Command::new("cat");
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: as in `start`: only setrlimit system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || set_rlimits(limits));
    }
    let mut child = cmd.spawn().ok()?;
    let seen = crate::tool_rlimits(child.id());
    let _ = child.kill();
    let _ = child.wait();
    seen
}

/// A new terminal of `size`: its master and slave (both close-on-exec; the slave becomes
/// the exec's stdio through dup2, which clears the flag).
fn open_terminal(size: TermSize) -> Result<(File, File), i32> {
    let (mut master, mut slave) = (-1, -1);
    let winsize = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors into the given integers and reads the winsize;
    // name and termios are null (not wanted).
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &winsize,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENXIO));
    }
    use std::os::fd::FromRawFd;
    // SAFETY: openpty succeeded: both descriptors are fresh and owned by nobody else.
    let (master, slave) = unsafe { (File::from_raw_fd(master), File::from_raw_fd(slave)) };
    for fd in [&master, &slave] {
        use std::os::fd::AsRawFd;
        // SAFETY: sets FD_CLOEXEC on a descriptor this function owns.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok((master, slave))
}

/// Sets the terminal size of `master`.
fn set_size(master: &File, size: TermSize) {
    use std::os::fd::AsRawFd;
    let winsize = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize; the descriptor is open for the whole call.
    unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &winsize) };
}

/// A tty exec's terminal: the host's input to its master, its output (the master's reads)
/// as the exec's stdout until the terminal closes (EIO once every slave is closed).
fn serve_terminal(
    port: &Port,
    id: u64,
    master: Arc<File>,
    queued: std::sync::mpsc::Receiver<Vec<u8>>,
) {
    send(
        port,
        &AgentMsg::OutputEnd {
            id,
            stream: OutStream::Stderr,
        },
    );
    {
        let (port, master) = (Arc::clone(port), Arc::clone(&master));
        thread::spawn(move || {
            for chunk in queued {
                if (&*master).write_all(&chunk).is_err() {
                    break;
                }
                let bytes = chunk.len() as u64;
                send(&port, &AgentMsg::InputTaken { id, bytes });
            }
        });
    }
    let port = Arc::clone(port);
    thread::spawn(move || {
        let reader: Box<dyn Read + Send> = Box::new(TerminalReader(master));
        forward(reader, id, OutStream::Stdout, &port);
    });
}

/// Reads a terminal's master through a shared handle.
struct TerminalReader(Arc<File>);

impl Read for TerminalReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&*self.0).read(buf)
    }
}
