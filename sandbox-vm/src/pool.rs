//! VMs restored ahead of time: a run without grants takes one that already runs and waits
//! for its hello, and a replacement is restored in the background. Every pooled VM is
//! restored from the snapshot and used by one run only.

use std::sync::{Arc, Mutex};

use crate::snapshot::Shape;
use crate::vmm::{VmConfig, VmInstance, Vmm};

/// A restored VM waiting for a run.
pub struct Pooled {
    /// The running VM.
    pub vm: Box<dyn VmInstance>,
    /// Its private directory (sockets), removed when the run ends.
    pub dir: sandbox_os::private::PrivateDir,
    /// What it was restored as.
    pub shape: Shape,
    /// The snapshot state it was restored from.
    pub state: std::path::PathBuf,
}

/// The idle VMs of one backend.
#[derive(Default)]
pub struct Pool {
    idle: Mutex<Vec<Pooled>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("idle", &self.len()).finish()
    }
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Pooled>> {
        match self.idle.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Idle VMs now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no VM is idle.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An idle VM of `shape` restored from `state`, if one is there and still running.
    pub fn take(&self, shape: Shape, state: &std::path::Path) -> Option<Pooled> {
        let mut idle = self.lock();
        while let Some(i) = idle
            .iter()
            .position(|p| p.shape == shape && p.state == state)
        {
            let mut pooled = idle.swap_remove(i);
            if !pooled.vm.ended() {
                return Some(pooled);
            }
        }
        None
    }

    /// Adds a VM.
    pub fn put(&self, pooled: Pooled) {
        self.lock().push(pooled);
    }

    /// The VMMs' process ids (for memory measurements).
    pub fn pids(&self) -> Vec<u32> {
        self.lock().iter().filter_map(|p| p.vm.pid()).collect()
    }

    /// Shuts every idle VM down.
    pub fn clear(&self) {
        let drained: Vec<Pooled> = self.lock().drain(..).collect();
        for mut pooled in drained {
            pooled.vm.teardown();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.clear();
    }
}

/// A thread that restores pooled VMs for one backend. It lives as long as the backend:
/// QEMU dies with the thread that started it (`--pdeathsig`), so pooled VMs must not be
/// started by a short-lived thread.
pub struct Keeper {
    jobs: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
}

/// Restores until the pool holds `target` VMs (or a restore fails), then signals `done`.
pub struct Job {
    /// One restore into the pool; `false` when it failed.
    pub restore_one: Box<dyn Fn() -> bool + Send>,
    /// How many VMs the pool should hold.
    pub target: usize,
    /// The pool.
    pub pool: Arc<Pool>,
    /// Told when the job is over.
    pub done: Option<std::sync::mpsc::Sender<()>>,
}

impl Default for Keeper {
    fn default() -> Self {
        Keeper {
            jobs: Mutex::new(None),
        }
    }
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keeper")
    }
}

impl Keeper {
    /// Queues `job` on the keeper thread (started on first use).
    pub fn submit(&self, job: Job) {
        let mut jobs = match self.jobs.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let sender = jobs.get_or_insert_with(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            let _ = std::thread::Builder::new()
                .name("strata-vm-pool".into())
                .spawn(move || {
                    for job in rx {
                        while job.pool.len() < job.target && (job.restore_one)() {}
                        if let Some(done) = job.done {
                            let _ = done.send(());
                        }
                    }
                });
            tx
        });
        let _ = sender.send(job);
    }
}

/// Restores one VM with `config` (made by `make_config` in a fresh private directory) and
/// waits until it runs; `None` when that fails (the next run restores its own).
pub fn restore(
    vmm: &Arc<dyn Vmm>,
    shape: Shape,
    ready_timeout: std::time::Duration,
    make_config: impl FnOnce(&std::path::Path) -> Option<VmConfig>,
) -> Option<Pooled> {
    let dir = crate::leftovers::run_dir().ok()?;
    let config = make_config(dir.path())?;
    let state = config.incoming.clone()?;
    let mut vm = vmm.start(&config).ok()?;
    vm.wait_running(std::time::Instant::now() + ready_timeout)
        .ok()?;
    Some(Pooled {
        vm,
        dir,
        shape,
        state,
    })
}
