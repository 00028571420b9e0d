//! Threads for the supervisor's blocking jobs (a client's connection, an exec's output
//! reader, a foreground exec's follower, a published port's relay), kept for reuse.
//!
//! A foreground exec into a warm sandbox needs three such jobs (four from the CLI, which
//! connects twice), and a new thread for each costs a `clone3`, a stack mapping and its
//! guard page, TLS and signal-stack setup and, at its end, the unmapping: measured here as
//! about a tenth of the exec's latency. Every job gets a thread at once (an idle one, else
//! a new one), because these jobs block for as long as a process runs or a client stays
//! connected: a fixed-size pool (or rayon, which is for CPU work) would make one exec wait
//! for another's end. At most [`MAX_IDLE`] threads wait for work, each for at most
//! [`IDLE`], so a supervisor that was busy once does not keep its threads.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// How long a thread without work waits for one before it ends.
pub const IDLE: Duration = Duration::from_secs(10);

/// At most this many threads wait for work; one more that runs out of work ends.
pub const MAX_IDLE: usize = 16;

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Threads waiting for a job.
    idle: usize,
}

struct Workers {
    queue: Mutex<Queue>,
    wake: Condvar,
}

fn workers() -> &'static Workers {
    static WORKERS: OnceLock<Workers> = OnceLock::new();
    WORKERS.get_or_init(Workers::new)
}

impl Workers {
    fn new() -> Workers {
        Workers {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        }
    }

    fn run(&'static self, job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let mut queue = self.lock();
        if queue.idle > queue.jobs.len() {
            queue.jobs.push_back(Box::new(job));
            drop(queue);
            self.wake.notify_one();
            return Ok(());
        }
        drop(queue);
        std::thread::Builder::new()
            .name("strata-live-worker".into())
            .spawn(move || {
                job();
                self.serve();
            })
            .map(drop)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A job never runs under this lock, so a poisoned one still holds a sound queue.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs jobs until none came for [`IDLE`] (or [`MAX_IDLE`] threads already wait).
    fn serve(&self) {
        let mut queue = self.lock();
        loop {
            if let Some(job) = queue.jobs.pop_front() {
                drop(queue);
                job();
                queue = self.lock();
                continue;
            }
            if queue.idle >= MAX_IDLE {
                return;
            }
            queue.idle += 1;
            let (woken, timeout) = self
                .wake
                .wait_timeout(queue, IDLE)
                .unwrap_or_else(|e| e.into_inner());
            queue = woken;
            queue.idle -= 1;
            if timeout.timed_out() && queue.jobs.is_empty() {
                return;
            }
        }
    }
}

/// Runs `job` on a thread of its own now: an idle one, else a new one.
///
/// # Errors
/// No idle thread and the OS refused a new one (`job` is dropped unrun).
pub fn run(job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    workers().run(job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A pool of the test's own (other tests' jobs would share the process's).
    fn pool() -> &'static Workers {
        Box::leak(Box::new(Workers::new()))
    }

    #[test]
    fn every_job_runs_at_once_even_while_others_block() {
        // Twice MAX_IDLE jobs that each block until all have started: a pool that made a job
        // wait for a thread would never let them all start.
        let workers = pool();
        let count = 2 * MAX_IDLE;
        let (started, all_started) = mpsc::channel();
        let gate = std::sync::Arc::new((Mutex::new(0usize), Condvar::new()));
        for _ in 0..count {
            let started = started.clone();
            let gate = std::sync::Arc::clone(&gate);
            workers
                .run(move || {
                    let (lock, cv) = &*gate;
                    let mut n = lock.lock().expect("gate");
                    *n += 1;
                    cv.notify_all();
                    while *n < count {
                        n = cv.wait(n).expect("gate");
                    }
                    started.send(()).expect("report");
                })
                .expect("a thread for the job");
        }
        for _ in 0..count {
            all_started
                .recv_timeout(Duration::from_secs(30))
                .expect("every job ran while the others blocked");
        }
    }

    #[test]
    fn a_finished_job_leaves_its_thread_for_the_next_one() {
        let workers = pool();
        let (tx, rx) = mpsc::channel();
        let first = tx.clone();
        workers
            .run(move || first.send(std::thread::current().id()).expect("send"))
            .expect("run");
        let a = rx.recv_timeout(Duration::from_secs(10)).expect("first job");
        // Give the thread time to go idle, then the next job must reuse it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while workers.lock().idle == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        workers
            .run(move || tx.send(std::thread::current().id()).expect("send"))
            .expect("run");
        let b = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("second job");
        assert_eq!(a, b, "the idle thread took the second job");
    }
}
