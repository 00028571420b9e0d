//! The only way out of a sandbox under a network allowlist: a TCP listener created inside
//! the sandbox's (otherwise empty) network namespace and handed to the host's egress proxy.
//!
//! The helper, once it is in the new network namespace with loopback up, binds
//! `127.0.0.1:`[`EGRESS_PORT`] and sends the listening socket to the host over a dedicated
//! socket pair ([`EGRESS_FD`] in the helper) with `SCM_RIGHTS`, keeping no copy: no
//! process in the sandbox can accept on it, and the port is taken, so nothing in the
//! sandbox can listen there instead. A socket keeps the network namespace it was created
//! in, so the host accepts the tool's connections in the sandbox's namespace while the
//! proxy's upstream connections leave from the host's. The namespace has no other
//! interface, no route and no resolver: a tool that ignores the proxy variables reaches
//! nothing. This works for an unprivileged embedder too (no `setns`, no veth, no root).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// The helper's end of the egress socket pair.
pub const EGRESS_FD: RawFd = 4;

/// The port of the proxy inside the sandbox, on `127.0.0.1`.
pub const EGRESS_PORT: u16 = 3128;

/// Where the tool reaches the proxy, inside its own network namespace.
pub fn proxy_addr() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, EGRESS_PORT))
}

/// In the helper, inside the sandbox's network namespace: binds the proxy's listener and
/// sends it to the host over `link`. The helper's copy is closed on return.
pub fn send_listener(link: &UnixStream) -> io::Result<()> {
    let listener = TcpListener::bind(proxy_addr())?;
    let fds = [listener.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other(
            "control buffer too small for one descriptor",
        ));
    }
    sendmsg(
        link,
        &[IoSlice::new(b"L")],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// On the host: waits up to `timeout` for the listener a helper sends over `link`.
/// `Ok(None)` when the helper closed the link without sending one (its setup failed, and
/// its control channel says why). The socket must be a TCP listener on
/// [`proxy_addr`].
pub fn receive_listener(link: &UnixStream, timeout: Duration) -> io::Result<Option<TcpListener>> {
    link.set_read_timeout(Some(timeout))?;
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = recvmsg(
        link,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|err| match err {
        rustix::io::Errno::AGAIN => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no egress listener from the helper within {timeout:?}"),
        ),
        other => io::Error::from(other),
    })?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    let (Some(fd), true) = (fds.pop(), fds.is_empty()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the helper sent no descriptor, or more than one, for the egress listener",
        ));
    };
    let listener = TcpListener::from(fd);
    match listener.local_addr() {
        Ok(addr) if addr == proxy_addr() => Ok(Some(listener)),
        Ok(addr) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the egress listener is bound to {addr}, not {}",
                proxy_addr()
            ),
        )),
        Err(err) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the egress descriptor is not a TCP socket: {err}"),
        )),
    }
}

/// Binds the proxy's listener inside the network namespace of process `pid` (a container
/// engine's container, whose own init cannot do it), from a short-lived thread that enters
/// that namespace and exits: the rest of the process never changes namespace. Needs
/// `CAP_SYS_ADMIN` over the namespace (the engines' root).
pub fn listener_in_namespace_of(pid: u32) -> io::Result<TcpListener> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    std::thread::Builder::new()
        .name("strata-netns".into())
        .spawn(move || {
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            TcpListener::bind(proxy_addr())
        })?
        .join()
        .map_err(|_| io::Error::other("the network-namespace thread panicked"))?
}

/// Every address of the host's interfaces (the egress policy refuses names that resolve
/// to one); shared with the wasm backend, so it lives in `sandbox-egress`.
pub use sandbox_egress::host::host_addresses;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_link_without_a_listener_is_none_not_an_error() {
        let (host, helper) = UnixStream::pair().expect("pair");
        drop(helper);
        let got = receive_listener(&host, Duration::from_secs(5)).expect("receive");
        assert!(got.is_none());
    }

    #[test]
    fn a_descriptor_that_is_not_the_proxy_listener_is_refused() {
        let (host, helper) = UnixStream::pair().expect("pair");
        let other = TcpListener::bind("127.0.0.1:0").expect("bind");
        let fds = [other.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        sendmsg(
            &helper,
            &[IoSlice::new(b"L")],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .expect("send");
        let err = receive_listener(&host, Duration::from_secs(5)).expect_err("wrong address");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("not 127.0.0.1:3128"), "{err}");
    }
}
