//! Transparent egress for tools that ignore proxy variables (Node's `fetch`, Java, a raw
//! socket): each exact host name of the allowlist gets a synthetic address in
//! `198.18.0.0/15` (RFC 2544 benchmarking, never routed) through the sandbox's own
//! `/etc/hosts`, that whole network is local to the sandbox's loopback, and the helper binds
//! a listener on `0.0.0.0:PORT` for each port the name rules allow. A connection to
//! `198.18.0.7:443` lands on the host's proxy, which maps the address back to its name,
//! reads the TLS server name or HTTP `Host` (it must be that name), checks the policy,
//! resolves on the host and connects, exactly as for a `CONNECT`.
//!
//! Nothing resolves inside: `/etc/hosts` is static data written by the host, and no
//! resolver is reachable. Wildcard, address and CIDR rules get no synthetic names (their
//! names are unknown beforehand): tools reach those through the proxy variables.

use std::collections::BTreeSet;
use std::io;
use std::net::{Ipv4Addr, TcpListener};

use sandbox_core::egress::{Host, DEFAULT_PORTS};
use sandbox_core::NetRule;

use crate::egress_link::EGRESS_PORT;

/// The synthetic network: `198.18.0.0/15`.
pub const SYNTHETIC_NET: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);
/// Its prefix length.
pub const SYNTHETIC_PREFIX: u8 = 15;
/// Most ports with a transparent listener per run (the first, in ascending order).
pub const MAX_PORTS: usize = 16;

/// The transparent side of an allowlist: synthetic addresses and listener ports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transparent {
    /// Each exact host name of the rules and its synthetic address.
    pub names: Vec<(Ipv4Addr, String)>,
    /// The ports the name rules allow (never the proxy's own port), ascending.
    pub ports: Vec<u16>,
}

impl Transparent {
    /// Derives the names and ports from the rules (the host and the helper both call it,
    /// so they agree). Empty when no rule names an exact host.
    pub fn plan(rules: &[NetRule]) -> Transparent {
        let mut names = BTreeSet::new();
        let mut ports = BTreeSet::new();
        for rule in rules {
            if rule.host.starts_with("*.") {
                continue;
            }
            let Ok(Host::Name(name)) = Host::parse(&rule.host) else {
                continue;
            };
            names.insert(name);
            match rule.port {
                Some(port) => {
                    ports.insert(port);
                }
                None => ports.extend(DEFAULT_PORTS),
            }
        }
        ports.remove(&EGRESS_PORT);
        let base = u32::from(SYNTHETIC_NET);
        Transparent {
            names: names
                .into_iter()
                .take((1 << (32 - SYNTHETIC_PREFIX)) - 2)
                .enumerate()
                .map(|(i, name)| (Ipv4Addr::from(base + 1 + i as u32), name))
                .collect(),
            ports: ports.into_iter().take(MAX_PORTS).collect(),
        }
    }

    /// Whether there is anything to intercept.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() || self.ports.is_empty()
    }

    /// The sandbox's `/etc/hosts`: loopback, and each name at its synthetic address.
    pub fn hosts_file(&self) -> String {
        let mut text = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost\n");
        for (addr, name) in &self.names {
            text.push_str(&format!("{addr}\t{name}\n"));
        }
        text
    }
}

/// The sandbox's `/etc/nsswitch.conf` under an allowlist: names come from `/etc/hosts` only
/// (no resolver is reachable anyway; this skips the attempt).
pub const NSSWITCH: &str = "passwd: files\ngroup: files\nhosts: files\n";

/// In the helper, inside the sandbox's network namespace: makes the synthetic network local
/// to loopback and binds a listener on `0.0.0.0:PORT` for each port.
pub fn bind_listeners(plan: &Transparent) -> io::Result<Vec<TcpListener>> {
    if plan.is_empty() {
        return Ok(Vec::new());
    }
    add_loopback_network()?;
    plan.ports
        .iter()
        .map(|port| TcpListener::bind((Ipv4Addr::UNSPECIFIED, *port)))
        .collect()
}

/// Adds `198.18.0.1/15` to loopback (as the alias `lo:1`): on a loopback device the whole
/// prefix becomes local, so any address in it reaches listeners on `0.0.0.0`.
fn add_loopback_network() -> io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: socket returns a new fd or -1, checked below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let set = |request: libc::c_ulong, addr: Ipv4Addr| -> io::Result<()> {
        // SAFETY: ifreq is plain data; zeroed is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo:1\0") {
            *dst = *src as libc::c_char;
        }
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(addr).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: ifru_addr is a sockaddr, and sockaddr_in fits in it (both 16 bytes).
        unsafe {
            std::ptr::write(
                std::ptr::addr_of_mut!(req.ifr_ifru.ifru_addr).cast::<libc::sockaddr_in>(),
                sin,
            );
        }
        // SAFETY: the ioctl reads a valid ifreq for the duration of the call.
        if unsafe { libc::ioctl(sock.as_raw_fd(), request, &req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    set(
        libc::SIOCSIFADDR,
        Ipv4Addr::from(u32::from(SYNTHETIC_NET) + 1),
    )?;
    set(
        libc::SIOCSIFNETMASK,
        Ipv4Addr::from(u32::MAX << (32 - SYNTHETIC_PREFIX)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &[&str]) -> Vec<NetRule> {
        text.iter().map(|r| r.parse().expect("rule")).collect()
    }

    #[test]
    fn exact_names_get_addresses_and_their_ports_listeners() {
        let plan = Transparent::plan(&rules(&[
            "b.example.com:8443",
            "a.example.com",
            "*.github.com:443",
            "10.0.0.0/8:5432",
            "203.0.113.7:22",
            "a.example.com:3128",
        ]));
        assert_eq!(
            plan.names,
            vec![
                (Ipv4Addr::new(198, 18, 0, 1), "a.example.com".to_string()),
                (Ipv4Addr::new(198, 18, 0, 2), "b.example.com".to_string()),
            ]
        );
        assert_eq!(
            plan.ports,
            vec![80, 443, 8443],
            "never the proxy's own port"
        );
        assert!(plan.hosts_file().contains("198.18.0.2\tb.example.com\n"));
    }

    #[test]
    fn wildcards_and_addresses_alone_intercept_nothing() {
        assert!(Transparent::plan(&rules(&["*.github.com", "10.0.0.0/8:80"])).is_empty());
    }
}
