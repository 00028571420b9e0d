//! The guest's standard input: the caps' bytes, then the context's stream
//! ([`sandbox_core::StdinSource`]) read asynchronously on the I/O runtime.
//!
//! The stream is switched to non-blocking and registered with tokio's reactor (a regular
//! file, which cannot be polled, is read directly: such reads never wait for a producer).
//! wasmtime-wasi's `AsyncStdinStream` reads it one chunk at a time into a one-slot channel,
//! and each read here is capped so that the chunks in flight stay within
//! [`STDIN_BUFFER`]. A guest blocked reading stdin is still cut by the run's deadline and
//! cancellation (they race the whole call), and dropping the stream at the end of the run
//! stops the reader task, restores the descriptor's flags and closes it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
use sandbox_core::{Error, Result, STDIN_BUFFER};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, Interest, ReadBuf};
use wasmtime_wasi::cli::AsyncStdinStream;

/// Largest single read from the stream. `AsyncStdinStream` holds up to three chunks at
/// once (being read, queued, handed to the guest), so this keeps them within
/// [`STDIN_BUFFER`].
const CHUNK: usize = STDIN_BUFFER / 4;

/// A descriptor switched to `O_NONBLOCK` while this value lives; dropping it restores the
/// flag (the open file description may be shared) and closes it.
struct NonBlocking {
    fd: OwnedFd,
    was_blocking: bool,
}

impl NonBlocking {
    fn new(fd: OwnedFd) -> io::Result<Self> {
        let flags = fcntl_getfl(&fd)?;
        let was_blocking = !flags.contains(OFlags::NONBLOCK);
        if was_blocking {
            fcntl_setfl(&fd, flags | OFlags::NONBLOCK)?;
        }
        Ok(NonBlocking { fd, was_blocking })
    }
}

impl AsRawFd for NonBlocking {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for NonBlocking {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for NonBlocking {
    fn drop(&mut self) {
        if self.was_blocking {
            if let Ok(flags) = fcntl_getfl(&self.fd) {
                let _ = fcntl_setfl(&self.fd, flags - OFlags::NONBLOCK);
            }
        }
    }
}

enum Source {
    Pollable(AsyncFd<NonBlocking>),
    /// A regular file: always readable, so read directly.
    File(NonBlocking),
}

/// `prefix`, then the stream until end of file.
struct Reader {
    prefix: Bytes,
    source: Option<Source>,
}

impl AsyncRead for Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let want = buf.remaining().min(CHUNK);
        let result = match &this.source {
            None => return Poll::Ready(Ok(())),
            Some(Source::Pollable(fd)) => loop {
                let mut guard = ready!(fd.poll_read_ready(cx))?;
                let unfilled = &mut buf.initialize_unfilled()[..want];
                match guard.try_io(|fd| read(fd.get_ref(), unfilled)) {
                    Ok(result) => break result,
                    Err(_would_block) => continue,
                }
            },
            Some(Source::File(fd)) => read(fd, &mut buf.initialize_unfilled()[..want]),
        };
        match result {
            Ok(n) => {
                buf.advance(n);
                if n == 0 {
                    // End of file: restore and close the descriptor now.
                    this.source = None;
                }
                Poll::Ready(Ok(()))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the stdin stream failed; ending the guest's input");
                this.source = None;
                Poll::Ready(Ok(()))
            }
        }
    }
}

fn read(fd: &NonBlocking, buf: &mut [u8]) -> io::Result<usize> {
    Ok(rustix::io::read(fd, buf)?)
}

/// Registers a descriptor with the current runtime's reactor, or hands it back when it
/// cannot be polled (a regular file).
#[allow(unsafe_code)]
fn register(fd: NonBlocking) -> std::result::Result<AsyncFd<NonBlocking>, NonBlocking> {
    // SAFETY: `NonBlocking` owns its descriptor, never replaces it, and returns the same one
    // from every `as_raw_fd` call; it stays open until the `AsyncFd` (which owns it) drops.
    match unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
        Ok(fd) => Ok(fd),
        Err(e) => Err(e.into_parts().0),
    }
}

/// The guest's stdin for `bytes` followed by `stream`. Must be called inside the I/O
/// runtime (the reader task is spawned there).
pub(crate) fn streamed(bytes: &[u8], stream: OwnedFd) -> Result<AsyncStdinStream> {
    let fd = NonBlocking::new(stream)
        .map_err(|e| Error::invalid(format!("the stdin stream cannot be read: {e}")))?;
    let source = match register(fd) {
        Ok(fd) => Source::Pollable(fd),
        Err(fd) => Source::File(fd),
    };
    Ok(AsyncStdinStream::new(Reader {
        prefix: Bytes::copy_from_slice(bytes),
        source: Some(source),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn reader_yields_prefix_then_stream_and_restores_blocking_mode() {
        let (r, w) = rustix::pipe::pipe().expect("pipe");
        rustix::io::write(&w, b" world").expect("write");
        drop(w);
        let probe = r.try_clone().expect("dup");
        let rt = runtime();
        let out = rt.block_on(async {
            let fd = NonBlocking::new(r).expect("nonblocking");
            assert!(fcntl_getfl(&probe)
                .expect("flags")
                .contains(OFlags::NONBLOCK));
            let mut reader = Reader {
                prefix: Bytes::from_static(b"hello"),
                source: Some(Source::Pollable(register(fd).ok().expect("pollable"))),
            };
            let mut out = Vec::new();
            reader.read_to_end(&mut out).await.expect("read");
            out
        });
        assert_eq!(out, b"hello world");
        assert!(!fcntl_getfl(&probe)
            .expect("flags")
            .contains(OFlags::NONBLOCK));
    }

    #[test]
    fn regular_files_are_read_without_the_reactor() {
        let mut file = tempfile::tempfile().expect("tempfile");
        std::io::Write::write_all(&mut file, b"from a file").expect("write");
        std::io::Seek::rewind(&mut file).expect("rewind");
        let rt = runtime();
        let out = rt.block_on(async {
            let fd = NonBlocking::new(file.into()).expect("nonblocking");
            let Err(fd) = register(fd) else {
                panic!("a regular file cannot be registered with epoll");
            };
            let mut reader = Reader {
                prefix: Bytes::new(),
                source: Some(Source::File(fd)),
            };
            let mut out = Vec::new();
            reader.read_to_end(&mut out).await.expect("read");
            out
        });
        assert_eq!(out, b"from a file");
    }
}
