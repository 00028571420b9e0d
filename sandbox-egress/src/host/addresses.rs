//! The host's own addresses, which the egress policy refuses unless a rule names one
//! exactly ([`sandbox_core::EgressPolicy::with_host_addrs`]). One `getifaddrs` walk, the
//! only unsafe code of this crate.

use std::io;
use std::net::{IpAddr, Ipv4Addr};

/// Every address of the host's interfaces. Interfaces without an IPv4 or IPv6 address are
/// skipped; each address appears once.
pub fn host_addresses() -> io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut addrs = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: cursor is a node of the list getifaddrs returned, not yet freed.
        let entry = unsafe { &*cursor };
        if !entry.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says its real type; we
            // read the larger types only for their families.
            let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
            let ip = match family {
                libc::AF_INET => {
                    // SAFETY: AF_INET: the address is a sockaddr_in.
                    let sin = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
                    Some(IpAddr::from(Ipv4Addr::from(u32::from_be(
                        sin.sin_addr.s_addr,
                    ))))
                }
                libc::AF_INET6 => {
                    // SAFETY: AF_INET6: the address is a sockaddr_in6.
                    let sin6 = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in6) };
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            };
            if let Some(ip) = ip.filter(|ip| !addrs.contains(ip)) {
                addrs.push(ip);
            }
        }
        cursor = entry.ifa_next;
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_addresses_include_loopback() {
        let addrs = host_addresses().expect("getifaddrs");
        assert!(
            addrs.contains(&IpAddr::from(Ipv4Addr::LOCALHOST)),
            "{addrs:?}"
        );
    }
}
