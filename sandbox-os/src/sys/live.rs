//! The syscalls of a live sandbox's init and supervisor: signals taken through a
//! signalfd, an exec's stdio moved onto 0-2, and ending every process of a pid namespace.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;

use super::{empty_sigset, kill, read, wait4};

/// Blocks `signals` in the calling thread (threads it starts inherit the mask) and returns
/// a close-on-exec, non-blocking signalfd that is readable when one is pending.
pub fn signal_fd(signals: &[libc::c_int]) -> io::Result<OwnedFd> {
    let mut set = empty_sigset();
    for signal in signals {
        // SAFETY: `set` is a valid sigset and `signal` a signal number.
        unsafe { libc::sigaddset(&mut set, *signal) };
    }
    // SAFETY: valid sigset pointer; null old-set pointer is allowed.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: -1 asks for a new signalfd for the valid `set`.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// [`signal_fd`] for `SIGCHLD`: readable when a child changed state.
pub fn sigchld_fd() -> io::Result<OwnedFd> {
    signal_fd(&[libc::SIGCHLD])
}

/// Reads and discards whatever a non-blocking descriptor holds (a signalfd's records).
pub fn drain(fd: RawFd) {
    let mut buf = [0u8; 1024];
    while matches!(read(fd, &mut buf), Ok(n) if n > 0) {}
}

/// A `pollfd` waiting for `fd` to be readable.
pub fn pollfd_in(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Makes `stdio` (stdin, stdout, stderr) this process's fds 0, 1 and 2. The sources may
/// themselves be any of 0-2 (a process that closed its stdio gets them back for the next
/// descriptors it receives), so each is first copied above 2, then moved down.
pub fn onto_stdio(stdio: [OwnedFd; 3]) -> io::Result<()> {
    let mut high = Vec::with_capacity(3);
    for fd in &stdio {
        // SAFETY: F_DUPFD_CLOEXEC of an open descriptor returns a new one >= 3.
        let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fcntl returned a new descriptor that nothing else owns.
        high.push(unsafe { OwnedFd::from_raw_fd(copy) });
    }
    drop(stdio);
    for (target, fd) in high.iter().enumerate() {
        // SAFETY: dup2 of an open descriptor onto 0..=2; whatever was there is replaced.
        if unsafe { libc::dup2(fd.as_raw_fd(), target as RawFd) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// As pid 1 of a pid namespace: kills every other process of it (`kill(-1)` reaches them
/// all) and reaps them, so nothing of the namespace is left when this returns.
pub fn kill_all_and_reap() {
    let _ = kill(-1, libc::SIGKILL);
    loop {
        match wait4(-1, libc::__WALL) {
            Ok(Some(_)) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            _ => break,
        }
    }
}

/// Starts a TCP connection to `127.0.0.1:port` (in the calling process's network
/// namespace) on a non-blocking, close-on-exec socket; the connect may still be under way.
///
/// # Errors
/// The socket could not be made, or the connect failed at once (e.g. nothing listens).
pub fn connect_loopback(port: u16) -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let socket = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    let address = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
    match rustix::net::connect(&socket, &address) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => Ok(socket),
        Err(e) => Err(e.into()),
    }
}
