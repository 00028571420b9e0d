//! Terminals for live execs: a fresh pseudo-terminal pair per `tty` exec, made by the
//! supervisor. The exec gets the slave as its stdin, stdout and stderr (and its controlling
//! terminal, set by the sandbox's init); the supervisor keeps the master, reads the output
//! from it and writes the client's input to it. No terminal of the caller's ever reaches
//! the sandbox.

use std::os::fd::OwnedFd;

use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use sandbox_core::Error;

use crate::protocol::TtySize;

/// A terminal pair.
pub struct Pair {
    /// The supervisor's end.
    pub master: OwnedFd,
    /// The exec's end.
    pub slave: OwnedFd,
}

/// Opens a new pseudo-terminal of `size` (checked).
///
/// # Errors
/// A bad size, or the host has no free pseudo-terminal.
pub fn open(size: TtySize) -> Result<Pair, Error> {
    let size = size.check()?;
    let failed = |step: &str, e: rustix::io::Errno| Error::internal(step, e.into());
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
            .map_err(|e| failed("open a pseudo-terminal", e))?;
    rustix::pty::grantpt(&master).map_err(|e| failed("grant a pseudo-terminal", e))?;
    rustix::pty::unlockpt(&master).map_err(|e| failed("unlock a pseudo-terminal", e))?;
    // The slave is opened through the master (no path lookup that could be raced).
    let slave = rustix::pty::ioctl_tiocgptpeer(
        &master,
        OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC,
    )
    .map_err(|e| failed("open a pseudo-terminal's slave", e))?;
    resize(&master, size)?;
    Ok(Pair { master, slave })
}

/// Sets the terminal's size (the program gets `SIGWINCH`).
///
/// # Errors
/// A bad size, or the terminal is gone.
pub fn resize(master: &OwnedFd, size: TtySize) -> Result<(), Error> {
    let size = size.check()?;
    rustix::termios::tcsetwinsize(
        master,
        Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .map_err(|e| Error::internal("resize a terminal", e.into()))
}
