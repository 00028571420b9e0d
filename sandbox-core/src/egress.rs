//! Egress policy: the pure, OS-free half of network allowlists ([`crate::Net::Allow`]).
//!
//! An egress proxy asks two questions of an [`EgressPolicy`]:
//!
//! 1. [`EgressPolicy::check_name`], before resolving anything: may the tool reach this
//!    `host:port` at all? A name that no name rule admits is never resolved, so the allowlist
//!    is not a DNS side channel. An IP literal is checked completely here.
//! 2. [`EgressPolicy::check_addr`], at `connect()` time, for every address a name resolved
//!    to: is that address outside the always-denied ranges ([`ReservedRange`]: loopback,
//!    private, link-local and cloud metadata, CGNAT, multicast, documentation, IPv4-mapped
//!    IPv6, ...), or explicitly opened by an IP/CIDR rule? The proxy then pins that address
//!    for the connection, so a second resolution cannot rebind it.
//!
//! One parser serves the rules and the requests ([`Host::parse`]): the string the matcher
//! sees is the string the resolver gets ([`Host::resolver_name`]). It is strict on purpose:
//! NUL, CR/LF, `@`, `%`, whitespace, empty or over-long labels, non-LDH characters, the
//! decimal, octal, hexadecimal and short IPv4 forms (`2130706433`, `0177.0.0.1`,
//! `0x7f.0.0.1`, `127.1`) and IPv4-mapped or -compatible IPv6 (`::ffff:127.0.0.1`) are all
//! refused rather than interpreted.
//!
//! Rule syntax (the `host` of a [`NetRule`]):
//!
//! - `example.com`: exactly that name.
//! - `*.example.com`: any name below `example.com` (any depth), never `example.com`
//!   itself. The part after `*.` must be a registrable domain or below one: wildcards that
//!   cover a public suffix (`*.com`, `*.co.uk`, `*.github.io`, or an unlisted top-level
//!   domain such as `*.corp`) are refused, using the embedded public suffix list.
//! - `192.0.2.7`, `2001:db8::1`: one address.
//! - `10.0.0.0/8`, `fd00::/8`: a network in canonical form (no host bits set).
//!
//! Each rule admits its port, or 80 and 443 ([`DEFAULT_PORTS`]) when it names none. An
//! empty rule list admits nothing.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::caps::NetRule;
use crate::error::{Error, Result};

/// The variables a sandbox under an allowlist gets, naming its egress proxy (with the
/// run's credential). Backends replace any the caller set; a secret may not take them.
pub const PROXY_VARIABLES: [&str; 6] = [
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
];

/// The ports a rule without a port admits: HTTP and HTTPS.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Longest host name, in characters, without a trailing dot (RFC 1035).
const MAX_NAME: usize = 253;
/// Longest label of a host name (RFC 1035).
const MAX_LABEL: usize = 63;

/// A destination host as the proxy received it, parsed strictly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name: lowercase LDH labels, no trailing dot.
    Name(String),
    /// An IP address literal (never IPv4-mapped or -compatible IPv6).
    Ip(IpAddr),
}

impl Host {
    /// Parses a host as a client sent it (a CONNECT authority without port and brackets, a
    /// SOCKS5 domain name, an HTTP `Host` without port). ASCII letters are lowercased;
    /// anything ambiguous is refused with the reason.
    pub fn parse(text: &str) -> std::result::Result<Host, String> {
        if text.is_empty() {
            return Err("the host is empty".into());
        }
        if let Some(c) = text.chars().find(|c| forbidden_char(*c)) {
            return Err(format!("the host contains the forbidden character {c:?}"));
        }
        if !text.is_ascii() {
            return Err(
                "the host is not ASCII (give internationalized names as punycode, xn--...)".into(),
            );
        }
        let lower = text.to_ascii_lowercase();
        if lower.contains(':') {
            return parse_ipv6(&lower).map(|ip| Host::Ip(IpAddr::V6(ip)));
        }
        if ends_in_number(&lower) {
            return parse_ipv4(&lower).map(|ip| Host::Ip(IpAddr::V4(ip)));
        }
        check_name(&lower)?;
        Ok(Host::Name(lower))
    }

    /// The string to hand the resolver: the name as matched, made absolute with a trailing
    /// dot so that no search domain is appended (`intranet` must not become
    /// `intranet.corp.example`). `None` for an IP literal, which is not resolved.
    pub fn resolver_name(&self) -> Option<String> {
        match self {
            Host::Name(name) => Some(format!("{name}.")),
            Host::Ip(_) => None,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// An IP network: an address and a prefix length, with no host bits set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// The network `addr/prefix`; `None` if the prefix is too long for the address family
    /// or `addr` has bits set below the prefix.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<IpNet> {
        (prefix <= full(addr) && bits(addr) & !mask(addr, prefix) == 0)
            .then_some(IpNet { addr, prefix })
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `addr` is in this network (always false across address families).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.addr, addr) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                let m = mask(addr, self.prefix);
                bits(addr) & m == bits(self.addr) & m
            }
            _ => false,
        }
    }

    /// Whether every address of `self` is in `other`.
    pub fn is_within(&self, other: &IpNet) -> bool {
        self.prefix >= other.prefix && other.contains(self.addr)
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The address bits, right-aligned in a u128.
fn bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The network mask of `prefix` bits for the family of `addr`, right-aligned in a u128.
fn mask(addr: IpAddr, prefix: u8) -> u128 {
    let width: u32 = match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    };
    let prefix = u32::from(prefix).min(width);
    let all = if width == 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    // `checked_shr`: a plain `>> 128` would be an overflow (masked to `>> 0` in release).
    all & !all.checked_shr(prefix).unwrap_or(0)
}

/// An address range that is never reachable through a name, and through an IP or CIDR rule
/// only if that rule lies entirely inside the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReservedRange {
    /// `0.0.0.0/8`, `::/128`: "this host"; connecting to it reaches the host itself.
    Unspecified,
    /// `127.0.0.0/8`, `::1/128`.
    Loopback,
    /// RFC 1918: `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`.
    Private,
    /// `100.64.0.0/10`: carrier-grade NAT (RFC 6598).
    SharedAddressSpace,
    /// `169.254.169.254/32`: the cloud instance metadata service (credentials).
    CloudMetadata,
    /// `169.254.0.0/16`, `fe80::/10`.
    LinkLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255/32`.
    Broadcast,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `198.18.0.0/15`, `2001:2::/48`.
    Benchmarking,
    /// `192.0.0.0/24`, `240.0.0.0/4`, `100::/64`, `fec0::/10`: protocol assignments,
    /// future use, discard-only, deprecated site-local.
    Reserved,
    /// `fc00::/7`: IPv6 unique local addresses (RFC 4193).
    UniqueLocal,
    /// `::ffff:0:0/96`: IPv4-mapped IPv6, which would reach the embedded IPv4 address.
    Ipv4Mapped,
    /// `::/96`: deprecated IPv4-compatible IPv6.
    Ipv4Compatible,
    /// `64:ff9b::/96`, `64:ff9b:1::/48` (NAT64), `2002::/16` (6to4), `2001::/32` (Teredo):
    /// IPv6 that carries an IPv4 address a gateway may reach.
    Ipv4Embedded,
}

impl ReservedRange {
    /// A stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            ReservedRange::Unspecified => "unspecified",
            ReservedRange::Loopback => "loopback",
            ReservedRange::Private => "private",
            ReservedRange::SharedAddressSpace => "shared_address_space",
            ReservedRange::CloudMetadata => "cloud_metadata",
            ReservedRange::LinkLocal => "link_local",
            ReservedRange::Multicast => "multicast",
            ReservedRange::Broadcast => "broadcast",
            ReservedRange::Documentation => "documentation",
            ReservedRange::Benchmarking => "benchmarking",
            ReservedRange::Reserved => "reserved",
            ReservedRange::UniqueLocal => "unique_local",
            ReservedRange::Ipv4Mapped => "ipv4_mapped",
            ReservedRange::Ipv4Compatible => "ipv4_compatible",
            ReservedRange::Ipv4Embedded => "ipv4_embedded",
        }
    }

    /// The reserved range (and the network of it) that contains `addr`, most specific
    /// first (`169.254.169.254` is [`ReservedRange::CloudMetadata`], not link-local).
    pub fn of(addr: IpAddr) -> Option<(ReservedRange, IpNet)> {
        RESERVED.iter().find_map(|(a, prefix, range)| {
            let net = IpNet {
                addr: *a,
                prefix: *prefix,
            };
            net.contains(addr).then_some((*range, net))
        })
    }
}

impl fmt::Display for ReservedRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

#[allow(clippy::too_many_arguments)]
const fn v6(a: u16, b: u16, c: u16, d: u16, e: u16, f: u16, g: u16, h: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h))
}

/// The always-denied ranges, most specific first within overlaps.
const RESERVED: [(IpAddr, u8, ReservedRange); 32] = {
    use ReservedRange::*;
    [
        (v4(169, 254, 169, 254), 32, CloudMetadata),
        (v4(255, 255, 255, 255), 32, Broadcast),
        (v4(0, 0, 0, 0), 8, Unspecified),
        (v4(10, 0, 0, 0), 8, Private),
        (v4(100, 64, 0, 0), 10, SharedAddressSpace),
        (v4(127, 0, 0, 0), 8, Loopback),
        (v4(169, 254, 0, 0), 16, LinkLocal),
        (v4(172, 16, 0, 0), 12, Private),
        (v4(192, 0, 0, 0), 24, Reserved),
        (v4(192, 0, 2, 0), 24, Documentation),
        (v4(192, 168, 0, 0), 16, Private),
        (v4(198, 18, 0, 0), 15, Benchmarking),
        (v4(198, 51, 100, 0), 24, Documentation),
        (v4(203, 0, 113, 0), 24, Documentation),
        (v4(224, 0, 0, 0), 4, Multicast),
        (v4(240, 0, 0, 0), 4, Reserved),
        (v6(0, 0, 0, 0, 0, 0, 0, 0), 128, Unspecified),
        (v6(0, 0, 0, 0, 0, 0, 0, 1), 128, Loopback),
        (v6(0, 0, 0, 0, 0, 0xffff, 0, 0), 96, Ipv4Mapped),
        (v6(0, 0, 0, 0, 0, 0, 0, 0), 96, Ipv4Compatible),
        (v6(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96, Ipv4Embedded),
        (v6(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48, Ipv4Embedded),
        (v6(0x100, 0, 0, 0, 0, 0, 0, 0), 64, Reserved),
        (v6(0x2001, 0x2, 0, 0, 0, 0, 0, 0), 48, Benchmarking),
        (v6(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32, Documentation),
        (v6(0x2001, 0, 0, 0, 0, 0, 0, 0), 32, Ipv4Embedded),
        (v6(0x2002, 0, 0, 0, 0, 0, 0, 0), 16, Ipv4Embedded),
        (v6(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20, Documentation),
        (v6(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7, UniqueLocal),
        (v6(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10, LinkLocal),
        (v6(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10, Reserved),
        (v6(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, Multicast),
    ]
};

/// Why a destination was refused.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DenyReason {
    /// No rule names this host (an empty allowlist has no rules: it denies everything).
    NoRule,
    /// A rule names this host, but not on this port.
    PortNotAllowed {
        /// The refused port.
        port: u16,
    },
    /// The address is in an always-denied range and no IP/CIDR rule inside that range
    /// opens it.
    DeniedRange {
        /// Which range.
        range: ReservedRange,
        /// The network of the range that contains the address.
        net: IpNet,
    },
    /// The address is one of the host's own addresses, which only a rule naming exactly
    /// that address opens.
    HostAddress {
        /// The refused address.
        addr: IpAddr,
    },
    /// The host is not a valid name or address (NUL, `@`, `%`, a numeric IPv4 form, ...).
    InvalidName {
        /// What is wrong with it.
        reason: String,
    },
    /// Not an outbound connection: binding to a chosen address or port, listening,
    /// accepting, or UDP. An allowlist admits outbound TCP connections only.
    Inbound {
        /// What was asked for (`listen on 0.0.0.0:8080`).
        what: String,
    },
    /// The address to connect to is not the IP literal that was checked.
    AddressMismatch {
        /// The address the host names.
        host: IpAddr,
        /// The address the caller would connect to.
        addr: IpAddr,
    },
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::NoRule => f.write_str("no rule allows this host"),
            DenyReason::PortNotAllowed { port } => {
                write!(f, "port {port} is not allowed for this host")
            }
            DenyReason::DeniedRange { range, net } => write!(
                f,
                "the address is in the {range} range {net}; only an IP or CIDR rule inside it opens it"
            ),
            DenyReason::HostAddress { addr } => {
                write!(f, "{addr} is an address of the host itself")
            }
            DenyReason::InvalidName { reason } => write!(f, "invalid host: {reason}"),
            DenyReason::Inbound { what } => write!(
                f,
                "{what} is refused: an allowlist admits outbound TCP connections only"
            ),
            DenyReason::AddressMismatch { host, addr } => {
                write!(f, "the host is {host} but the connection is to {addr}")
            }
        }
    }
}

/// The answer of an [`EgressPolicy`] check.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Allowed.
    Allow {
        /// The rule that allowed it, as written (`*.github.com:443`). For an address in a
        /// reserved range, the IP/CIDR rule that opened the range.
        rule: String,
    },
    /// Refused.
    Deny {
        /// Why.
        reason: DenyReason,
    },
}

impl Decision {
    /// Whether the destination is allowed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }

    fn deny(reason: DenyReason) -> Decision {
        Decision::Deny { reason }
    }
}

/// What a rule's host matches.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    /// Exactly this name.
    Exact(String),
    /// Names strictly below this domain.
    Below(String),
    /// Addresses in this network (a single address is a /32 or /128).
    Net(IpNet),
}

/// The parsed host of a rule. Used by [`crate::caps::NetRule`] validation, so a rule that
/// is accepted into caps always compiles.
fn parse_target(host: &str) -> std::result::Result<Target, String> {
    if let Some(base) = host.strip_prefix("*.") {
        return match Host::parse(base)? {
            Host::Ip(_) => Err("a wildcard must be followed by a domain, not an address".into()),
            Host::Name(name) => {
                if !registrable(&name) {
                    return Err(format!(
                        "*.{name} covers a public suffix (a whole top-level or shared domain); name a registrable domain such as *.example.com"
                    ));
                }
                Ok(Target::Below(name))
            }
        };
    }
    if host.contains('*') {
        return Err("a wildcard is only allowed as a leading \"*.\"".into());
    }
    if let Some((addr, prefix)) = host.split_once('/') {
        let ip = match Host::parse(addr)? {
            Host::Ip(ip) => ip,
            Host::Name(_) => return Err("a network must be an IP address/prefix".into()),
        };
        let valid_prefix = !prefix.is_empty()
            && prefix.len() <= 3
            && prefix.bytes().all(|b| b.is_ascii_digit())
            && !(prefix.len() > 1 && prefix.starts_with('0'));
        let prefix = prefix
            .parse::<u8>()
            .ok()
            .filter(|_| valid_prefix)
            .ok_or_else(|| format!("invalid prefix length {prefix:?}"))?;
        return IpNet::new(ip, prefix).map(Target::Net).ok_or_else(|| {
            format!("{ip}/{prefix} is not a network in canonical form (prefix too long, or host bits set)")
        });
    }
    Ok(match Host::parse(host)? {
        Host::Ip(ip) => Target::Net(IpNet {
            addr: ip,
            prefix: full(ip),
        }),
        Host::Name(name) => Target::Exact(name),
    })
}

/// Whether `name` is a registrable domain or below one, per the public suffix list (an
/// unlisted top-level domain counts as a public suffix, as the list's default rule says).
fn registrable(name: &str) -> bool {
    use psl::Psl;
    name.contains('.') && psl::List.domain(name.as_bytes()).is_some()
}

/// Characters never valid in a host, whatever the form: they split, smuggle or escape
/// (NUL truncation, CR/LF injection, `user@host`, `%`-encoding and IPv6 zones, spaces).
fn forbidden_char(c: char) -> bool {
    c.is_control() || c.is_whitespace() || matches!(c, '@' | '%' | '/' | '\\' | '[' | ']')
}

/// Whether the last label looks like a number (decimal digits, or `0x` hex): such a
/// host is an IPv4 address to every resolver, in forms that differ between resolvers.
fn ends_in_number(host: &str) -> bool {
    let last = host.rsplit('.').next().unwrap_or(host);
    !last.is_empty()
        && (last.bytes().all(|b| b.is_ascii_digit())
            || last
                .strip_prefix("0x")
                .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit())))
}

/// Strict dotted-quad IPv4: four decimal octets without leading zeros.
fn parse_ipv4(text: &str) -> std::result::Result<Ipv4Addr, String> {
    let octets: Vec<&str> = text.split('.').collect();
    let strict = octets.len() == 4
        && octets.iter().all(|o| {
            !o.is_empty()
                && o.len() <= 3
                && o.bytes().all(|b| b.is_ascii_digit())
                && !(o.len() > 1 && o.starts_with('0'))
        });
    strict
        .then(|| text.parse::<Ipv4Addr>().ok())
        .flatten()
        .ok_or_else(|| {
            format!("{text:?} is not a dotted-quad IPv4 address (decimal, octal, hexadecimal and short forms are refused)")
        })
}

/// IPv6, refusing the IPv4-mapped and IPv4-compatible forms.
fn parse_ipv6(text: &str) -> std::result::Result<Ipv6Addr, String> {
    let ip = text
        .parse::<Ipv6Addr>()
        .map_err(|_| format!("{text:?} is not an IPv6 address"))?;
    if let Some(dotted) = text.rsplit(':').next().filter(|t| t.contains('.')) {
        parse_ipv4(dotted)?;
    }
    match ReservedRange::of(IpAddr::V6(ip)) {
        Some((range @ (ReservedRange::Ipv4Mapped | ReservedRange::Ipv4Compatible), _)) => Err(
            format!("{text:?} is {range} IPv6; give the IPv4 address itself"),
        ),
        _ => Ok(ip),
    }
}

/// LDH host name: 1-253 characters, labels of 1-63 letters, digits and inner hyphens.
fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.len() > MAX_NAME {
        return Err(format!("the name is longer than {MAX_NAME} characters"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(format!(
                "{name:?} has an empty label (a leading, trailing or double dot)"
            ));
        }
        if label.len() > MAX_LABEL {
            return Err(format!(
                "{name:?} has a label longer than {MAX_LABEL} characters"
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(format!(
                "{name:?} contains {c:?}; names are letters, digits, '-' and '.'"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("{name:?} has a label starting or ending with '-'"));
        }
    }
    Ok(())
}

/// Checks the host of a rule; the error names the rule and the reason.
pub(crate) fn validate_rule(rule: &NetRule) -> Result<()> {
    compile_rule(rule).map(|_| ())
}

/// One compiled rule.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Compiled {
    text: String,
    target: Target,
    port: Option<u16>,
}

impl Compiled {
    fn admits_port(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }
}

fn compile_rule(rule: &NetRule) -> Result<Compiled> {
    let invalid = |why: String| Error::invalid(format!("invalid network rule {rule}: {why}"));
    if rule.port == Some(0) {
        return Err(invalid("port 0 is not a port; use 1-65535".into()));
    }
    let target = parse_target(&rule.host).map_err(invalid)?;
    Ok(Compiled {
        text: rule.to_string(),
        target,
        port: rule.port,
    })
}

/// A compiled allowlist: validated once, then checked per connection without I/O.
///
/// An empty policy denies everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    rules: Vec<Compiled>,
    host_addrs: Vec<IpAddr>,
}

impl EgressPolicy {
    /// Compiles the rules of [`crate::Net::Allow`]. An invalid rule is an
    /// [`Error::InvalidRequest`] naming the rule and the reason.
    pub fn new(rules: &[NetRule]) -> Result<EgressPolicy> {
        Ok(EgressPolicy {
            rules: rules.iter().map(compile_rule).collect::<Result<_>>()?,
            host_addrs: Vec::new(),
        })
    }

    /// A policy that denies everything (the same as an empty rule list).
    pub fn deny_all() -> EgressPolicy {
        EgressPolicy::default()
    }

    /// Adds the host's own addresses (its interfaces, public or not): a name resolving to
    /// one is refused unless a rule names exactly that address.
    pub fn with_host_addrs(mut self, addrs: impl IntoIterator<Item = IpAddr>) -> EgressPolicy {
        self.host_addrs.extend(addrs);
        self
    }

    /// Whether the policy has no rules (and so denies everything).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Before resolution: may `host:port` be reached? A name needs a name rule (an IP or
    /// CIDR rule never admits a name, so names outside the allowlist are never resolved);
    /// an IP literal is checked in full, as [`EgressPolicy::check_addr`] would.
    ///
    /// An allowed name still needs [`EgressPolicy::check_addr`] for each address it
    /// resolves to.
    pub fn check_name(&self, host: &str, port: u16) -> Decision {
        match Host::parse(host) {
            Err(reason) => Decision::deny(DenyReason::InvalidName { reason }),
            Ok(Host::Ip(ip)) => self.check_ip(ip, port),
            Ok(Host::Name(name)) => self.check_parsed_name(&name, port),
        }
    }

    /// Before resolution when no port is known yet (a WASI `ip-name-lookup`, which resolves
    /// a bare name and connects later): may `host` be resolved at all? A name needs a name
    /// rule that matches it, whatever port that rule admits, so a name outside the
    /// allowlist is never resolved; an IP literal needs an IP/CIDR rule containing it (it is
    /// not resolved either way).
    ///
    /// This admits strictly more than [`EgressPolicy::check_name`] for some port: every
    /// connection is still checked with [`EgressPolicy::check_addr`] for its port.
    pub fn check_lookup(&self, host: &str) -> Decision {
        let parsed = match Host::parse(host) {
            Err(reason) => return Decision::deny(DenyReason::InvalidName { reason }),
            Ok(parsed) => parsed,
        };
        let matching = self
            .rules
            .iter()
            .find(|rule| match (&rule.target, &parsed) {
                (Target::Net(net), Host::Ip(ip)) => net.contains(*ip),
                (Target::Net(_), Host::Name(_)) | (_, Host::Ip(_)) => false,
                (target, Host::Name(name)) => name_matches(target, name),
            });
        match matching {
            Some(rule) => Decision::Allow {
                rule: rule.text.clone(),
            },
            None => Decision::deny(DenyReason::NoRule),
        }
    }

    /// At `connect()` time: may the tool connect to `addr:port`, which `host` resolved to
    /// (or which `host` is, for an IP literal)? The host must pass
    /// [`EgressPolicy::check_name`], and `addr` must be outside the [`ReservedRange`]s
    /// and the host's own addresses unless an IP/CIDR rule opens it explicitly:
    ///
    /// - a reserved address is opened only by a rule admitting the port whose network lies
    ///   entirely inside the most specific reserved range containing the address, so
    ///   `10.0.0.0/8` opens `10.1.2.3` but `0.0.0.0/0` does not, and
    ///   `169.254.169.254/32` (and only it) opens the metadata service;
    /// - one of the host's own addresses only by a rule naming exactly that address.
    pub fn check_addr(&self, host: &str, addr: IpAddr, port: u16) -> Decision {
        match Host::parse(host) {
            Err(reason) => Decision::deny(DenyReason::InvalidName { reason }),
            Ok(Host::Ip(ip)) if ip != addr => {
                Decision::deny(DenyReason::AddressMismatch { host: ip, addr })
            }
            Ok(Host::Ip(ip)) => self.check_ip(ip, port),
            Ok(Host::Name(name)) => match self.check_parsed_name(&name, port) {
                Decision::Allow { rule } => match self.opening_needed(addr, port) {
                    None => Decision::Allow { rule },
                    Some(decision) => decision,
                },
                deny => deny,
            },
        }
    }

    fn check_parsed_name(&self, name: &str, port: u16) -> Decision {
        let mut named = false;
        for rule in &self.rules {
            if name_matches(&rule.target, name) {
                named = true;
                if rule.admits_port(port) {
                    return Decision::Allow {
                        rule: rule.text.clone(),
                    };
                }
            }
        }
        Decision::deny(if named {
            DenyReason::PortNotAllowed { port }
        } else {
            DenyReason::NoRule
        })
    }

    /// An IP literal: an IP/CIDR rule must admit it, and open it if it is reserved.
    fn check_ip(&self, ip: IpAddr, port: u16) -> Decision {
        let mut named = false;
        let mut admitting = None;
        for rule in &self.rules {
            if let Target::Net(net) = &rule.target {
                if net.contains(ip) {
                    named = true;
                    if rule.admits_port(port) {
                        admitting = Some(rule);
                        break;
                    }
                }
            }
        }
        let Some(rule) = admitting else {
            return Decision::deny(if named {
                DenyReason::PortNotAllowed { port }
            } else {
                DenyReason::NoRule
            });
        };
        self.opening_needed(ip, port).unwrap_or(Decision::Allow {
            rule: rule.text.clone(),
        })
    }

    /// `None` if `addr` is an ordinary address; otherwise the decision for a reserved or
    /// host address: allowed by the rule that opens it explicitly, or denied.
    fn opening_needed(&self, addr: IpAddr, port: u16) -> Option<Decision> {
        if self.host_addrs.contains(&addr) {
            let exact = self.rules.iter().find(|rule| {
                rule.admits_port(port)
                    && matches!(&rule.target, Target::Net(net) if net.addr == addr && net.prefix == full(addr))
            });
            return Some(match exact {
                Some(rule) => Decision::Allow {
                    rule: rule.text.clone(),
                },
                None => Decision::deny(DenyReason::HostAddress { addr }),
            });
        }
        let (range, range_net) = ReservedRange::of(addr)?;
        let opener = self.rules.iter().find(|rule| {
            rule.admits_port(port)
                && matches!(&rule.target, Target::Net(net) if net.contains(addr) && net.is_within(&range_net))
        });
        Some(match opener {
            Some(rule) => Decision::Allow {
                rule: rule.text.clone(),
            },
            None => Decision::deny(DenyReason::DeniedRange {
                range,
                net: range_net,
            }),
        })
    }
}

/// Whether the name rule `target` matches `name` (an IP/CIDR rule never matches a name).
fn name_matches(target: &Target, name: &str) -> bool {
    match target {
        Target::Exact(exact) => exact == name,
        Target::Below(domain) => name
            .strip_suffix(domain.as_str())
            .and_then(|prefix| prefix.strip_suffix('.'))
            .is_some_and(|label| !label.is_empty()),
        Target::Net(_) => false,
    }
}

/// The prefix length of a single address of the family of `addr`.
fn full(addr: IpAddr) -> u8 {
    if addr.is_ipv4() {
        32
    } else {
        128
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::Net;
    use crate::ErrorKind;

    fn policy(rules: &str) -> EgressPolicy {
        let net: Net = format!("allow:{rules}").parse().expect("rules parse");
        let Net::Allow(rules) = net else {
            panic!("not an allowlist")
        };
        EgressPolicy::new(&rules).expect("rules compile")
    }

    fn refused(rule: &str) -> String {
        let err = rule.parse::<NetRule>().expect_err(rule);
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{rule}");
        let text = err.to_string();
        assert!(text.contains("invalid network rule"), "{text}");
        text
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
    }

    fn denied_by(decision: Decision) -> DenyReason {
        match decision {
            Decision::Deny { reason } => reason,
            Decision::Allow { rule } => panic!("allowed by {rule}"),
        }
    }

    fn allowed_by(decision: Decision) -> String {
        match decision {
            Decision::Allow { rule } => rule,
            Decision::Deny { reason } => panic!("denied: {reason}"),
        }
    }

    #[test]
    fn nul_byte_in_a_host_cannot_match_a_wildcard() {
        let p = policy("*.github.com:443");
        for host in [
            "evil.com\0.github.com",
            "evil.com\0x.github.com",
            "api.github.com\0",
        ] {
            assert!(
                matches!(
                    denied_by(p.check_name(host, 443)),
                    DenyReason::InvalidName { .. }
                ),
                "{host:?}"
            );
            let err = NetRule {
                host: host.into(),
                port: None,
            };
            assert!(crate::validate::net_rule(&err).is_err(), "{host:?}");
        }
        refused("*.github.com\0");
    }

    #[test]
    fn smuggling_characters_are_refused_in_rules_and_requests() {
        let p = policy("*.github.com");
        for host in [
            "evil.com\r\nhost: x.github.com",
            "evil.com\n.github.com",
            "user@api.github.com",
            "evil.com%00.github.com",
            "fe80::1%eth0",
            "api .github.com",
            "api\t.github.com",
            "evil.com/.github.com",
            "evil.com\\.github.com",
            "api.github.com.",
            ".github.com",
            "a..github.com",
            "-a.github.com",
            "a_b.github.com",
            "bücher.github.com",
            "",
        ] {
            assert!(
                matches!(
                    denied_by(p.check_name(host, 443)),
                    DenyReason::InvalidName { .. }
                ),
                "{host:?}"
            );
            assert!(host.parse::<NetRule>().is_err(), "{host:?}");
        }
    }

    #[test]
    fn overlong_names_and_labels_are_refused() {
        let label = "a".repeat(64);
        refused(&format!("{label}.example.com"));
        let long = format!("{}example.com", "abcdefghi.".repeat(25));
        assert!(long.len() > 253);
        refused(&long);
        let ok = format!("{}.example.com", "a".repeat(63));
        ok.parse::<NetRule>().expect("63-character label");
    }

    #[test]
    fn decimal_ipv4_forms_are_refused() {
        for form in [
            "2130706433",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "0x7f000001",
            "127.1",
            "127.0.1",
            "127.000.000.001",
            "1.2.3.4.5",
            "example.0x1f",
            "example.123",
        ] {
            let text = refused(form);
            assert!(text.contains(form), "the error names the rule: {text}");
            assert!(
                matches!(
                    denied_by(policy("127.0.0.1:80").check_name(form, 80)),
                    DenyReason::InvalidName { .. }
                ),
                "{form}"
            );
        }
        "127.0.0.1".parse::<NetRule>().expect("dotted quad");
    }

    #[test]
    fn ipv4_mapped_ipv6_is_refused_as_a_rule_and_a_host() {
        for form in [
            "::ffff:127.0.0.1",
            "::ffff:7f00:1",
            "::127.0.0.1",
            "[::ffff:169.254.169.254]:80",
            "::ffff:10.0.0.0/104",
            "64:ff9b::0177.0.0.1",
        ] {
            refused(form);
        }
        let p = policy("0.0.0.0/0:80");
        assert!(matches!(
            denied_by(p.check_name("::ffff:169.254.169.254", 80)),
            DenyReason::InvalidName { .. }
        ));
    }

    #[test]
    fn ipv4_mapped_ipv6_cannot_bypass_denied_ranges() {
        let p = policy("api.example.com:443,169.254.169.254:443,127.0.0.1:443");
        for mapped in ["::ffff:169.254.169.254", "::ffff:127.0.0.1", "::a9fe:a9fe"] {
            let reason = denied_by(p.check_addr("api.example.com", ip(mapped), 443));
            assert!(
                matches!(
                    reason,
                    DenyReason::DeniedRange {
                        range: ReservedRange::Ipv4Mapped | ReservedRange::Ipv4Compatible,
                        ..
                    }
                ),
                "{mapped}: {reason}"
            );
        }
        for embedded in ["64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1"] {
            assert!(matches!(
                denied_by(p.check_addr("api.example.com", ip(embedded), 443)),
                DenyReason::DeniedRange {
                    range: ReservedRange::Ipv4Embedded,
                    ..
                }
            ));
        }
    }

    #[test]
    fn public_suffix_wildcards_are_refused() {
        for rule in [
            "*.com",
            "*.co.uk",
            "*.github.io",
            "*.corp",
            "*.com:443",
            "*",
            "*.*.com",
            "**.example.com",
            "*example.com",
            "api.*.example.com",
            "*.10.0.0.1",
        ] {
            refused(rule);
        }
        assert!(refused("*.co.uk").contains("public suffix"));
        for rule in ["*.github.com", "*.example.co.uk", "*.user.github.io"] {
            rule.parse::<NetRule>().expect(rule);
        }
    }

    #[test]
    fn wildcard_does_not_match_the_bare_domain_or_lookalikes() {
        let p = policy("*.github.com:443");
        for host in ["api.github.com", "a.b.github.com", "API.GitHub.com"] {
            assert_eq!(allowed_by(p.check_name(host, 443)), "*.github.com:443");
        }
        for host in [
            "github.com",
            "evilgithub.com",
            "github.com.evil.io",
            "api.github.co",
            "api-github.com",
            "github.com.",
        ] {
            let reason = denied_by(p.check_name(host, 443));
            assert!(
                matches!(reason, DenyReason::NoRule | DenyReason::InvalidName { .. }),
                "{host}: {reason}"
            );
        }
    }

    #[test]
    fn exact_names_match_only_themselves() {
        let p = policy("api.github.com:443");
        assert!(p.check_name("api.github.com", 443).is_allowed());
        for host in ["x.api.github.com", "github.com", "api.github.com.evil.io"] {
            assert_eq!(denied_by(p.check_name(host, 443)), DenyReason::NoRule);
        }
    }

    #[test]
    fn ports_are_enforced() {
        let p = policy("api.example.com:8443,files.example.com,10.1.0.0/16:5432");
        assert!(p.check_name("api.example.com", 8443).is_allowed());
        assert_eq!(
            denied_by(p.check_name("api.example.com", 443)),
            DenyReason::PortNotAllowed { port: 443 }
        );
        for port in DEFAULT_PORTS {
            assert!(p.check_name("files.example.com", port).is_allowed());
        }
        for port in [22, 25, 8080, 0, 65535] {
            assert_eq!(
                denied_by(p.check_name("files.example.com", port)),
                DenyReason::PortNotAllowed { port }
            );
        }
        assert!(p.check_name("10.1.2.3", 5432).is_allowed());
        assert_eq!(
            denied_by(p.check_name("10.1.2.3", 22)),
            DenyReason::PortNotAllowed { port: 22 }
        );
        for rule in [
            "a.com:0",
            "a.com:65536",
            "a.com:+443",
            "a.com:0443",
            "a.com:",
        ] {
            refused(rule);
        }
    }

    #[test]
    fn empty_allowlist_denies_everything() {
        let empty: Net = "allow:".parse().expect("empty");
        let Net::Allow(rules) = empty else {
            panic!("not an allowlist")
        };
        let p = EgressPolicy::new(&rules).expect("empty compiles");
        assert!(p.is_empty());
        assert_eq!(p, EgressPolicy::deny_all());
        for (host, port) in [
            ("example.com", 443),
            ("example.com", 80),
            ("1.1.1.1", 53),
            ("8.8.8.8", 443),
            ("2606:4700::1111", 443),
        ] {
            assert_eq!(denied_by(p.check_name(host, port)), DenyReason::NoRule);
        }
        assert_eq!(
            denied_by(p.check_addr("example.com", ip("93.184.216.34"), 443)),
            DenyReason::NoRule
        );
    }

    #[test]
    fn a_name_resolving_to_metadata_is_denied_without_an_explicit_cidr() {
        let p = policy("api.example.com");
        assert!(p.check_name("api.example.com", 80).is_allowed());
        assert_eq!(
            denied_by(p.check_addr("api.example.com", ip("169.254.169.254"), 80)),
            DenyReason::DeniedRange {
                range: ReservedRange::CloudMetadata,
                net: IpNet::new(ip("169.254.169.254"), 32).expect("net"),
            }
        );
        // Opening link-local does not open the metadata service: it must be named.
        let wide = policy("api.example.com,169.254.0.0/16");
        assert!(!wide
            .check_addr("api.example.com", ip("169.254.169.254"), 80)
            .is_allowed());
        assert!(wide
            .check_addr("api.example.com", ip("169.254.1.1"), 80)
            .is_allowed());
        let explicit = policy("api.example.com,169.254.169.254/32");
        assert_eq!(
            allowed_by(explicit.check_addr("api.example.com", ip("169.254.169.254"), 80)),
            "169.254.169.254/32"
        );
    }

    #[test]
    fn names_resolving_to_private_loopback_and_other_reserved_ranges_are_denied() {
        let p = policy("api.example.com");
        for (addr, range) in [
            ("127.0.0.1", ReservedRange::Loopback),
            ("0.0.0.0", ReservedRange::Unspecified),
            ("10.0.0.5", ReservedRange::Private),
            ("172.16.0.1", ReservedRange::Private),
            ("192.168.1.1", ReservedRange::Private),
            ("100.64.0.1", ReservedRange::SharedAddressSpace),
            ("169.254.10.10", ReservedRange::LinkLocal),
            ("224.0.0.1", ReservedRange::Multicast),
            ("255.255.255.255", ReservedRange::Broadcast),
            ("192.0.2.1", ReservedRange::Documentation),
            ("198.18.0.1", ReservedRange::Benchmarking),
            ("240.0.0.1", ReservedRange::Reserved),
            ("::", ReservedRange::Unspecified),
            ("::1", ReservedRange::Loopback),
            ("fd00::1", ReservedRange::UniqueLocal),
            ("fd00:ec2::254", ReservedRange::UniqueLocal),
            ("fe80::1", ReservedRange::LinkLocal),
            ("ff02::1", ReservedRange::Multicast),
            ("2001:db8::1", ReservedRange::Documentation),
        ] {
            match denied_by(p.check_addr("api.example.com", ip(addr), 443)) {
                DenyReason::DeniedRange { range: got, net } => {
                    assert_eq!(got, range, "{addr}");
                    assert!(net.contains(ip(addr)), "{addr} in {net}");
                }
                other => panic!("{addr}: {other}"),
            }
        }
        for public in ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"] {
            assert_eq!(
                allowed_by(p.check_addr("api.example.com", ip(public), 443)),
                "api.example.com"
            );
        }
    }

    #[test]
    fn a_catch_all_cidr_does_not_open_reserved_ranges() {
        let p = policy("0.0.0.0/0:443,[::/0]:443,db.internal.example.com:5432,10.0.0.0/8:5432");
        assert!(p.check_name("93.184.216.34", 443).is_allowed());
        for addr in ["10.0.0.1", "127.0.0.1", "169.254.169.254", "::1", "fd00::1"] {
            assert!(
                matches!(
                    denied_by(p.check_name(addr, 443)),
                    DenyReason::DeniedRange { .. }
                ),
                "{addr}"
            );
        }
        // A CIDR inside the private range is the explicit opt-in for names resolving there.
        assert_eq!(
            allowed_by(p.check_addr("db.internal.example.com", ip("10.2.3.4"), 5432)),
            "10.0.0.0/8:5432"
        );
        assert!(!p
            .check_addr("db.internal.example.com", ip("192.168.0.1"), 5432)
            .is_allowed());
    }

    #[test]
    fn ip_and_cidr_rules_never_admit_names() {
        let p = policy("0.0.0.0/0,10.0.0.0/8");
        assert_eq!(
            denied_by(p.check_name("anything.example.com", 443)),
            DenyReason::NoRule
        );
        assert_eq!(
            denied_by(p.check_addr("anything.example.com", ip("8.8.8.8"), 443)),
            DenyReason::NoRule
        );
    }

    #[test]
    fn an_ip_literal_cannot_be_connected_to_a_different_address() {
        let p = policy("93.184.216.34");
        assert_eq!(
            denied_by(p.check_addr("93.184.216.34", ip("127.0.0.1"), 443)),
            DenyReason::AddressMismatch {
                host: ip("93.184.216.34"),
                addr: ip("127.0.0.1"),
            }
        );
        assert!(p
            .check_addr("93.184.216.34", ip("93.184.216.34"), 443)
            .is_allowed());
    }

    #[test]
    fn the_hosts_own_address_needs_a_rule_naming_it() {
        let own = ip("203.0.113.200");
        let public_own = ip("93.184.216.34");
        let p = policy("api.example.com,93.184.0.0/16").with_host_addrs([own, public_own]);
        assert_eq!(
            denied_by(p.check_addr("api.example.com", public_own, 443)),
            DenyReason::HostAddress { addr: public_own }
        );
        let named = policy("api.example.com,93.184.216.34").with_host_addrs([public_own]);
        assert_eq!(
            allowed_by(named.check_addr("api.example.com", public_own, 443)),
            "93.184.216.34"
        );
    }

    #[test]
    fn cidr_rules_must_be_canonical() {
        for rule in [
            "10.0.0.1/8",
            "10.0.0.0/33",
            "10.0.0.0/08",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "fd00::1/8",
            "fd00::/129",
            "example.com/8",
        ] {
            refused(rule);
        }
        for rule in [
            "10.0.0.0/8",
            "fd00::/8",
            "[fd00::/8]:443",
            "192.168.1.0/24:8080",
        ] {
            let parsed: NetRule = rule.parse().expect(rule);
            assert_eq!(parsed.to_string(), rule);
        }
    }

    #[test]
    fn a_single_address_rule_covers_only_that_address() {
        let one6 = IpNet::new(ip("2606:4700::1111"), 128).expect("/128");
        assert!(one6.contains(ip("2606:4700::1111")));
        assert!(!one6.contains(ip("2606:4700::1112")));
        assert!(!one6.contains(ip("::1")));
        let one4 = IpNet::new(ip("1.1.1.1"), 32).expect("/32");
        assert!(one4.contains(ip("1.1.1.1")));
        assert!(!one4.contains(ip("1.1.1.2")));
        assert!(!one4.contains(ip("::ffff:1.1.1.1")), "families never mix");
        let all = IpNet::new(ip("0.0.0.0"), 0).expect("/0");
        assert!(all.contains(ip("255.255.255.255")));
        assert!(!all.contains(ip("::1")));
        let p = policy("[2606:4700::1111]:443");
        assert_eq!(
            denied_by(p.check_name("2606:4700::1112", 443)),
            DenyReason::NoRule
        );
        assert!(matches!(
            denied_by(p.check_name("::1", 443)),
            DenyReason::NoRule
        ));
    }

    #[test]
    fn rule_errors_name_the_rule_and_the_reason() {
        let err = EgressPolicy::new(&[NetRule {
            host: "*.co.uk".into(),
            port: Some(443),
        }])
        .expect_err("public suffix");
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        let text = err.to_string();
        assert!(text.contains("*.co.uk:443"), "{text}");
        assert!(text.contains("public suffix"), "{text}");
        let json = r#"{"net":{"allow":[{"host":"0x7f.0.0.1","port":80}]}}"#;
        let err = crate::Caps::from_json(json).expect_err("hex ipv4");
        assert!(err.to_string().contains("0x7f.0.0.1"), "{err}");
    }

    #[test]
    fn the_resolver_gets_the_matched_name_as_an_absolute_name() {
        let host = Host::parse("API.Example.COM").expect("name");
        assert_eq!(host, Host::Name("api.example.com".into()));
        assert_eq!(host.resolver_name().as_deref(), Some("api.example.com."));
        assert_eq!(Host::parse("10.0.0.1").expect("ip").resolver_name(), None);
    }

    #[test]
    fn a_portless_lookup_admits_only_names_some_rule_matches() {
        let p = policy("api.example.com:8443,*.cdn.example.net,10.0.0.0/8:22");
        assert_eq!(
            allowed_by(p.check_lookup("API.example.com")),
            "api.example.com:8443"
        );
        assert_eq!(
            allowed_by(p.check_lookup("a.b.cdn.example.net")),
            "*.cdn.example.net"
        );
        for name in [
            "example.com",
            "cdn.example.net",
            "evil.com",
            "api.example.com.evil",
        ] {
            assert_eq!(
                denied_by(p.check_lookup(name)),
                DenyReason::NoRule,
                "{name}"
            );
        }
        // An IP/CIDR rule never admits a name, and a name rule never an address.
        assert_eq!(allowed_by(p.check_lookup("10.2.3.4")), "10.0.0.0/8:22");
        assert_eq!(denied_by(p.check_lookup("192.0.2.1")), DenyReason::NoRule);
        for bad in ["api.example.com\0", "0x7f.0.0.1", "a@api.example.com", ""] {
            assert!(
                matches!(
                    denied_by(p.check_lookup(bad)),
                    DenyReason::InvalidName { .. }
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            denied_by(EgressPolicy::deny_all().check_lookup("api.example.com")),
            DenyReason::NoRule
        );
    }
}
