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

pub use sandbox_egress::host::{proxy_addr, PROXY_PORT as EGRESS_PORT};

/// Most descriptors one link message carries: the proxy's listener and the transparent
/// ones.
const MAX_FDS: usize = 1 + crate::egress_transparent::MAX_PORTS;

/// In the helper, inside the sandbox's network namespace: binds the proxy's listener and
/// sends it to the host over `link`, followed by `transparent` (listeners on `0.0.0.0`,
/// see `egress_transparent`). The helper's copies are closed on return.
pub fn send_listeners(link: &UnixStream, transparent: Vec<TcpListener>) -> io::Result<()> {
    let listener = TcpListener::bind(proxy_addr())?;
    let fds: Vec<_> = std::iter::once(listener.as_fd())
        .chain(transparent.iter().map(AsFd::as_fd))
        .take(MAX_FDS)
        .collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other(
            "control buffer too small for the listeners",
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

/// The listeners a helper hands over: the proxy's, and one per transparent port.
#[derive(Debug)]
pub struct Listeners {
    /// On [`proxy_addr`].
    pub proxy: TcpListener,
    /// On `0.0.0.0:PORT`, in the order of the ports asked for.
    pub transparent: Vec<TcpListener>,
}

/// On the host: waits up to `timeout` for the listeners a helper sends over `link`: the
/// proxy's on [`proxy_addr`], then one on `0.0.0.0:PORT` for each of `ports`, exactly.
/// `Ok(None)` when the helper closed the link without sending them (its setup failed, and
/// its control channel says why).
pub fn receive_listeners(
    link: &UnixStream,
    timeout: Duration,
    ports: &[u16],
) -> io::Result<Option<Listeners>> {
    link.set_read_timeout(Some(timeout))?;
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
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
    if fds.len() != 1 + ports.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the helper sent {} descriptors for the egress listeners, not {}",
                fds.len(),
                1 + ports.len()
            ),
        ));
    }
    let mut listeners = fds.into_iter().map(TcpListener::from);
    let expected = std::iter::once(proxy_addr()).chain(
        ports
            .iter()
            .map(|port| SocketAddr::from((Ipv4Addr::UNSPECIFIED, *port))),
    );
    let mut checked = Vec::new();
    for (listener, want) in listeners.by_ref().zip(expected) {
        match listener.local_addr() {
            Ok(addr) if addr == want => checked.push(listener),
            Ok(addr) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("an egress listener is bound to {addr}, not {want}"),
                ))
            }
            Err(err) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("an egress descriptor is not a TCP socket: {err}"),
                ))
            }
        }
    }
    let mut checked = checked.into_iter();
    let proxy = checked
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no proxy listener"))?;
    Ok(Some(Listeners {
        proxy,
        transparent: checked.collect(),
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_link_without_a_listener_is_none_not_an_error() {
        let (host, helper) = UnixStream::pair().expect("pair");
        drop(helper);
        let got = receive_listeners(&host, Duration::from_secs(5), &[]).expect("receive");
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
        let err = receive_listeners(&host, Duration::from_secs(5), &[]).expect_err("wrong address");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("not 127.0.0.1:3128"), "{err}");
    }
}
