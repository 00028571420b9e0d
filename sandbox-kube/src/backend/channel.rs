//! The agent channel to a pod: an exec stream (kube-rs `AttachedProcess`) presented as the
//! agent's [`Carrier`], so a pod run is driven by exactly the code that drives a VM run, its
//! messages worded for the pod ([`Place::Pod`]).

use sandbox_core::SetupStage;
use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kube::api::AttachedProcess;
use sandbox_agent::{Carrier, Place};
use sandbox_core::{Error, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The most of the exec's standard error (the agent's own diagnostics) and status kept for
/// error messages: 4 KiB.
const TAIL: usize = 4096;

/// The host end of the channel, and the tasks that join it to the exec stream.
pub(crate) struct PodChannel {
    pod: String,
    host: Option<UnixStream>,
    ended: Arc<AtomicBool>,
    tail: Arc<Mutex<Vec<u8>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl PodChannel {
    /// Joins `attached` (an exec of the agent's `serve` mode with stdin, stdout and stderr)
    /// to a socket pair on `runtime`.
    ///
    /// # Errors
    /// [`Error::Setup`] when the socket pair cannot be made or the exec lacks a stream.
    pub(crate) fn open(
        runtime: &tokio::runtime::Handle,
        mut attached: AttachedProcess,
        pod: &str,
    ) -> Result<PodChannel> {
        let setup =
            |e: std::io::Error| Error::setup(SetupStage::AgentChannel, "cluster: agent channel", e);
        let missing = |what: &str| {
            setup(std::io::Error::new(
                ErrorKind::NotConnected,
                format!("the exec has no {what}"),
            ))
        };
        let (host, far) = UnixStream::pair().map_err(setup)?;
        far.set_nonblocking(true).map_err(setup)?;
        let _entered = runtime.enter();
        let far = tokio::net::UnixStream::from_std(far).map_err(setup)?;
        let (mut from_host, mut to_host) = far.into_split();
        let mut stdin = attached.stdin().ok_or_else(|| missing("stdin"))?;
        let mut stdout = attached.stdout().ok_or_else(|| missing("stdout"))?;
        let mut stderr = attached.stderr().ok_or_else(|| missing("stderr"))?;
        let status = attached.take_status();
        let ended = Arc::new(AtomicBool::new(false));
        let tail = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        tasks.push(runtime.spawn(async move {
            let _ = tokio::io::copy(&mut from_host, &mut stdin).await;
            let _ = stdin.shutdown().await;
        }));
        let flag = Arc::clone(&ended);
        tasks.push(runtime.spawn(async move {
            let _ = tokio::io::copy(&mut stdout, &mut to_host).await;
            let _ = to_host.shutdown().await;
            flag.store(true, Ordering::SeqCst);
        }));
        let kept = Arc::clone(&tail);
        tasks.push(runtime.spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                keep(&kept, &buf[..n]);
            }
        }));
        let kept = Arc::clone(&tail);
        tasks.push(runtime.spawn(async move {
            if let Some(status) = status {
                if let Some(status) = status.await {
                    let text = format!(
                        "exec ended: {} {}",
                        status.status.unwrap_or_default(),
                        status.message.unwrap_or_default()
                    );
                    keep(&kept, text.as_bytes());
                }
            }
            // The stream's own task ends with the exec; dropping the handle aborts it.
            let _ = attached.join().await;
        }));
        Ok(PodChannel {
            pod: pod.to_owned(),
            host: Some(host),
            ended,
            tail,
            tasks,
        })
    }
}

fn keep(tail: &Mutex<Vec<u8>>, bytes: &[u8]) {
    let mut tail = match tail.lock() {
        Ok(t) => t,
        Err(poisoned) => poisoned.into_inner(),
    };
    tail.extend_from_slice(bytes);
    let extra = tail.len().saturating_sub(TAIL);
    tail.drain(..extra);
}

impl Carrier for PodChannel {
    fn place(&self) -> Place {
        Place::Pod
    }

    fn channel(&self) -> std::io::Result<UnixStream> {
        match &self.host {
            Some(host) => host.try_clone(),
            None => Err(std::io::Error::new(
                ErrorKind::NotConnected,
                "the exec stream was closed",
            )),
        }
    }

    fn ended(&mut self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    fn diagnostics(&self) -> String {
        let tail = match self.tail.lock() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        format!(
            "pod {}: {}",
            self.pod,
            String::from_utf8_lossy(&tail).trim()
        )
    }

    fn teardown(&mut self) {
        self.host = None;
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Drop for PodChannel {
    fn drop(&mut self) {
        self.teardown();
    }
}
