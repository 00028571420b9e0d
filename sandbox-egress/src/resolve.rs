//! Name resolution for the proxy: the hosts file first, then the system resolver with the
//! absolute name.
//!
//! The resolver gets exactly the name the matcher saw. `/etc/hosts` is searched for that
//! exact name (case-insensitively, as DNS compares); when it lists the name, those
//! addresses are the answer and no query is sent. Otherwise the absolute name (`name.`,
//! [`Host::resolver_name`]) goes to `getaddrinfo` on a blocking thread, so no search domain
//! is ever appended (glibc does not consult the hosts file for absolute names, which is why
//! it is read here). The hosts file is re-read per lookup: it is small, and an entry added
//! or removed takes effect at once.
//!
//! `tokio::net::lookup_host` rather than `hickory-resolver` for now: hickory 0.26 pulls
//! moka, ring and parking_lot and changes the workspace's feature unification (tracing,
//! once_cell), which rebuilds wasmtime. The sandbox never talks to a resolver itself; only
//! this host-side lookup happens.

use std::io;
use std::net::IpAddr;
use std::path::Path;

use sandbox_core::egress::Host;

/// The system hosts file.
pub const HOSTS_FILE: &str = "/etc/hosts";

/// Largest hosts file read; a bigger one is ignored (the system resolver still answers).
const MAX_HOSTS_BYTES: u64 = 4 << 20;

/// Resolves `host` for a connection to `port`: an IP literal is itself; a name is looked up
/// in [`HOSTS_FILE`], then with the system resolver. Addresses come back in the order
/// found, without duplicates. An empty answer is `Ok(vec![])`.
pub async fn resolve(host: &Host, port: u16) -> io::Result<Vec<IpAddr>> {
    resolve_with(host, port, Path::new(HOSTS_FILE)).await
}

/// [`resolve`] with another hosts file (tests).
pub async fn resolve_with(host: &Host, port: u16, hosts_file: &Path) -> io::Result<Vec<IpAddr>> {
    let (name, absolute) = match (host, host.resolver_name()) {
        (Host::Ip(ip), _) => return Ok(vec![*ip]),
        (Host::Name(name), Some(absolute)) => (name.clone(), absolute),
        (Host::Name(name), None) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no resolver name for {name}"),
            ))
        }
    };
    let path = hosts_file.to_path_buf();
    let listed = tokio::task::spawn_blocking(move || hosts_file_lookup(&path, &name))
        .await
        .map_err(io::Error::other)?;
    if !listed.is_empty() {
        return Ok(listed);
    }
    let mut ips: Vec<IpAddr> = Vec::new();
    for addr in tokio::net::lookup_host((absolute.as_str(), port)).await? {
        if !ips.contains(&addr.ip()) {
            ips.push(addr.ip());
        }
    }
    Ok(ips)
}

/// The addresses a hosts file lists for exactly `name` (canonical name or alias,
/// compared without case). Unreadable or oversized files and malformed lines give nothing.
pub fn hosts_file_lookup(path: &Path, name: &str) -> Vec<IpAddr> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Vec::new();
    };
    if meta.len() > MAX_HOSTS_BYTES {
        return Vec::new();
    }
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    parse_hosts(&text, name)
}

fn parse_hosts(text: &str, name: &str) -> Vec<IpAddr> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut fields = line.split_ascii_whitespace();
        let Some(Ok(ip)) = fields.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        if fields.any(|alias| alias.eq_ignore_ascii_case(name)) && !found.contains(&ip) {
            found.push(ip);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTS: &str = "\
127.0.0.1\tlocalhost
# 10.0.0.1 commented.example
203.0.113.7 api.example.com api # trailing comment
2001:db8::7 api.example.com
not-an-ip broken.example
10.1.1.1 other.example api.example.com.evil
";

    #[test]
    fn exact_names_and_aliases_match_without_case() {
        let ips = parse_hosts(HOSTS, "API.Example.com");
        assert_eq!(
            ips,
            vec![
                "203.0.113.7".parse::<IpAddr>().expect("ip"),
                "2001:db8::7".parse().expect("ip")
            ]
        );
        assert_eq!(parse_hosts(HOSTS, "api").len(), 1);
    }

    #[test]
    fn comments_malformed_lines_and_longer_names_do_not_match() {
        assert!(parse_hosts(HOSTS, "commented.example").is_empty());
        assert!(parse_hosts(HOSTS, "broken.example").is_empty());
        assert!(parse_hosts(HOSTS, "example.com").is_empty());
        assert!(parse_hosts(HOSTS, "api.example").is_empty());
    }

    #[tokio::test]
    async fn a_hosts_file_entry_wins_over_dns_and_ip_literals_are_themselves() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("hosts");
        std::fs::write(&file, "198.51.100.9 only-in-hosts.example\n").expect("write");
        let host = Host::parse("only-in-hosts.example").expect("host");
        let ips = resolve_with(&host, 443, &file).await.expect("resolve");
        assert_eq!(ips, vec!["198.51.100.9".parse::<IpAddr>().expect("ip")]);
        let ip = Host::parse("192.0.2.1").expect("ip host");
        assert_eq!(
            resolve_with(&ip, 80, &file).await.expect("literal"),
            vec!["192.0.2.1".parse::<IpAddr>().expect("ip")]
        );
    }
}
