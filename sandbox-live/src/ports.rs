//! Published ports: a listener on the host whose connections reach one TCP port inside
//! the sandbox, and nothing else of it.
//!
//! The supervisor never enters the sandbox's network namespace. For each connection it
//! accepts, it asks the sandbox's init (which lives in that namespace) to open a connection
//! to `127.0.0.1:<guest port>`; init hands the socket back over the sandbox's channel, and
//! the supervisor copies bytes both ways. So the published port is the only address of the
//! sandbox the host can reach, and publishing changes nothing of the sandbox's own
//! network: its egress stays what its caps say (none, by default).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use sandbox_core::Error;

use crate::protocol::{PublishRequest, PublishedPort};
use crate::server::Context;

/// Most ports one sandbox publishes: 32.
pub const MAX_PORTS: usize = 32;

/// Most connections forwarded into one sandbox at once: 256 (more are closed at accept).
pub const MAX_FORWARDED: usize = 256;

/// How long a connection into the sandbox may take to open (init's answer, then the TCP
/// handshake on its loopback): 10 s. A paused sandbox answers once resumed.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Listens on the host as `request` asks and forwards every connection to
/// `127.0.0.1:guest_port` inside the sandbox.
///
/// # Errors
/// As [`bind`]; also when the sandbox already publishes [`MAX_PORTS`] ports or stopped.
pub(crate) fn publish(
    context: &Arc<Context>,
    request: &PublishRequest,
) -> Result<PublishedPort, Error> {
    {
        let table = context.table.lock();
        if table.stopped {
            return Err(Error::invalid("the sandbox has stopped"));
        }
        if table.ports.len() >= MAX_PORTS {
            return Err(Error::invalid(format!(
                "publish: the sandbox already publishes {MAX_PORTS} ports"
            )));
        }
    }
    let (listener, port) = bind(request)?;
    serve(context, listener, port.clone())?;
    Ok(port)
}

/// Binds the host side of `request` (default `127.0.0.1`, a port the kernel chooses).
///
/// # Errors
/// [`Error::InvalidRequest`] for port 0 inside or a host address that cannot be listened
/// on (in use, not this machine's).
pub fn bind(request: &PublishRequest) -> Result<(TcpListener, PublishedPort), Error> {
    if request.guest_port == 0 {
        return Err(Error::invalid("publish: the port inside cannot be 0"));
    }
    let host_ip = request.host_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let host_port = request.host_port.unwrap_or(0);
    let listener = TcpListener::bind((host_ip, host_port)).map_err(|e| {
        Error::invalid(format!(
            "publish: cannot listen on {host_ip}:{host_port} on the host: {e}"
        ))
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::internal("publish: read the bound address", e))?;
    let port = PublishedPort {
        host_ip,
        host_port: bound.port(),
        guest_port: request.guest_port,
    };
    Ok((listener, port))
}

/// Forwards the connections `listener` accepts to `port.guest_port` inside, until the
/// sandbox stops.
///
/// # Errors
/// The sandbox stopped, or no thread could be started.
pub(crate) fn serve(
    context: &Arc<Context>,
    listener: TcpListener,
    port: PublishedPort,
) -> Result<(), Error> {
    let shutdown_handle = listener
        .try_clone()
        .map_err(|e| Error::internal("publish: clone the listener", e))?;
    {
        let mut table = context.table.lock();
        if table.stopped {
            return Err(Error::invalid("the sandbox has stopped"));
        }
        table.ports.push(port.clone());
        table.listeners.push(shutdown_handle);
    }
    let guest_port = port.guest_port;
    let context = Arc::clone(context);
    std::thread::Builder::new()
        .name("strata-live-port".into())
        .spawn(move || accept(&context, &listener, guest_port))
        .map_err(|e| Error::internal("publish: start the port's thread", e))?;
    Ok(())
}

/// Accepts until the listener is shut down (the sandbox stopped).
fn accept(context: &Arc<Context>, listener: &TcpListener, guest_port: u16) {
    for client in listener.incoming() {
        let Ok(client) = client else {
            if context.table.lock().stopped {
                return;
            }
            continue;
        };
        {
            let mut table = context.table.lock();
            if table.stopped {
                return;
            }
            if table.forwarding >= MAX_FORWARDED {
                continue;
            }
            table.forwarding += 1;
            // A client of a published port uses the sandbox: it is not idle.
            table.last_activity = Some(Instant::now());
        }
        // The server inside must run to answer: an idle-paused sandbox is resumed.
        crate::server::wake_if_idle_paused(context);
        let context_for_thread = Arc::clone(context);
        let spawned = crate::workers::run(move || {
            forward(&context_for_thread, client, guest_port);
            context_for_thread.table.lock().forwarding -= 1;
        });
        if spawned.is_err() {
            context.table.lock().forwarding -= 1;
        }
    }
}

/// Opens the connection inside and copies both ways until both sides closed.
fn forward(context: &Context, client: TcpStream, guest_port: u16) {
    let Some(inside) = connect_inside(context, guest_port) else {
        return;
    };
    let (Ok(client_read), Ok(inside_read)) = (client.try_clone(), inside.try_clone()) else {
        return;
    };
    let upstream = std::thread::Builder::new()
        .name("strata-live-forward".into())
        .spawn(move || copy(client_read, &inside));
    copy(inside_read, &client);
    if let Ok(thread) = upstream {
        let _ = thread.join();
    }
}

/// Copies `from` into `to` until `from` ends, then half-closes `to`.
fn copy(mut from: TcpStream, to: &TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut to = to;
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    let _ = from.shutdown(Shutdown::Read);
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Asks init for a connection to `127.0.0.1:guest_port` inside and waits until it is
/// established; `None` when it could not be (nothing listens there, the sandbox ended).
fn connect_inside(context: &Context, guest_port: u16) -> Option<TcpStream> {
    let id = {
        let mut table = context.table.lock();
        let id = table.next_id();
        table.connecting.insert(id, None);
        id
    };
    let asked = context
        .sandbox
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|sandbox| sandbox.connect(id, guest_port));
    if !matches!(asked, Some(Ok(()))) {
        context.table.lock().connecting.remove(&id);
        return None;
    }
    let deadline = Instant::now() + CONNECT_WAIT;
    let mut table = context.table.lock();
    let answer = loop {
        if let Some(Some(answer)) = table.connecting.get_mut(&id).map(Option::take) {
            break Some(answer);
        }
        if table.stopped || Instant::now() >= deadline {
            break None;
        }
        table = context.table.wait(table, Duration::from_millis(100));
    };
    table.connecting.remove(&id);
    drop(table);
    let socket: OwnedFd = answer?.ok()?;
    established(&socket, deadline).then(|| TcpStream::from(socket))
}

/// Waits until a non-blocking connect finished, and whether it succeeded; the socket is
/// made blocking.
fn established(socket: &OwnedFd, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    let timeout = rustix::time::Timespec {
        tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(left.subsec_nanos()),
    };
    let mut fds = [PollFd::new(socket, PollFlags::OUT)];
    if !matches!(rustix::event::poll(&mut fds, Some(&timeout)), Ok(n) if n > 0) {
        return false;
    }
    if !matches!(
        rustix::net::sockopt::socket_error(socket.as_fd()),
        Ok(Ok(()))
    ) {
        return false;
    }
    rustix::io::ioctl_fionbio(socket, false).is_ok()
}
