//! Stopping `strata run` cleanly. SIGINT, SIGTERM and SIGHUP cancel the run (everything
//! it started is killed, its cgroup, mounts and private directories are removed) and the
//! CLI then exits with 128 + the signal's number, as a shell reports a process killed by
//! it. A second signal while the run is being torn down ends the CLI at once.
//!
//! The signals are blocked in every thread and taken by one thread with `sigwait`, so no
//! handler runs in an arbitrary thread; programs the CLI starts begin with an empty mask
//! (std's `Command` resets it).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use strata::CancelToken;

/// The signals that stop a run.
const STOP: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The first stop signal received, if any.
#[derive(Clone, Default)]
pub struct Received(Arc<AtomicI32>);

impl Received {
    /// The signal's number, once one arrived.
    pub fn signal(&self) -> Option<i32> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            n => Some(n),
        }
    }
}

/// Blocks `signals` in the calling thread (threads it starts later inherit the mask) and
/// returns their set, for `sigwait`; `None` when the mask could not be changed.
pub(crate) fn block(signals: &[libc::c_int]) -> Option<libc::sigset_t> {
    // SAFETY: sigemptyset initialises the set it is given; sigaddset adds valid signals.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in signals {
            libc::sigaddset(&mut set, *sig);
        }
        set
    };
    // SAFETY: a valid, initialised set; the old mask is not needed.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
        return None;
    }
    Some(set)
}

/// Undoes [`block`] (when the thread that was to take the signals could not start).
pub(crate) fn unblock(set: &libc::sigset_t) {
    // SAFETY: a valid, initialised set; the old mask is not needed.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, set, std::ptr::null_mut()) };
}

/// Blocks the stop signals in this thread (call before any other thread starts, so all
/// inherit the mask) and starts the thread that cancels `token` on the first of them.
/// Returns what was received; `None` when the thread cannot be started (the signals then
/// keep their default action).
pub fn cancel_on_stop(token: CancelToken) -> Option<Received> {
    let set = block(&STOP)?;
    let received = Received::default();
    let seen = received.clone();
    let started = std::thread::Builder::new()
        .name("strata-signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` lives on this thread's stack for the call; `sig` is written.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            if seen
                .0
                .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                token.cancel();
            } else {
                // A second signal: stop waiting for the teardown.
                std::process::exit(128 + sig);
            }
        });
    if started.is_err() {
        unblock(&set);
        return None;
    }
    Some(received)
}
