//! The channel between a live sandbox's host side and its init: one `SOCK_SEQPACKET` pair,
//! one JSON message per packet, with the exec's stdio descriptors attached to the packet
//! that asks for it (`SCM_RIGHTS`). Packets keep message and descriptors together, so no
//! framing is needed and a descriptor can never be read as belonging to another message.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use rustix::net::{
    recvmsg, sendmsg, socketpair, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage,
    RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};

use crate::protocol::Command;

/// Largest message either side sends: 128 KiB (an exec's argv and environment must fit).
pub const MAX_PACKET: usize = 128 * 1024;

/// Most descriptors one packet carries: an exec's stdin, stdout and stderr.
pub const MAX_FDS: usize = 3;

/// Host to init.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LiveRequest {
    /// Start `command` with the packet's three descriptors as its stdin, stdout and stderr,
    /// in `workdir`, as a new session (its pid is its process group).
    Exec {
        /// The host's number for this exec, echoed in the reply.
        id: u64,
        /// What to run.
        command: Command,
        /// Its working directory inside the sandbox.
        workdir: PathBuf,
        /// Its stdin is a terminal: make it the new session's controlling terminal (so job
        /// control and `^C` work inside it).
        #[serde(default)]
        tty: bool,
    },
    /// Send `signal` to the process group of exec `pid` (its process tree unless a process
    /// left the group with `setsid`).
    Signal {
        /// The exec's pid in the sandbox.
        pid: i32,
        /// The signal number.
        signal: i32,
    },
    /// Send a descriptor of the sandbox's root directory (`O_PATH`), for the host's file
    /// operations on the sandbox's own mount tree. The answer is [`LiveEvent::Root`].
    Root,
    /// Stop every process of the sandbox but init with `SIGSTOP` (how a sandbox without a
    /// cgroup freezer pauses).
    StopAll,
    /// Continue every process of the sandbox with `SIGCONT`.
    ContinueAll,
    /// Open a TCP connection to `127.0.0.1:port` in the sandbox's network namespace (a
    /// published port). The answer is [`LiveEvent::Connecting`] with the socket attached,
    /// or [`LiveEvent::ConnectFailed`].
    Connect {
        /// The host's number for this connection, echoed in the reply.
        id: u64,
        /// The port inside the sandbox.
        port: u16,
    },
}

/// Init to host.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LiveEvent {
    /// Exec `id` runs as `pid` (in the sandbox's pid namespace).
    Started {
        /// The request's id.
        id: u64,
        /// Its pid inside the sandbox.
        pid: i32,
    },
    /// Exec `id` did not start: its program could not be executed (nothing ran).
    ExecFailed {
        /// The request's id.
        id: u64,
        /// The program.
        program: String,
        /// OS error number.
        errno: i32,
    },
    /// An exec's main process ended.
    Exited {
        /// Its pid.
        pid: i32,
        /// Raw wait status.
        wait_status: i32,
    },
    /// The packet carries the sandbox's root directory (`O_PATH`).
    Root,
    /// Connection `id` is under way: the packet carries its non-blocking socket (the host
    /// waits until it is writable and reads `SO_ERROR`).
    Connecting {
        /// The request's id.
        id: u64,
    },
    /// Connection `id` could not be opened.
    ConnectFailed {
        /// The request's id.
        id: u64,
        /// OS error number.
        errno: i32,
    },
    /// A request could not be served (a bad packet, a signal to a pid that is no exec).
    Refused {
        /// Why.
        message: String,
    },
}

/// A connected, close-on-exec `SOCK_SEQPACKET` pair.
pub fn packet_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Sends `message` as one packet, with `fds` attached.
pub fn send<T: Serialize>(
    socket: BorrowedFd<'_>,
    message: &T,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let bytes = serde_json::to_vec(message).map_err(io::Error::other)?;
    if bytes.len() > MAX_PACKET {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a live sandbox message is {} bytes; at most {MAX_PACKET} fit",
                bytes.len()
            ),
        ));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    sendmsg(
        socket,
        &[IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receives one packet: `Ok(None)` when the other side closed the channel. A packet that
/// is not one message, or was cut short, is an error (its descriptors are closed).
pub fn receive<T: for<'de> Deserialize<'de>>(
    socket: BorrowedFd<'_>,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_PACKET];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match recvmsg(
            socket,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            other => break other?,
        }
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    if received.flags.contains(rustix::net::ReturnFlags::TRUNC)
        || received.flags.contains(rustix::net::ReturnFlags::CTRUNC)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a live sandbox message was cut short",
        ));
    }
    let message = serde_json::from_slice(&buf[..received.bytes])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((message, fds)))
}

/// Borrows each of `fds`.
pub fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(AsFd::as_fd).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_message_arrives_with_its_descriptors() {
        let (a, b) = packet_pair().expect("pair");
        let (r, w) = crate::sys::pipe().expect("pipe");
        let request = LiveRequest::Signal { pid: 7, signal: 15 };
        send(a.as_fd(), &request, &[w.as_fd()]).expect("send");
        drop(w);
        let (got, fds): (LiveRequest, _) = receive(b.as_fd()).expect("receive").expect("one");
        assert_eq!(got, request);
        assert_eq!(fds.len(), 1);
        std::fs::File::from(fds.into_iter().next().expect("fd"))
            .write_all(b"hi")
            .expect("write through the passed pipe");
        let mut out = String::new();
        std::fs::File::from(r)
            .read_to_string(&mut out)
            .expect("read");
        assert_eq!(out, "hi");
    }

    #[test]
    fn a_closed_channel_reads_as_none_and_garbage_as_an_error() {
        let (a, b) = packet_pair().expect("pair");
        rustix::net::send(&a, b"{not json", SendFlags::NOSIGNAL).expect("send");
        assert!(receive::<LiveRequest>(b.as_fd()).is_err());
        drop(a);
        assert!(receive::<LiveRequest>(b.as_fd()).expect("eof").is_none());
    }
}
