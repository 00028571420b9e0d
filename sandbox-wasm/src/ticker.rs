//! The epoch ticker: one thread per backend that increments the engine's epoch every tick
//! while runs are active (so running code checks its wall-clock, CPU and cancellation
//! limits) and fires the alarms of runs blocked in host calls. It parks after a short idle
//! period, so an idle backend costs nothing and back-to-back runs never wait for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime::Engine;

/// Idle ticks before the ticker parks.
const IDLE_TICKS: u32 = 100;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// A deadline the ticker wakes.
struct Alarm {
    deadline: Instant,
    waker: Mutex<Option<Waker>>,
}

struct Shared {
    active: AtomicUsize,
    parked: AtomicBool,
    stop: AtomicBool,
    alarms: Mutex<Vec<Arc<Alarm>>>,
}

/// The ticker of one engine.
pub(crate) struct Ticker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    pub(crate) fn start(engine: Engine, tick: Duration) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            active: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            alarms: Mutex::default(),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("strata-wasm-epoch".into())
            .spawn(move || tick_loop(&s, &engine, tick))?;
        Ok(Ticker {
            shared,
            thread: Some(thread),
        })
    }

    /// Marks a run as active until the guard drops.
    pub(crate) fn active(&self) -> Active<'_> {
        self.shared.active.fetch_add(1, Ordering::SeqCst);
        if self.shared.parked.load(Ordering::SeqCst) {
            if let Some(t) = &self.thread {
                t.thread().unpark();
            }
        }
        Active(self)
    }
}

fn tick_loop(s: &Shared, engine: &Engine, tick: Duration) {
    let mut idle = 0;
    loop {
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        if s.active.load(Ordering::SeqCst) == 0 {
            idle += 1;
            if idle >= IDLE_TICKS {
                s.parked.store(true, Ordering::SeqCst);
                // Re-check after publishing `parked`, so a run that started meanwhile
                // either sees the flag and unparks us or is seen here.
                if s.active.load(Ordering::SeqCst) == 0 && !s.stop.load(Ordering::SeqCst) {
                    std::thread::park();
                }
                s.parked.store(false, Ordering::SeqCst);
                idle = 0;
                continue;
            }
        } else {
            idle = 0;
        }
        std::thread::sleep(tick);
        engine.increment_epoch();
        let now = Instant::now();
        for alarm in lock(&s.alarms).iter() {
            if now >= alarm.deadline {
                if let Some(w) = lock(&alarm.waker).take() {
                    w.wake();
                }
            }
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        // The thread sees `stop` within a tick and exits; not joining keeps dropping a
        // backend from waiting for its sleep.
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
        }
    }
}

/// An active run; keeps the ticker ticking.
pub(crate) struct Active<'a>(&'a Ticker);

impl Active<'_> {
    /// A future that completes at `deadline` (to within a tick), woken by the ticker.
    pub(crate) fn alarm(&self, deadline: Instant) -> AlarmFuture {
        let alarm = Arc::new(Alarm {
            deadline,
            waker: Mutex::new(None),
        });
        lock(&self.0.shared.alarms).push(Arc::clone(&alarm));
        AlarmFuture {
            alarm,
            shared: Arc::clone(&self.0.shared),
        }
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.shared.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Completes at its deadline; unregisters itself when dropped.
pub(crate) struct AlarmFuture {
    alarm: Arc<Alarm>,
    shared: Arc<Shared>,
}

impl Future for AlarmFuture {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.alarm.deadline {
            return Poll::Ready(());
        }
        *lock(&self.alarm.waker) = Some(cx.waker().clone());
        // The ticker may have fired between the check and the registration.
        if Instant::now() >= self.alarm.deadline {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for AlarmFuture {
    fn drop(&mut self) {
        let mut alarms = lock(&self.shared.alarms);
        if let Some(i) = alarms.iter().position(|a| Arc::ptr_eq(a, &self.alarm)) {
            alarms.swap_remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarm_fires_through_the_ticker() {
        let engine = Engine::default();
        let ticker = Ticker::start(engine, Duration::from_millis(1)).expect("ticker");
        let active = ticker.active();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let start = Instant::now();
        rt.block_on(active.alarm(start + Duration::from_millis(20)));
        assert!(start.elapsed() >= Duration::from_millis(20));
        drop(active);
        assert!(lock(&ticker.shared.alarms).is_empty());
    }
}
