//! Connections to guest ports for a live sandbox's published ports: each is a TCP
//! connection to `127.0.0.1:PORT` in the guest, its bytes carried over the channel in both
//! directions with a [`Window`] each way (the host acknowledges what it delivered, the
//! agent what it wrote), so a slow reader on one side holds up only its own connection.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use sandbox_agent::protocol::{AgentMsg, CHUNK, CONN_WINDOW};
use sandbox_agent::window::Window;

use crate::{send, Port};

/// How long a connection inside may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The open connections.
pub(crate) struct Conns {
    writers: Mutex<HashMap<u64, SyncSender<Vec<u8>>>>,
    /// Bytes sent to the host and not yet delivered there, per connection (the host
    /// acknowledges bytes it could not deliver too, so a sender never waits on a
    /// connection the host dropped).
    window: Window,
    /// The host went away: every sender stops.
    closing: AtomicBool,
}

impl Default for Conns {
    fn default() -> Self {
        Conns {
            writers: Mutex::new(HashMap::new()),
            window: Window::new(CONN_WINDOW),
            closing: AtomicBool::new(false),
        }
    }
}

impl Conns {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, SyncSender<Vec<u8>>>> {
        self.writers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens connection `id` to `port` on a thread of its own; answers
    /// [`AgentMsg::Connected`] or [`AgentMsg::ConnectFailed`].
    pub(crate) fn open(self: &Arc<Self>, port: &Port, id: u64, guest_port: u16) {
        let (conns, port) = (Arc::clone(self), Arc::clone(port));
        thread::spawn(move || {
            let addr = SocketAddr::from(([127, 0, 0, 1], guest_port));
            let stream = match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(stream) => stream,
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(libc::ECONNREFUSED);
                    send(&port, &AgentMsg::ConnectFailed { id, errno });
                    return;
                }
            };
            let Ok(mut writer) = stream.try_clone() else {
                send(
                    &port,
                    &AgentMsg::ConnectFailed {
                        id,
                        errno: libc::EMFILE,
                    },
                );
                return;
            };
            // The host's window bounds what it sends; the queue holds at most that.
            let (queue, queued) = mpsc::sync_channel::<Vec<u8>>(64);
            conns.lock().insert(id, queue);
            send(&port, &AgentMsg::Connected { id });
            {
                let port = Arc::clone(&port);
                thread::spawn(move || {
                    for chunk in queued {
                        if writer.write_all(&chunk).is_err() {
                            break;
                        }
                        let bytes = chunk.len() as u64;
                        send(&port, &AgentMsg::ConnTaken { id, bytes });
                    }
                    let _ = writer.shutdown(Shutdown::Write);
                });
            }
            conns.pump(&port, id, stream);
        });
    }

    /// Sends what the guest side writes until it ends, then forgets the connection.
    fn pump(&self, port: &Port, id: u64, mut stream: TcpStream) {
        let mut buf = vec![0u8; CHUNK / 4];
        loop {
            let n = match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !self
                .window
                .take(id, n as u64, || self.closing.load(Ordering::SeqCst))
            {
                break;
            }
            let data = buf[..n].to_vec();
            send(port, &AgentMsg::ConnData { id, data });
        }
        send(port, &AgentMsg::ConnEnd { id });
        self.window.forget(id);
    }

    /// Queues the host's bytes for connection `id`.
    pub(crate) fn data(&self, id: u64, data: Vec<u8>) {
        let queue = self.lock().get(&id).cloned();
        if let Some(queue) = queue {
            let _ = queue.send(data);
        }
    }

    /// The host sends no more on connection `id`: its guest side is half-closed once the
    /// queue is written, and the connection forgotten.
    pub(crate) fn end(&self, id: u64) {
        self.lock().remove(&id);
        self.window.wake();
    }

    /// The host delivered `bytes` of connection `id`.
    pub(crate) fn taken(&self, id: u64, bytes: u64) {
        self.window.give_back(id, bytes);
    }

    /// Ends every connection (the host went away).
    pub(crate) fn close_all(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.lock().clear();
        self.window.wake();
    }
}
