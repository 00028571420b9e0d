//! Captured standard output and error: at most `limit` bytes per stream, streamed to the
//! caller's sink as they arrive; writing past the limit ends the run.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use sandbox_core::{OutputSink, Stream};
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// Largest write permit handed to the guest at once.
const PERMIT: usize = 64 << 10;

/// The error that ends a run whose output passed the limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutputLimitHit;

impl fmt::Display for OutputLimitHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("output limit reached")
    }
}

impl std::error::Error for OutputLimitHit {}

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    truncated: bool,
}

/// One captured stream; clones share the buffer.
#[derive(Clone)]
pub(crate) struct Capture {
    buffer: Arc<Mutex<Buffer>>,
    limit: usize,
    stream: Stream,
    sink: Option<Arc<dyn OutputSink>>,
}

impl Capture {
    pub(crate) fn new(stream: Stream, limit: u64, sink: Option<Arc<dyn OutputSink>>) -> Self {
        Capture {
            buffer: Arc::default(),
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            stream,
            sink,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        match self.buffer.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Appends what fits; `Err` when `data` did not fit entirely (the run must end).
    fn push(&self, data: &[u8]) -> Result<(), OutputLimitHit> {
        let (kept, overflow) = {
            let mut buf = self.lock();
            if buf.truncated {
                return Err(OutputLimitHit);
            }
            let room = self.limit.saturating_sub(buf.bytes.len());
            let take = room.min(data.len());
            buf.bytes.extend_from_slice(&data[..take]);
            let overflow = take < data.len();
            buf.truncated = overflow;
            (take, overflow)
        };
        if kept > 0 {
            if let Some(sink) = &self.sink {
                sink.on_output(self.stream, &data[..kept]);
            }
        }
        if overflow {
            Err(OutputLimitHit)
        } else {
            Ok(())
        }
    }

    /// The kept bytes and whether more was written than kept.
    pub(crate) fn take(&self) -> (Vec<u8>, bool) {
        let mut buf = self.lock();
        (std::mem::take(&mut buf.bytes), buf.truncated)
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(CaptureStream(self.clone()))
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for Capture {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(self.push(buf).map(|()| buf.len()).map_err(io::Error::other))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The WASI output-stream view of a [`Capture`].
struct CaptureStream(Capture);

#[wasmtime_wasi::async_trait]
impl Pollable for CaptureStream {
    async fn ready(&mut self) {}
}

impl OutputStream for CaptureStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.0
            .push(&bytes)
            .map_err(|hit| StreamError::Trap(wasmtime::Error::new(hit)))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(PERMIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_exactly_the_limit_and_flags_truncation() {
        let cap = Capture::new(Stream::Stdout, 5, None);
        assert!(cap.push(b"abc").is_ok());
        assert!(cap.push(b"defg").is_err());
        assert!(cap.push(b"h").is_err(), "stays closed after the limit");
        assert_eq!(cap.take(), (b"abcde".to_vec(), true));
    }

    #[test]
    fn sink_sees_only_kept_bytes() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        let sink: Arc<dyn OutputSink> = Arc::new(move |_: Stream, chunk: &[u8]| {
            s.lock().expect("lock").extend_from_slice(chunk);
        });
        let cap = Capture::new(Stream::Stderr, 4, Some(sink));
        let _ = cap.push(b"123456");
        assert_eq!(&*seen.lock().expect("lock"), b"1234");
    }
}
