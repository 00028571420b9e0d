//! A byte window per stream: a sender takes room before it sends, the receiver's
//! acknowledgements give it back, so at most a fixed number of bytes of one stream are in
//! flight (and in the receiver's queues) whatever the other streams on the channel do.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a waiting sender looks whether its stream is over.
const POLL: Duration = Duration::from_millis(200);

/// In-flight bytes per stream id, bounded by a limit.
#[derive(Debug)]
pub struct Window {
    limit: u64,
    in_flight: Mutex<HashMap<u64, u64>>,
    changed: Condvar,
}

impl Window {
    /// A window of `limit` bytes per stream.
    pub fn new(limit: u64) -> Self {
        Window {
            limit,
            in_flight: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, u64>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until stream `id` has fewer than the limit in flight, then counts `bytes`
    /// more; `false` (nothing counted) once `over` says the stream ended.
    pub fn take(&self, id: u64, bytes: u64, over: impl Fn() -> bool) -> bool {
        let mut map = self.lock();
        loop {
            if over() {
                return false;
            }
            let used = map.get(&id).copied().unwrap_or(0);
            if used < self.limit {
                map.insert(id, used + bytes);
                return true;
            }
            map = self
                .changed
                .wait_timeout(map, POLL)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// The receiver took `bytes` of stream `id`.
    pub fn give_back(&self, id: u64, bytes: u64) {
        if let Some(used) = self.lock().get_mut(&id) {
            *used = used.saturating_sub(bytes);
        }
        self.changed.notify_all();
    }

    /// Forgets stream `id` and wakes its waiting sender.
    pub fn forget(&self, id: u64) {
        self.lock().remove(&id);
        self.changed.notify_all();
    }

    /// Wakes waiting senders (to look at their `over` again).
    pub fn wake(&self) {
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_sender_waits_at_the_limit_until_bytes_are_given_back() {
        let window = Arc::new(Window::new(10));
        assert!(window.take(1, 10, || false));
        let taken = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (window, taken) = (Arc::clone(&window), Arc::clone(&taken));
            std::thread::spawn(move || {
                assert!(window.take(1, 4, || false));
                taken.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!taken.load(Ordering::SeqCst), "the window is full");
        // Another stream is not held up.
        assert!(window.take(2, 10, || false));
        window.give_back(1, 3);
        waiter.join().expect("waiter");
        assert!(taken.load(Ordering::SeqCst));
    }

    #[test]
    fn a_sender_of_an_ended_stream_stops_waiting() {
        let window = Window::new(1);
        assert!(window.take(7, 1, || false));
        assert!(!window.take(7, 1, || true));
    }
}
