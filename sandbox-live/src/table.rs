//! The supervisor's table of a sandbox's processes: what each exec ran, its output ring,
//! its stdin, how it ended. Shared by the event loop (which learns of starts and exits from
//! init), the output readers and the client connections, behind one mutex with one condition
//! variable that every change notifies.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use std::os::fd::OwnedFd;

use crate::protocol::{ExitInfo, ProcessInfo, ProcessState, PublishedPort};
use crate::ring::{Ring, DEFAULT_RING_BYTES};

/// Most processes a sandbox keeps in its table: 256 (running ones are never dropped; the
/// oldest exited ones go first, with their output).
pub const MAX_PROCESSES: usize = 256;

/// After its main process exited, how long an exec's output may stay open (held by a
/// process it left running) before readers stop waiting for it: 200 ms.
pub const OUTPUT_GRACE: Duration = Duration::from_millis(200);

/// One exec, from the request until the table forgets it.
#[derive(Debug)]
pub struct Proc {
    /// What was executed.
    pub argv: Vec<String>,
    /// Its output.
    pub ring: Ring,
    /// Its stdin, while open (only for execs started with `stdin` or `tty`).
    pub stdin: Option<File>,
    /// Its terminal's master, for an exec started with `tty` (to resize it).
    pub terminal: Option<OwnedFd>,
    /// How it ended, once init reported it.
    pub exit: Option<ExitInfo>,
    /// Its output pipes are still open (a process that exited may still have output in
    /// flight, or children holding the pipes).
    pub output_open: bool,
    /// When its per-exec timeout kills it.
    pub deadline: Option<Instant>,
    /// Its timeout killed it.
    pub timed_out: bool,
    /// When init reported its exit.
    pub exited_at: Option<Instant>,
    /// Order of start, for eviction.
    started: u64,
}

impl Proc {
    fn info(&self, pid: i32) -> ProcessInfo {
        ProcessInfo {
            pid,
            argv: self.argv.clone(),
            state: if self.exit.is_some() {
                ProcessState::Exited
            } else {
                ProcessState::Running
            },
            exit_code: self.exit.and_then(|e| e.exit_code),
            signal: self.exit.and_then(|e| e.signal),
            timed_out: self.timed_out,
        }
    }

    /// Done for a reader: exited, and its output closed or (held open by a process it
    /// left running) quiet for [`OUTPUT_GRACE`] since.
    pub fn finished(&self) -> bool {
        self.exit.is_some()
            && (!self.output_open || self.exited_at.is_some_and(|t| t.elapsed() >= OUTPUT_GRACE))
    }
}

/// An exec asked for but not yet answered by init.
#[derive(Debug)]
pub struct Pending {
    /// What is being executed.
    pub argv: Vec<String>,
    /// The host's end of its stdin, when kept open.
    pub stdin: Option<File>,
    /// Its terminal's master, for a `tty` exec.
    pub terminal: Option<OwnedFd>,
    /// Its per-exec timeout.
    pub timeout: Option<Duration>,
    /// Init's answer: the pid, or the error.
    pub answer: Option<Result<i32, sandbox_core::Error>>,
}

/// Everything the supervisor knows about the sandbox's processes.
#[derive(Debug, Default)]
pub struct Table {
    /// Execs by pid.
    pub procs: BTreeMap<i32, Proc>,
    /// Execs waiting for init's answer, by request id.
    pub pending: HashMap<u64, Pending>,
    /// The sandbox has stopped: nothing new starts, every waiter returns.
    pub stopped: bool,
    /// Clients currently attached to a stream (a sandbox with one is not idle).
    pub attached: usize,
    /// The last request from any client.
    pub last_activity: Option<Instant>,
    /// Clients waiting for the stop they asked for to be done.
    pub stop_waiters: usize,
    /// Since when the sandbox is paused, while it is.
    pub paused_since: Option<Instant>,
    /// How long it was paused before, in all.
    pub paused_for: Duration,
    /// It was paused by its idle pause (not by a client): the next request that needs it
    /// running resumes it.
    pub auto_paused: bool,
    /// Connections into the sandbox (published ports) waiting for init, by request id:
    /// `None` until init answers with the socket or an OS error number.
    pub connecting: HashMap<u64, Option<Result<OwnedFd, i32>>>,
    /// Connections being forwarded now.
    pub forwarding: usize,
    /// Published ports.
    pub ports: Vec<PublishedPort>,
    /// Their listeners, shut down when the sandbox stops.
    pub listeners: Vec<std::net::TcpListener>,
    next_id: u64,
    starts: u64,
}

impl Table {
    /// A fresh request id.
    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Init started `id` as `pid`: the pending exec becomes a process.
    pub fn started(&mut self, id: u64, pid: i32) {
        let Some(pending) = self.pending.get_mut(&id) else {
            return;
        };
        pending.answer = Some(Ok(pid));
        self.starts += 1;
        let proc = Proc {
            argv: pending.argv.clone(),
            ring: Ring::new(DEFAULT_RING_BYTES),
            stdin: pending.stdin.take(),
            terminal: pending.terminal.take(),
            exit: None,
            output_open: true,
            deadline: pending.timeout.map(|t| Instant::now() + t),
            timed_out: false,
            exited_at: None,
            started: self.starts,
        };
        self.procs.insert(pid, proc);
        self.evict();
    }

    /// Init reported that `pid` ended with `wait_status`.
    pub fn exited(&mut self, pid: i32, wait_status: i32) {
        if let Some(proc) = self.procs.get_mut(&pid) {
            let (exit_code, signal) = if libc::WIFEXITED(wait_status) {
                (Some(libc::WEXITSTATUS(wait_status)), None)
            } else if libc::WIFSIGNALED(wait_status) {
                (None, Some(libc::WTERMSIG(wait_status)))
            } else {
                (None, None)
            };
            proc.stdin = None;
            proc.deadline = None;
            proc.exited_at = Some(Instant::now());
            proc.exit = Some(ExitInfo {
                pid,
                exit_code,
                signal,
                timed_out: proc.timed_out,
            });
        }
    }

    /// How long the sandbox has been paused in all, up to `now`.
    pub fn paused_total(&self, now: Instant) -> Duration {
        self.paused_for
            + self
                .paused_since
                .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }

    /// The sandbox resumed at `now`: the pause stops counting against its clocks, and
    /// every exec's timeout moves by how long it was paused.
    pub fn resumed(&mut self, now: Instant) {
        let Some(since) = self.paused_since.take() else {
            return;
        };
        let pause = now.saturating_duration_since(since);
        self.paused_for += pause;
        for proc in self.procs.values_mut() {
            if let Some(deadline) = &mut proc.deadline {
                *deadline += pause;
            }
        }
        self.last_activity = Some(now);
    }

    /// The sandbox stopped: every process counts as killed, published ports close.
    pub fn stop(&mut self) {
        self.stopped = true;
        for listener in self.listeners.drain(..) {
            let _ = rustix::net::shutdown(&listener, rustix::net::Shutdown::Both);
        }
        for (pid, proc) in &mut self.procs {
            proc.stdin = None;
            proc.output_open = false;
            if proc.exit.is_none() {
                proc.exit = Some(ExitInfo {
                    pid: *pid,
                    exit_code: None,
                    signal: Some(libc::SIGKILL),
                    timed_out: proc.timed_out,
                });
            }
        }
        for pending in self.pending.values_mut() {
            if pending.answer.is_none() {
                pending.answer = Some(Err(sandbox_core::Error::Cancelled));
            }
        }
    }

    /// `ps`.
    pub fn list(&self) -> Vec<ProcessInfo> {
        self.procs.iter().map(|(pid, p)| p.info(*pid)).collect()
    }

    /// Running processes.
    pub fn running(&self) -> usize {
        self.procs.values().filter(|p| p.exit.is_none()).count()
    }

    /// Drops the oldest exited processes beyond [`MAX_PROCESSES`].
    fn evict(&mut self) {
        while self.procs.len() > MAX_PROCESSES {
            let oldest = self
                .procs
                .iter()
                .filter(|(_, p)| p.finished())
                .min_by_key(|(_, p)| p.started)
                .map(|(pid, _)| *pid);
            match oldest {
                Some(pid) => {
                    self.procs.remove(&pid);
                }
                None => break,
            }
        }
    }
}

/// The table and its condition variable.
#[derive(Debug, Default)]
pub struct Shared {
    table: Mutex<Table>,
    changed: Condvar,
}

impl Shared {
    /// Locks the table (a poisoned lock is taken over: the table stays consistent per
    /// field, and the supervisor must keep serving to stop cleanly).
    pub fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every waiter.
    pub fn notify(&self) {
        self.changed.notify_all();
    }

    /// Waits (at most `timeout`) for a change.
    pub fn wait<'a>(
        &self,
        guard: MutexGuard<'a, Table>,
        timeout: Duration,
    ) -> MutexGuard<'a, Table> {
        match self.changed.wait_timeout(guard, timeout) {
            Ok((guard, _)) => guard,
            Err(e) => e.into_inner().0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(argv: &str) -> Pending {
        Pending {
            argv: vec![argv.into()],
            stdin: None,
            terminal: None,
            timeout: None,
            answer: None,
        }
    }

    #[test]
    fn an_exec_storm_keeps_the_table_bounded_but_never_drops_a_running_process() {
        let mut table = Table::default();
        for n in 0..(MAX_PROCESSES as i32 + 50) {
            let id = table.next_id();
            table.pending.insert(id, pending("x"));
            table.started(id, n + 2);
            if n >= 10 {
                table.exited(n + 2, 0);
                if let Some(p) = table.procs.get_mut(&(n + 2)) {
                    p.output_open = false;
                }
            }
        }
        assert!(table.procs.len() <= MAX_PROCESSES);
        for pid in 2..12 {
            assert!(table.procs.contains_key(&pid), "running {pid} kept");
        }
    }

    #[test]
    fn a_stopped_table_reports_every_process_as_killed() {
        let mut table = Table::default();
        let id = table.next_id();
        table.pending.insert(id, pending("sleep"));
        table.started(id, 5);
        table.stop();
        let list = table.list();
        assert_eq!(list[0].state, ProcessState::Exited);
        assert_eq!(list[0].signal, Some(libc::SIGKILL));
    }
}
