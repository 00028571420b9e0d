//! Every raw syscall the OS backends make, wrapped in small safe functions.
//!
//! This is the only module of the crate with `unsafe`. Each wrapper converts errors to
//! `io::Error` (keeping the errno) and wraps new file descriptors in `OwnedFd` at once.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

mod live;
mod mount;
pub use live::*;
pub use mount::*;

/// Converts a path to a C string, refusing interior NUL bytes.
pub fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

// ---------------------------------------------------------------------------------------
// Host side: spawning and supervising the helper.
// ---------------------------------------------------------------------------------------

/// Spawns `program` with `posix_spawn` (vfork semantics: the embedding process is never
/// forked), an empty environment, default signal dispositions, an empty signal mask, and
/// `fds[i]` duplicated onto fd `i` for i in 0..fds.len().
pub fn spawn_with_fds(program: &Path, argv: &[&str], fds: &[RawFd]) -> io::Result<libc::pid_t> {
    let program = cstring(program)?;
    let argv_c: Vec<CString> = argv
        .iter()
        .map(|a| {
            CString::new(*a).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in argv"))
        })
        .collect::<io::Result<_>>()?;
    let mut argv_p: Vec<*mut libc::c_char> = argv_c.iter().map(|a| a.as_ptr() as *mut _).collect();
    argv_p.push(ptr::null_mut());
    let envp: [*mut libc::c_char; 1] = [ptr::null_mut()];

    // The target fds must not collide with the sources while we dup2 them one by one:
    // first dup every source above the highest target, then dup2 down.
    let mut actions = std::mem::MaybeUninit::<libc::posix_spawn_file_actions_t>::uninit();
    let mut attr = std::mem::MaybeUninit::<libc::posix_spawnattr_t>::uninit();
    // SAFETY: init functions write a valid object into the uninitialized storage.
    unsafe {
        let rc = libc::posix_spawn_file_actions_init(actions.as_mut_ptr());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let rc = libc::posix_spawnattr_init(attr.as_mut_ptr());
        if rc != 0 {
            libc::posix_spawn_file_actions_destroy(actions.as_mut_ptr());
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    let result = (|| -> io::Result<libc::pid_t> {
        // Above every source fd: a fixed base (it was 100) collides with the sources once
        // the embedding process has that many fds open (a server, or 100 concurrent runs
        // in one Python process), and the helper then gets another file as its stdio or
        // control socket.
        let high_base = fds
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .max(fds.len() as RawFd)
            + 1;
        for (i, fd) in fds.iter().enumerate() {
            // SAFETY: `actions` was initialized above; fds are plain integers.
            let rc = unsafe {
                libc::posix_spawn_file_actions_adddup2(
                    actions.as_mut_ptr(),
                    *fd,
                    high_base + i as RawFd,
                )
            };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
        }
        for i in 0..fds.len() {
            // SAFETY: as above.
            let rc = unsafe {
                libc::posix_spawn_file_actions_adddup2(
                    actions.as_mut_ptr(),
                    high_base + i as RawFd,
                    i as RawFd,
                )
            };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
        }
        for i in 0..fds.len() {
            // SAFETY: as above.
            let rc = unsafe {
                libc::posix_spawn_file_actions_addclose(
                    actions.as_mut_ptr(),
                    high_base + i as RawFd,
                )
            };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
        }
        let mut all: libc::sigset_t = empty_sigset();
        let mut none: libc::sigset_t = empty_sigset();
        // SAFETY: sigset pointers are valid locals; attr is initialized.
        unsafe {
            libc::sigfillset(&mut all);
            libc::sigemptyset(&mut none);
            let flags =
                (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short;
            let rc = libc::posix_spawnattr_setflags(attr.as_mut_ptr(), flags);
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            libc::posix_spawnattr_setsigmask(attr.as_mut_ptr(), &none);
            libc::posix_spawnattr_setsigdefault(attr.as_mut_ptr(), &all);
        }
        let mut pid: libc::pid_t = 0;
        // SAFETY: all pointers are valid and NUL-terminated arrays end in null pointers.
        let rc = unsafe {
            libc::posix_spawn(
                &mut pid,
                program.as_ptr(),
                actions.as_ptr(),
                attr.as_ptr(),
                argv_p.as_ptr(),
                envp.as_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(pid)
    })();
    // SAFETY: both objects were initialized above and are destroyed exactly once.
    unsafe {
        libc::posix_spawn_file_actions_destroy(actions.as_mut_ptr());
        libc::posix_spawnattr_destroy(attr.as_mut_ptr());
    }
    result
}

pub(super) fn empty_sigset() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; zeroed is a valid (empty) value that sigemptyset fixes up.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid pointer.
    unsafe { libc::sigemptyset(&mut set) };
    set
}

/// Sends `signal` to `pid`. ESRCH (already gone) is not an error.
pub fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: kill has no memory-safety preconditions.
    match check(unsafe { libc::kill(pid, signal) }) {
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        other => other.map(drop),
    }
}

/// Opens a pidfd for `pid` (readable when it exits).
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: the syscall takes two integers and returns a new fd we own.
    let fd = check_long(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel returned a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Resource usage of a reaped child.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// User CPU, microseconds.
    pub user_us: u64,
    /// System CPU, microseconds.
    pub system_us: u64,
    /// Max RSS, bytes.
    pub max_rss: u64,
}

fn usage_from(ru: &libc::rusage) -> Usage {
    let us = |tv: libc::timeval| (tv.tv_sec as u64) * 1_000_000 + tv.tv_usec as u64;
    Usage {
        user_us: us(ru.ru_utime),
        system_us: us(ru.ru_stime),
        max_rss: (ru.ru_maxrss as u64) * 1024,
    }
}

/// `wait4(pid, options)`: `Ok(None)` when `WNOHANG` and nothing exited.
pub fn wait4(
    pid: libc::pid_t,
    options: libc::c_int,
) -> io::Result<Option<(libc::pid_t, i32, Usage)>> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: status and ru are valid out-pointers.
        let ret = unsafe { libc::wait4(pid, &mut status, options, &mut ru) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if ret == 0 {
            return Ok(None);
        }
        return Ok(Some((ret, status, usage_from(&ru))));
    }
}

/// Usage of all reaped children of the calling process.
pub fn children_usage() -> Usage {
    // SAFETY: rusage is plain data and the pointer is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    usage_from(&ru)
}

/// Sets `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we hold; no pointers.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }).map(drop)
}

/// A descriptor switched to `O_NONBLOCK` for as long as this value lives. Dropping it puts
/// the flag back as it was (the open file description may be shared, e.g. with a shell's
/// terminal) and closes the descriptor.
#[derive(Debug)]
pub struct NonBlocking {
    fd: OwnedFd,
    was_blocking: bool,
}

impl NonBlocking {
    /// Sets `O_NONBLOCK` on `fd` unless it is already set.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        // SAFETY: fcntl on an fd we own; no pointers.
        let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
        let was_blocking = flags & libc::O_NONBLOCK == 0;
        if was_blocking {
            // SAFETY: as above.
            check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
        }
        Ok(NonBlocking { fd, was_blocking })
    }
}

impl AsRawFd for NonBlocking {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl std::os::fd::AsFd for NonBlocking {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }
}

impl Drop for NonBlocking {
    fn drop(&mut self) {
        if self.was_blocking {
            // SAFETY: fcntl on an fd we own; no pointers.
            let flags = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_GETFL) };
            if flags >= 0 {
                // SAFETY: as above.
                unsafe {
                    libc::fcntl(
                        self.fd.as_raw_fd(),
                        libc::F_SETFL,
                        flags & !libc::O_NONBLOCK,
                    )
                };
            }
        }
    }
}

/// Sets `FD_CLOEXEC` on `fd`.
pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we hold; no pointers.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }).map(drop)
}

/// Sets the file mode creation mask.
pub fn umask(mask: libc::mode_t) {
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(mask) };
}

/// A pipe with both ends close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid array of two ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 returned two fresh fds we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `poll` with a timeout in milliseconds (-1 = forever); EINTR is retried by the caller.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: the slice is valid for its length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(err);
    }
    Ok(n as usize)
}

/// `read` into `buf`.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `write` from `buf`.
pub fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for reads of its length.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `write` that reports a reader-less pipe as an `EPIPE` error without a `SIGPIPE` reaching
/// the process (an embedder may not ignore it): SIGPIPE is blocked in this thread around
/// the write, and one it raised is consumed before unblocking.
pub fn write_no_sigpipe(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    let mut pipe_set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to sigset_t values we own.
    unsafe {
        libc::sigemptyset(&mut pipe_set);
        libc::sigaddset(&mut pipe_set, libc::SIGPIPE);
    }
    // SAFETY: valid pointers; changes only this thread's mask.
    let blocked = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &pipe_set, &mut old) } == 0;
    let already_pending = blocked && {
        // SAFETY: as above.
        let mut pending: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer.
        unsafe { libc::sigpending(&mut pending) };
        // SAFETY: valid pointer to an initialised set.
        unsafe { libc::sigismember(&pending, libc::SIGPIPE) == 1 }
    };
    let result = write(fd, buf);
    if blocked {
        if !already_pending && matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EPIPE)) {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: valid pointers; consumes the SIGPIPE this write raised (EAGAIN when
            // SIGPIPE is ignored and none was queued).
            unsafe { libc::sigtimedwait(&pipe_set, ptr::null_mut(), &zero) };
        }
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, ptr::null_mut()) };
    }
    result
}

/// `send` with `MSG_NOSIGNAL`, so a dead peer is an `EPIPE` error, never a SIGPIPE.
pub fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for reads of its length.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Sends all of `buf` on a socket (blocking).
pub fn send_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match send(fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Helper side: building the sandbox. The helper is single-threaded, so fork is safe there.
// ---------------------------------------------------------------------------------------

/// Closes every fd from `first` up.
pub fn close_fds_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; the helper owns its whole fd table.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0,
        )
    };
    if ret == 0 {
        return Ok(());
    }
    // Kernels before 5.9: close one by one from /proc/self/fd.
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= first)
        .collect();
    for fd in fds {
        // SAFETY: closing an fd we own; double close of the read_dir fd is harmless (EBADF).
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// Outcome of [`fork`].
pub enum Fork {
    /// In the parent, with the child's pid.
    Parent(libc::pid_t),
    /// In the child.
    Child,
}

/// `fork()`. Only called in the single-threaded helper, never in the embedding process.
pub fn fork() -> io::Result<Fork> {
    // SAFETY: the helper is single-threaded, so the child's copy of the process is
    // consistent (no lock held by another thread).
    let pid = check(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Fork::Child
    } else {
        Fork::Parent(pid)
    })
}

/// Exits immediately without running destructors or atexit handlers.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
}

/// `unshare(flags)`.
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes an integer.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

/// Drops supplementary groups (needs CAP_SETGID; fails harmlessly without it).
pub fn clear_groups() -> io::Result<()> {
    // SAFETY: a zero-length list with a null pointer is valid for setgroups.
    check(unsafe { libc::setgroups(0, ptr::null()) }).map(drop)
}

/// Sets the parent-death signal of the calling process.
pub fn set_parent_death_signal(signal: libc::c_int) -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) })
        .map(drop)
}

/// Marks the process non-dumpable (its /proc files become inaccessible to the tool).
pub fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }).map(drop)
}

/// Sets `no_new_privs`.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

/// Sets the hostname (in the new UTS namespace).
pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: pointer and length describe a valid buffer.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket returns a new fd or -1.
    let sock =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: ifreq is plain data.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads a valid ifreq.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) }).map(drop)
}

/// `mkdirat(dirfd, path, mode)`; EEXIST is not an error.
pub fn mkdirat(dirfd: RawFd, path: &Path, mode: libc::mode_t) -> io::Result<()> {
    let path = cstring(path)?;
    // SAFETY: NUL-terminated path.
    match check(unsafe { libc::mkdirat(dirfd, path.as_ptr(), mode) }) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        other => other.map(drop),
    }
}

/// `unlinkat(dirfd, path, flags)`: never follows a symlink in the last component.
pub fn unlinkat(dirfd: RawFd, path: &Path, flags: libc::c_int) -> io::Result<()> {
    let path = cstring(path)?;
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::unlinkat(dirfd, path.as_ptr(), flags) }).map(drop)
}

/// Creates an empty file at `path` relative to `dirfd` (a bind-mount target).
pub fn touch_at(dirfd: RawFd, path: &Path, mode: libc::mode_t) -> io::Result<()> {
    let path = cstring(path)?;
    // SAFETY: NUL-terminated path; O_CREAT with a mode argument.
    let fd = check(unsafe {
        libc::openat(
            dirfd,
            path.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: fresh fd we own.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// `symlinkat(target, dirfd, path)`.
pub fn symlinkat(target: &Path, dirfd: RawFd, path: &Path) -> io::Result<()> {
    let target = cstring(target)?;
    let path = cstring(path)?;
    // SAFETY: NUL-terminated strings.
    check(unsafe { libc::symlinkat(target.as_ptr(), dirfd, path.as_ptr()) }).map(drop)
}

/// `fstatfs(fd)`: (free blocks, total blocks, free inodes).
pub fn fs_free(fd: RawFd) -> io::Result<(u64, u64, u64)> {
    // SAFETY: statfs is plain data.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    check(unsafe { libc::fstatfs(fd, &mut st) })?;
    Ok((st.f_bavail as u64, st.f_blocks as u64, st.f_ffree as u64))
}

/// Closes fds 0, 1 and 2 (a process that hands its stdio to a child and must not keep the
/// pipes open). Later writes to them fail with `EBADF`, which the standard library ignores.
pub fn close_stdio() {
    for fd in 0..=2 {
        // SAFETY: closing a standard descriptor this process owns; nothing holds a Rust
        // handle to it.
        unsafe {
            libc::close(fd);
        }
    }
}

/// Size in bytes of the file system holding `fd` (`f_blocks * f_frsize`).
pub fn fs_size(fd: RawFd) -> io::Result<u64> {
    // SAFETY: statfs is plain data.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    check(unsafe { libc::fstatfs(fd, &mut st) })?;
    Ok((st.f_blocks as u64).saturating_mul(st.f_frsize as u64))
}

/// Drops every capability but those in `keep` (a mask of `1 << CAP_*`): from the bounding
/// set, then the effective, permitted and inheritable sets; the kept ones are raised in the
/// ambient set so they survive `execve` of unprivileged programs. Then locks securebits so
/// uid 0 never gains capabilities on exec and the ambient set cannot grow.
pub fn drop_capabilities_except(keep: u64) -> io::Result<()> {
    let last_cap: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    for cap in (0..=last_cap).filter(|cap| keep & (1 << cap) == 0) {
        // SAFETY: prctl with integer arguments.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINVAL) {
                return Err(err);
            }
        }
    }
    // SAFETY: prctl with integer arguments.
    check(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    })?;

    // CAP_SETPCAP stays effective until securebits are set, then goes with the rest.
    const CAP_SETPCAP: u64 = 1 << 8;
    set_capabilities(keep | CAP_SETPCAP, keep)?;
    for cap in (0..64u64).filter(|cap| keep & (1 << cap) != 0) {
        // SAFETY: prctl with integer arguments; the capability is permitted and inheritable.
        check(unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                cap as libc::c_ulong,
                0,
                0,
            )
        })?;
    }
    // SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | _LOCKED |
    // SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED. KEEP_CAPS stays off.
    const SECBITS: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08 | 0x40 | 0x80;
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SECBITS, 0, 0, 0) })?;
    set_capabilities(keep, keep)
}

/// `capset`: effective and permitted `present`, inheritable `inheritable` (masks of
/// `1 << CAP_*`).
fn set_capabilities(present: u64, inheritable: u64) -> io::Result<()> {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [0u32, 32].map(|shift| CapData {
        effective: (present >> shift) as u32,
        permitted: (present >> shift) as u32,
        inheritable: (inheritable >> shift) as u32,
    });
    // SAFETY: header and a two-element data array, as capset v3 expects.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    })
    .map(drop)
}

/// `setrlimit(resource, {soft, hard})`.
pub fn setrlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: valid pointer to an rlimit.
    check(unsafe { libc::setrlimit(resource, &lim) }).map(drop)
}

/// Starts a new session (detaches from any controlling terminal).
pub fn setsid() -> io::Result<()> {
    // SAFETY: no arguments.
    check(unsafe { libc::setsid() }).map(drop)
}

/// Resets every signal to its default disposition and unblocks all signals.
pub fn reset_signals() {
    for signal in 1..libc::SIGRTMAX() {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: setting SIG_DFL is always valid; failures (invalid signals) are ignored.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
    let set = empty_sigset();
    // SAFETY: valid sigset pointer; null old-set pointer is allowed.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, ptr::null_mut()) };
}

/// What a tool starts with, in a child of init (whose dispositions [`reset_signals`] set,
/// with only `SIGPIPE` ignored): `SIGPIPE` back to its default and nothing blocked. Handled
/// signals need nothing: `execve` resets them.
pub fn exec_signals() {
    // SAFETY: setting SIG_DFL is always valid.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let set = empty_sigset();
    // SAFETY: valid sigset pointer; null old-set pointer is allowed.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, ptr::null_mut()) };
}

/// Ignores `signal` in the calling process.
pub fn ignore_signal(signal: libc::c_int) {
    // SAFETY: SIG_IGN is a valid disposition.
    unsafe { libc::signal(signal, libc::SIG_IGN) };
}

/// `execve(path, argv, envp)`; only returns on failure.
pub fn execve(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envp_p.push(ptr::null());
    // SAFETY: all strings are NUL-terminated and both arrays end in a null pointer.
    unsafe { libc::execve(path.as_ptr(), argv_p.as_ptr(), envp_p.as_ptr()) };
    io::Error::last_os_error()
}

/// `access(path, X_OK)` succeeds.
pub fn is_executable(path: &CStr) -> bool {
    // SAFETY: NUL-terminated path.
    unsafe { libc::access(path.as_ptr(), libc::X_OK) == 0 }
}

/// `setresgid(gid, gid, gid)` then `setresuid(uid, uid, uid)`: become `uid`/`gid` of the
/// current user namespace.
pub fn become_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: integer arguments.
    check(unsafe { libc::setresgid(gid, gid, gid) })?;
    // SAFETY: integer arguments.
    check(unsafe { libc::setresuid(uid, uid, uid) }).map(drop)
}

/// The caller's real uid and gid, as its user namespace sees them.
pub fn real_ids() -> (u32, u32) {
    // SAFETY: no arguments, cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// The caller's effective uid and gid.
pub fn ids() -> (u32, u32) {
    // SAFETY: no arguments, cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// The landlock ABI version the kernel offers (0 when landlock is unavailable).
pub fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: null attr with size 0 and the VERSION flag is the documented probe.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        0
    } else {
        ret as i32
    }
}

/// Whether seccomp filtering is available (`PR_GET_SECCOMP` works).
pub fn seccomp_available() -> bool {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// Grows a pipe's buffer (`F_SETPIPE_SZ`); the kernel rounds up and caps it.
pub fn set_pipe_size(fd: RawFd, size: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl with integer arguments.
    check(unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, size) }).map(drop)
}
