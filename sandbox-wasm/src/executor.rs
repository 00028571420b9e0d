//! Drives a run's future on the calling thread. The WASI host code needs a tokio context
//! (timers, blocking file I/O, sockets); a one-worker tokio runtime per backend provides
//! it, while the run itself is polled right here with a parking waker. Unlike
//! `Runtime::block_on` this works from any thread, including one already inside another
//! tokio runtime (an embedder calling the blocking API from async code).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use tokio::runtime::Runtime;

/// Threads tokio may start for blocking WASI file I/O.
const MAX_BLOCKING_THREADS: usize = 8;

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// The I/O runtime of one backend.
pub(crate) struct Executor {
    runtime: Option<Runtime>,
}

impl Executor {
    pub(crate) fn new() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(MAX_BLOCKING_THREADS)
            .thread_name("strata-wasm-io")
            .enable_all()
            .build()?;
        Ok(Executor {
            runtime: Some(runtime),
        })
    }

    /// Runs `f` inside the I/O runtime's context (to register descriptors or spawn tasks on
    /// it).
    pub(crate) fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        let _context = self.runtime.as_ref().map(|rt| rt.handle().enter());
        f()
    }

    /// Polls `fut` to completion on this thread, parking between wake-ups.
    pub(crate) fn block_on<F: Future>(&self, fut: F) -> F::Output {
        let _context = self.runtime.as_ref().map(|rt| rt.handle().enter());
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut fut = pin!(fut);
        loop {
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return out;
            }
            std::thread::park();
        }
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        // Never blocks, so a backend may be dropped from async code.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn timers_fire_and_nesting_inside_another_runtime_works() {
        let exec = Executor::new().expect("executor");
        let start = Instant::now();
        exec.block_on(async { tokio::time::sleep(Duration::from_millis(10)).await });
        assert!(start.elapsed() >= Duration::from_millis(10));
        let outer = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("outer");
        let v = outer.block_on(async { exec.block_on(async { 7 }) });
        assert_eq!(v, 7);
    }
}
