//! Init's side of a live sandbox: instead of running one command and exiting, init serves
//! exec requests from the host until the host closes the channel.
//!
//! Every exec is a child of init, so it inherits exactly what init has: the namespaces,
//! the root file system, no privileges, landlock and seccomp (installed once, before
//! `Ready`). Each becomes its own session (its pid is its process group, which is what a
//! signal or a per-exec timeout reaches). Init reaps every process of the sandbox, reports
//! an exec's main process when it ends, and when the host goes away kills everything left
//! (`kill(-1)` as pid 1 reaches every process of the pid namespace), so nothing outlives
//! the sandbox.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::wire::{self, LiveEvent, LiveRequest};
use crate::helper;
use crate::protocol::{Event, Spec};
use crate::sys;

/// Serves `channel` until the host closes it, then ends every process of the sandbox.
pub(crate) fn serve(spec: &Spec, channel: &OwnedFd) {
    let children = match sys::sigchld_fd() {
        Ok(fd) => fd,
        Err(e) => {
            let _ = wire::send(
                channel.as_fd(),
                &LiveEvent::Refused {
                    message: format!("init cannot watch its children: {e}"),
                },
                &[],
            );
            return;
        }
    };
    let mut execs: HashSet<i32> = HashSet::new();
    loop {
        let mut fds = [
            sys::pollfd_in(channel.as_raw_fd()),
            sys::pollfd_in(children.as_raw_fd()),
        ];
        if sys::poll(&mut fds, -1).is_err() {
            continue;
        }
        if fds[1].revents != 0 {
            sys::drain(children.as_raw_fd());
            reap(channel, &mut execs);
        }
        if fds[0].revents != 0 {
            match wire::receive::<LiveRequest>(channel.as_fd()) {
                Ok(Some((request, stdio))) => serve_one(spec, channel, request, stdio, &mut execs),
                Ok(None) => break,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    let _ = wire::send(
                        channel.as_fd(),
                        &LiveEvent::Refused {
                            message: e.to_string(),
                        },
                        &[],
                    );
                }
                Err(_) => break,
            }
        }
    }
    // The host is gone: nothing of the sandbox may outlive it.
    sys::kill_all_and_reap();
}

/// Reaps every child that ended; reports the execs' main processes.
fn reap(channel: &OwnedFd, execs: &mut HashSet<i32>) {
    while let Ok(Some((pid, status, _))) = sys::wait4(-1, libc::__WALL | libc::WNOHANG) {
        if execs.remove(&pid) {
            let _ = wire::send(
                channel.as_fd(),
                &LiveEvent::Exited {
                    pid,
                    wait_status: status,
                },
                &[],
            );
        }
    }
}

fn serve_one(
    spec: &Spec,
    channel: &OwnedFd,
    request: LiveRequest,
    stdio: Vec<OwnedFd>,
    execs: &mut HashSet<i32>,
) {
    let reply = match request {
        LiveRequest::Exec {
            id,
            command,
            workdir,
            tty,
        } => {
            let Ok([stdin, stdout, stderr]) = <[OwnedFd; 3]>::try_from(stdio) else {
                let message = format!("exec {id} came without its three stdio descriptors");
                let _ = wire::send(channel.as_fd(), &LiveEvent::Refused { message }, &[]);
                return;
            };
            match start(spec, &command, &workdir, [stdin, stdout, stderr], tty) {
                Ok(pid) => {
                    execs.insert(pid);
                    LiveEvent::Started { id, pid }
                }
                Err((program, errno)) => LiveEvent::ExecFailed { id, program, errno },
            }
        }
        LiveRequest::Signal { pid, signal } => {
            if !execs.contains(&pid) {
                LiveEvent::Refused {
                    message: format!("pid {pid} is not a running exec of this sandbox"),
                }
            } else {
                match sys::kill(-pid, signal).or_else(|_| sys::kill(pid, signal)) {
                    Ok(()) => return,
                    Err(e) => LiveEvent::Refused {
                        message: format!("signal {signal} to pid {pid}: {e}"),
                    },
                }
            }
        }
        // As pid 1, `kill(-1)` reaches every process of the sandbox but init; the kernel
        // also signals children forked while it is under way. Nothing to report: with no
        // process left there is nothing to stop.
        LiveRequest::Root => match rustix::fs::open(
            "/",
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            Ok(root) => {
                let _ = wire::send(channel.as_fd(), &LiveEvent::Root, &[root.as_fd()]);
                return;
            }
            Err(e) => LiveEvent::Refused {
                message: format!("init cannot open its root directory: {e}"),
            },
        },
        LiveRequest::StopAll => {
            let _ = sys::kill(-1, libc::SIGSTOP);
            return;
        }
        LiveRequest::ContinueAll => {
            let _ = sys::kill(-1, libc::SIGCONT);
            return;
        }
        LiveRequest::Connect { id, port } => match sys::connect_loopback(port) {
            Ok(socket) => {
                let _ = wire::send(
                    channel.as_fd(),
                    &LiveEvent::Connecting { id },
                    &[socket.as_fd()],
                );
                return;
            }
            Err(e) => LiveEvent::ConnectFailed {
                id,
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            },
        },
    };
    let _ = wire::send(channel.as_fd(), &reply, &[]);
}

/// Forks and executes `command` with `stdio`; waits only until `execve` succeeded (the
/// report pipe closes) or failed.
fn start(
    spec: &Spec,
    command: &crate::protocol::Command,
    workdir: &std::path::Path,
    stdio: [OwnedFd; 3],
    tty: bool,
) -> Result<i32, (String, i32)> {
    let failed = |e: io::Error| {
        (
            command.program.clone(),
            e.raw_os_error().unwrap_or(libc::EIO),
        )
    };
    let (exec_r, exec_w) = sys::pipe().map_err(failed)?;
    match sys::fork().map_err(failed)? {
        sys::Fork::Child => {
            drop(exec_r);
            if sys::onto_stdio(stdio).is_err() {
                sys::exit_now(127);
            }
            // A terminal exec: its own session, with the terminal as its controlling one.
            if tty
                && (sys::setsid().is_err()
                    || rustix::process::ioctl_tiocsctty(rustix::stdio::stdin()).is_err())
            {
                sys::exit_now(127);
            }
            helper::tool_main(spec, command, workdir, exec_w)
        }
        sys::Fork::Parent(pid) => {
            drop(exec_w);
            drop(stdio);
            match helper::read_frame_fd::<Event>(&exec_r) {
                Some(Event::ExecFailed { program, errno }) => {
                    let _ = sys::wait4(pid, libc::__WALL);
                    Err((program, errno))
                }
                _ => Ok(pid),
            }
        }
    }
}
