//! The pods: a private directory and one local process per started `Sandbox`.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::process::{self, Streams};
use super::FakePod;

/// Called once when a pod's process ends by itself: namespace, name, how it ended.
pub(crate) type OnExit = Box<dyn FnOnce(String, String, String) + Send>;

struct Entry {
    uid: String,
    dir: PathBuf,
    pid: Option<u32>,
    running: Arc<Mutex<bool>>,
    failure: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<()>>,
}

/// What became of a start.
pub(crate) enum Started {
    /// The process runs (or ran: see [`Pods::running`]).
    Running,
    /// It could not be started: why.
    Failed(String),
}

/// Every pod the server started, by namespace and name.
pub(crate) struct Pods {
    root: PathBuf,
    map: Mutex<BTreeMap<(String, String), Entry>>,
}

impl Pods {
    pub fn new(root: PathBuf) -> Pods {
        Pods {
            root,
            map: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, String), Entry>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the pod of sandbox `uid` was already started (or its start failed): the
    /// outcome then, `None` when never tried.
    pub fn outcome(&self, ns: &str, name: &str, uid: &str) -> Option<Started> {
        let map = self.lock();
        let entry = map.get(&(ns.to_owned(), name.to_owned()))?;
        if entry.uid != uid {
            return None;
        }
        Some(match &entry.failure {
            Some(f) => Started::Failed(f.clone()),
            None => Started::Running,
        })
    }

    /// Whether the pod runs a live process.
    pub fn running(&self, ns: &str, name: &str) -> Option<PathBuf> {
        let map = self.lock();
        let entry = map.get(&(ns.to_owned(), name.to_owned()))?;
        let alive = *entry.running.lock().unwrap_or_else(|p| p.into_inner());
        alive.then(|| entry.dir.clone())
    }

    /// Starts the pod of sandbox `ns/name` (uid `uid`): a fresh 0700 directory and
    /// `command` in it. Must run inside the server's runtime.
    pub fn start(
        &self,
        commands: &BTreeMap<String, PathBuf>,
        ns: &str,
        name: &str,
        uid: &str,
        command: &[String],
        on_exit: OnExit,
    ) -> Started {
        let dir = self.root.join(ns).join(format!("{name}-{uid}"));
        let mut entry = Entry {
            uid: uid.to_owned(),
            dir: dir.clone(),
            pid: None,
            running: Arc::new(Mutex::new(false)),
            failure: None,
            stop: None,
            done: None,
        };
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot make the pod directory {}: {e}", dir.display()));
        let streams = Streams {
            stdin: false,
            stdout: false,
            stderr: false,
        };
        let spawned = made.and_then(|()| process::spawn(commands, command, &dir, &streams));
        let outcome = match spawned {
            Err(why) => {
                let _ = std::fs::remove_dir_all(&dir);
                entry.failure = Some(why.clone());
                Started::Failed(why)
            }
            Ok(mut child) => {
                let pid = child.id();
                entry.pid = pid;
                *entry.running.lock().unwrap_or_else(|p| p.into_inner()) = true;
                let (stop_tx, mut stop_rx) = oneshot::channel();
                let (done_tx, done_rx) = oneshot::channel();
                entry.stop = Some(stop_tx);
                entry.done = Some(done_rx);
                let running = entry.running.clone();
                let (ns, name, dir) = (ns.to_owned(), name.to_owned(), dir.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        status = child.wait() => {
                            *running.lock().unwrap_or_else(|p| p.into_inner()) = false;
                            let how = match status {
                                Ok(s) => format!("the container's process ended: {s}"),
                                Err(e) => format!("cannot wait for the container's process: {e}"),
                            };
                            on_exit(ns, name, how);
                            // Stay until stopped (or the server goes): the directory too.
                            let _ = stop_rx.await;
                        }
                        _ = &mut stop_rx => {}
                    }
                    process::kill_group(pid);
                    let _ = child.wait().await;
                    *running.lock().unwrap_or_else(|p| p.into_inner()) = false;
                    let _ = std::fs::remove_dir_all(&dir);
                    let _ = done_tx.send(());
                });
                Started::Running
            }
        };
        let replaced = self.lock().insert((ns.to_owned(), name.to_owned()), entry);
        if let Some(old) = replaced {
            // A sandbox of the same name but another uid whose pod was never stopped.
            tokio::spawn(finish(old));
        }
        outcome
    }

    /// Stops the pod `ns/name`: kills its process group, waits for the process and removes
    /// its directory. Nothing to do when there is no such pod.
    pub async fn stop(&self, ns: &str, name: &str) {
        let entry = self.lock().remove(&(ns.to_owned(), name.to_owned()));
        if let Some(entry) = entry {
            finish(entry).await;
        }
    }

    /// Stops every pod.
    pub async fn stop_all(&self) {
        let all = std::mem::take(&mut *self.lock());
        for entry in all.into_values() {
            finish(entry).await;
        }
    }

    /// The pods, for assertions.
    pub fn list(&self) -> Vec<FakePod> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.failure.is_none())
            .map(|((ns, name), e)| FakePod {
                namespace: ns.clone(),
                name: name.clone(),
                dir: e.dir.clone(),
                pid: e.pid,
                running: *e.running.lock().unwrap_or_else(|p| p.into_inner()),
            })
            .collect()
    }
}

async fn finish(mut entry: Entry) {
    if let Some(stop) = entry.stop.take() {
        let _ = stop.send(());
    }
    match entry.done.take() {
        // The waiter kills, reaps and removes the directory.
        Some(done) => {
            let _ = done.await;
        }
        None => {
            let _ = std::fs::remove_dir_all(&entry.dir);
        }
    }
}
