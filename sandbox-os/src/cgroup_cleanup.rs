//! Removing run cgroups without making the caller wait, and sweeping those a dead
//! embedder left behind.
//!
//! `rmdir` of a cgroup can block for milliseconds (the kernel waits for an RCU grace period
//! while another thread holds the cgroup lock, e.g. a warm-pool refill creating the next
//! cgroup). A run's processes are all dead and reaped before its cgroup is handed over
//! here, so nothing of the run is alive; only the empty directories remain, and a
//! background thread removes them. [`flush`] waits for that (the process backend calls it
//! when dropped), and [`sweep_stale`] removes empty run cgroups whose embedding process no
//! longer exists (it was SIGKILLed, or exited before the thread was done).

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long removal retries while the kernel releases the last task of a cgroup.
const RETRY_FOR: Duration = Duration::from_millis(200);

/// One piece of background work.
enum Job {
    /// Remove these cgroup directories.
    Remove(Vec<PathBuf>),
    /// Tear down what a finished run left: reap its helper, drop its cgroup.
    Teardown(Box<dyn FnOnce() + Send>),
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Job>,
    /// Batches queued or being removed.
    unfinished: usize,
}

struct Janitor {
    queue: Mutex<Queue>,
    work: Condvar,
    done: Condvar,
}

fn janitor() -> Option<&'static Janitor> {
    static JANITOR: OnceLock<Option<&'static Janitor>> = OnceLock::new();
    *JANITOR.get_or_init(|| {
        let janitor: &'static Janitor = Box::leak(Box::new(Janitor {
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            done: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("strata-cgroup-cleanup".into())
            .spawn(move || janitor.serve())
            .ok()
            .map(|_| janitor)
    })
}

impl Janitor {
    fn serve(&self) {
        loop {
            let batch = {
                let mut queue = lock(&self.queue);
                loop {
                    if let Some(batch) = queue.pending.pop_front() {
                        break batch;
                    }
                    queue = self
                        .work
                        .wait(queue)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            };
            match batch {
                Job::Remove(dirs) => remove_now(&dirs),
                Job::Teardown(work) => work(),
            }
            let mut queue = lock(&self.queue);
            queue.unfinished = queue.unfinished.saturating_sub(1);
            if queue.unfinished == 0 {
                self.done.notify_all();
            }
        }
    }
}

/// Removes `dirs` (deepest last in the list is removed first) on the cleanup thread. Falls
/// back to removing them now if that thread could not be started.
pub fn remove_later(dirs: Vec<PathBuf>) {
    if dirs.is_empty() {
        return;
    }
    if let Err(Job::Remove(dirs)) = queue(Job::Remove(dirs)) {
        remove_now(&dirs);
    }
}

/// Runs `work` on the cleanup thread: a finished run's teardown (killing and reaping its
/// helper, removing its cgroup) after its result went back to the caller. Runs it now if
/// that thread could not be started. [`flush`] waits for it too.
pub fn teardown_later(work: impl FnOnce() + Send + 'static) {
    if let Err(Job::Teardown(work)) = queue(Job::Teardown(Box::new(work))) {
        work();
    }
}

fn queue(job: Job) -> Result<(), Job> {
    let Some(janitor) = janitor() else {
        return Err(job);
    };
    let mut queue = lock(&janitor.queue);
    queue.pending.push_back(job);
    queue.unfinished += 1;
    janitor.work.notify_one();
    Ok(())
}

/// Waits until every cgroup handed to [`remove_later`] is removed and every
/// [`teardown_later`] has run, at most `timeout`.
/// Returns whether the queue is empty.
pub fn flush(timeout: Duration) -> bool {
    let Some(janitor) = janitor() else {
        return true;
    };
    let queue = lock(&janitor.queue);
    let (queue, _) = janitor
        .done
        .wait_timeout_while(queue, timeout, |q| q.unfinished > 0)
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    queue.unfinished == 0
}

/// Removes `dirs` in reverse order, retrying briefly while a cgroup is still busy.
pub fn remove_now(dirs: &[PathBuf]) {
    for dir in dirs.iter().rev() {
        let until = Instant::now() + RETRY_FOR;
        loop {
            match fs::remove_dir(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove run cgroup");
                    break;
                }
            }
        }
    }
}

/// Removes the empty `run-PID-N` and `probe-PID-N` cgroups under each base whose PID is
/// not a live process. Cgroups with processes inside are never touched (`rmdir` refuses
/// them), so a sandbox that is still running is never disturbed. Returns how many it removed.
pub fn sweep_stale(bases: &[&Path]) -> usize {
    let mut removed = 0;
    for base in bases {
        let Ok(entries) = fs::read_dir(base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = owner_pid(&name.to_string_lossy()) else {
                continue;
            };
            if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            if fs::remove_dir(entry.path()).is_ok() {
                removed += 1;
            }
        }
    }
    if removed > 0 {
        tracing::debug!(removed, "swept run cgroups left by exited embedders");
    }
    removed
}

/// The embedder's PID in a run or probe cgroup's name.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("run-")
        .or_else(|| name.strip_prefix("probe-"))?;
    let (pid, serial) = rest.split_once('-')?;
    serial.parse::<u64>().ok()?;
    pid.parse().ok()
}

fn lock(m: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_run_and_probe_names_have_owners() {
        assert_eq!(owner_pid("run-123-4"), Some(123));
        assert_eq!(owner_pid("probe-9-0"), Some(9));
        for other in ["run-123", "run-x-1", "user.slice", "run-1-2-3", "strata"] {
            assert_eq!(owner_pid(other), None, "{other}");
        }
    }

    #[test]
    fn sweep_removes_empty_dirs_of_dead_owners_only() {
        let base = tempfile::tempdir().expect("tempdir");
        let dead = base.path().join("run-4194304-1"); // above the kernel's pid_max limit
        let mine = base.path().join(format!("run-{}-1", std::process::id()));
        let other = base.path().join("workload");
        for d in [&dead, &mine, &other] {
            fs::create_dir(d).expect("mkdir");
        }
        assert_eq!(sweep_stale(&[base.path()]), 1);
        assert!(!dead.exists() && mine.exists() && other.exists());
    }

    #[test]
    fn queued_removals_are_done_by_flush() {
        let base = tempfile::tempdir().expect("tempdir");
        let outer = base.path().join("run-1-1");
        let inner = outer.join("nested");
        fs::create_dir_all(&inner).expect("mkdir");
        remove_later(vec![outer.clone(), inner]);
        assert!(flush(Duration::from_secs(5)));
        assert!(!outer.exists());
    }
}
