//! The caller's terminal during `strata exec --tty`: its size (sent when the exec starts and
//! again on every `SIGWINCH`), raw mode while the exec runs (restored when it ends, and on
//! a stop signal before the CLI exits), so every keystroke, `^C` included, goes to the
//! program's own terminal in the sandbox rather than acting on the CLI.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use rustix::termios::{self, OptionalActions, Termios};
use strata::live::TtySize;

/// The size of the caller's terminal (stdout's, else stdin's); 24x80 when neither is one.
pub fn size() -> TtySize {
    let of = |fd: std::os::fd::BorrowedFd<'_>| termios::tcgetwinsize(fd).ok();
    match of(std::io::stdout().as_fd()).or_else(|| of(std::io::stdin().as_fd())) {
        Some(w) if w.ws_row > 0 && w.ws_col > 0 => TtySize {
            rows: w.ws_row,
            cols: w.ws_col,
        },
        _ => TtySize { rows: 24, cols: 80 },
    }
}

/// Stdin in raw mode until dropped (then its settings are restored). Nothing when stdin
/// is not a terminal.
pub struct Raw {
    saved: Arc<Mutex<Option<Termios>>>,
}

impl Raw {
    /// Puts stdin in raw mode, if it is a terminal.
    pub fn enter() -> Raw {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).ok();
        if let Some(original) = &saved {
            let mut raw = original.clone();
            raw.make_raw();
            let _ = termios::tcsetattr(stdin.as_fd(), OptionalActions::Now, &raw);
        }
        Raw {
            saved: Arc::new(Mutex::new(saved)),
        }
    }

    /// A way to restore the terminal from another thread (a stop signal's).
    pub fn restorer(&self) -> impl Fn() + Send + 'static {
        let saved = Arc::clone(&self.saved);
        move || restore(&saved)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        restore(&self.saved);
    }
}

fn restore(saved: &Mutex<Option<Termios>>) {
    if let Some(original) = saved.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), OptionalActions::Now, &original);
    }
}

/// Blocks `SIGWINCH` and the stop signals in this thread (call before any other thread
/// starts, so all inherit the mask) and starts the thread that takes them: a resize calls
/// `on_resize`, a stop signal calls `on_stop` and exits with 128 + its number (the exec's
/// connection then closes, which ends a foreground exec). `false` when the thread cannot
/// be started (the signals then keep their default action).
pub fn watch_signals(
    on_resize: impl Fn() + Send + 'static,
    on_stop: impl Fn() + Send + 'static,
) -> bool {
    let Some(set) =
        crate::signals::block(&[libc::SIGWINCH, libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
    else {
        return false;
    };
    let started = std::thread::Builder::new()
        .name("strata-tty-signals".into())
        .spawn(move || loop {
            let mut signal: libc::c_int = 0;
            // SAFETY: `set` lives on this thread's stack for the call; `signal` is written.
            if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                continue;
            }
            if signal == libc::SIGWINCH {
                on_resize();
            } else {
                on_stop();
                std::process::exit(128 + signal);
            }
        });
    if started.is_err() {
        crate::signals::unblock(&set);
        return false;
    }
    true
}
