//! What the first bytes a client sends through a tunnel say about its destination: the
//! TLS server name (SNI) of a ClientHello, or the `Host` of an HTTP request. The proxy
//! refuses a tunnel whose bytes name another host than the authority the policy allowed
//! (`CONNECT allowed.example:443`, then SNI `evil.example` on a shared front end).
//!
//! The classification fails closed for anything an HTTP server might read as a request: a
//! first line made of a token, a space and anything containing `HTTP/` (in any case, any
//! method token, not only upper-case ones) is HTTP, and it is undecided until its whole
//! head (up to CRLF CRLF) has arrived; whitespace or an empty line before it (which
//! servers skip), or a bare LF ending such a first line (servers split lines differently),
//! is malformed. Only bytes that cannot start an HTTP/1 request are [`FirstBytes::Other`];
//! a first message of token characters alone (`PING` without its line end) is undecided
//! until a byte that ends the token arrives.

/// Largest TLS record (2^14 bytes of payload plus room for compression/expansion, and the
/// 5-byte header), and the largest HTTP head read before deciding.
pub const MAX_FIRST_BYTES: usize = 16 * 1024 + 2048 + 5;

/// The verdict on the bytes seen so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FirstBytes {
    /// Not enough bytes yet to decide.
    NeedMore,
    /// A TLS ClientHello, with its server name if it sends one.
    Tls {
        /// The `server_name` extension's host name.
        sni: Option<String>,
    },
    /// An HTTP/1 request head, with its `Host` header if it has one (the host part,
    /// without a port).
    Http {
        /// The host of the `Host` header.
        host: Option<String>,
    },
    /// Another protocol: nothing to compare.
    Other,
    /// Bytes that claim to be TLS or HTTP but are malformed.
    Malformed(&'static str),
}

/// Classifies the first bytes of a tunnel.
pub fn classify(buf: &[u8]) -> FirstBytes {
    match buf.first() {
        None => FirstBytes::NeedMore,
        Some(0x16) => classify_tls(buf),
        // Servers skip empty lines (and some, whitespace) before a request line.
        Some(b'\r' | b'\n' | b' ' | b'\t') => {
            FirstBytes::Malformed("whitespace or an empty line before the first request")
        }
        Some(&b) if is_tchar(b) => classify_http(buf),
        Some(_) => FirstBytes::Other,
    }
}

/// A byte of an HTTP token (RFC 9110 `tchar`): what a method is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn classify_tls(buf: &[u8]) -> FirstBytes {
    if buf.len() < 5 {
        return FirstBytes::NeedMore;
    }
    if buf[1] != 3 {
        return FirstBytes::Malformed("a TLS record of an unknown version");
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len == 0 || len + 5 > MAX_FIRST_BYTES {
        return FirstBytes::Malformed("a TLS record of an impossible length");
    }
    let Some(record) = buf.get(5..5 + len) else {
        return FirstBytes::NeedMore;
    };
    match client_hello_sni(record) {
        Ok(sni) => FirstBytes::Tls { sni },
        Err(why) => FirstBytes::Malformed(why),
    }
}

/// A byte reader that fails instead of panicking.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("a truncated TLS ClientHello");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<usize, &'static str> {
        Ok(usize::from(self.take(1)?[0]))
    }
    fn u16(&mut self) -> Result<usize, &'static str> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn u24(&mut self) -> Result<usize, &'static str> {
        let b = self.take(3)?;
        Ok((usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
}

/// The host name of the `server_name` extension of the ClientHello that fills `record`
/// (a ClientHello split over several records is refused: clients send it in one).
fn client_hello_sni(record: &[u8]) -> Result<Option<String>, &'static str> {
    let mut r = Reader(record);
    if r.u8()? != 1 {
        return Err("the first TLS handshake message is not a ClientHello");
    }
    let len = r.u24()?;
    let mut hello = Reader(
        r.take(len)
            .map_err(|_| "a ClientHello split over TLS records")?,
    );
    hello.take(2 + 32)?; // legacy version, random
    let session = hello.u8()?;
    hello.take(session)?;
    let suites = hello.u16()?;
    hello.take(suites)?;
    let compression = hello.u8()?;
    hello.take(compression)?;
    if hello.0.is_empty() {
        return Ok(None);
    }
    let extensions_len = hello.u16()?;
    let mut extensions = Reader(hello.take(extensions_len)?);
    let mut found = None;
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let len = extensions.u16()?;
        let body = extensions.take(len)?;
        if kind != 0 {
            continue;
        }
        if found.is_some() {
            return Err("two server_name extensions");
        }
        let mut names = Reader(body);
        let list_len = names.u16()?;
        let mut list = Reader(names.take(list_len)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name_len = list.u16()?;
            let name = list.take(name_len)?;
            if name_type != 0 {
                continue;
            }
            if found.is_some() {
                return Err("two host names in server_name");
            }
            let name = std::str::from_utf8(name).map_err(|_| "a server name that is not text")?;
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err("a server name with control characters or spaces");
            }
            found = Some(name.to_ascii_lowercase());
        }
    }
    Ok(found)
}

fn classify_http(buf: &[u8]) -> FirstBytes {
    let too_long = || FirstBytes::Malformed("an HTTP request head too long to inspect");
    // A token (the method, in whatever case), then a space: anything else is another
    // protocol (`SSH-2.0-...`, a Redis `PING`, binary framing).
    match buf.iter().position(|&b| !is_tchar(b)) {
        None if buf.len() >= MAX_FIRST_BYTES => return too_long(),
        None => return FirstBytes::NeedMore,
        Some(end) if buf[end] == b' ' => {}
        Some(_) => return FirstBytes::Other,
    }
    // The request line: with an HTTP version, it is HTTP; without one it is another
    // line-based protocol (SMTP's `EHLO host`, FTP's `USER name`; an HTTP/0.9 request has
    // no headers, so no `Host` to route by).
    let Some(line_end) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() >= MAX_FIRST_BYTES {
            too_long()
        } else {
            FirstBytes::NeedMore
        };
    };
    // Servers that end lines at a bare LF and servers that end them at CRLF only would
    // read different request lines (and headers) out of the same bytes.
    let Some(line) = buf[..line_end].strip_suffix(b"\r") else {
        return FirstBytes::Malformed("a bare LF ending what could be a request line");
    };
    if !line.windows(5).any(|w| w.eq_ignore_ascii_case(b"HTTP/")) {
        return FirstBytes::Other;
    }
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() >= MAX_FIRST_BYTES {
            too_long()
        } else {
            FirstBytes::NeedMore
        };
    };
    let Ok(head) = std::str::from_utf8(&buf[..end]) else {
        return FirstBytes::Malformed("an HTTP request head that is not text");
    };
    let mut host = None;
    for line in head.split("\r\n").skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return FirstBytes::Malformed("two Host headers");
            }
            let value = value.trim().to_ascii_lowercase();
            let bare = match value.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or_default().to_string(),
                None => value.split(':').next().unwrap_or_default().to_string(),
            };
            host = Some(bare);
        }
    }
    FirstBytes::Http { host }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello record with the given server names.
    fn client_hello(names: &[&str]) -> Vec<u8> {
        let mut sni = Vec::new();
        for name in names {
            sni.push(0u8);
            sni.extend((name.len() as u16).to_be_bytes());
            sni.extend(name.as_bytes());
        }
        let mut ext_body = (sni.len() as u16).to_be_bytes().to_vec();
        ext_body.extend(&sni);
        let mut extensions = Vec::new();
        // An unrelated extension first (supported_groups), then server_name.
        extensions.extend([0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x1d]);
        if !names.is_empty() {
            extensions.extend([0x00, 0x00]);
            extensions.extend((ext_body.len() as u16).to_be_bytes());
            extensions.extend(&ext_body);
        }
        let mut hello = vec![0x03, 0x03];
        hello.extend([7u8; 32]);
        hello.push(0); // no session id
        hello.extend([0x00, 0x02, 0x13, 0x01]); // one cipher suite
        hello.extend([0x01, 0x00]); // null compression
        hello.extend((extensions.len() as u16).to_be_bytes());
        hello.extend(&extensions);
        let mut handshake = vec![1u8];
        handshake.extend(&(hello.len() as u32).to_be_bytes()[1..]);
        handshake.extend(&hello);
        let mut record = vec![0x16, 0x03, 0x01];
        record.extend((handshake.len() as u16).to_be_bytes());
        record.extend(&handshake);
        record
    }

    #[test]
    fn sni_is_read_from_a_client_hello() {
        assert_eq!(
            classify(&client_hello(&["API.Example.com"])),
            FirstBytes::Tls {
                sni: Some("api.example.com".into())
            }
        );
        assert_eq!(classify(&client_hello(&[])), FirstBytes::Tls { sni: None });
    }

    #[test]
    fn a_partial_client_hello_needs_more_at_every_length() {
        let full = client_hello(&["example.com"]);
        for n in 0..full.len() {
            assert_eq!(classify(&full[..n]), FirstBytes::NeedMore, "at {n} bytes");
        }
    }

    #[test]
    fn every_truncation_inside_the_record_is_malformed_not_a_panic() {
        let full = client_hello(&["example.com"]);
        for cut in 6..full.len() {
            let mut bytes = full[..cut].to_vec();
            let len = (cut - 5) as u16;
            bytes[3..5].copy_from_slice(&len.to_be_bytes());
            let verdict = classify(&bytes);
            assert!(
                matches!(verdict, FirstBytes::Malformed(_) | FirstBytes::Tls { .. }),
                "at {cut}: {verdict:?}"
            );
        }
    }

    #[test]
    fn two_server_names_or_control_bytes_are_malformed() {
        assert!(matches!(
            classify(&client_hello(&["a.example", "b.example"])),
            FirstBytes::Malformed(_)
        ));
        assert!(matches!(
            classify(&client_hello(&["a.example\0.evil"])),
            FirstBytes::Malformed(_)
        ));
    }

    #[test]
    fn http_host_is_read_without_its_port() {
        let head = b"GET / HTTP/1.1\r\nHost: Example.com:8080\r\nAccept: */*\r\n\r\n";
        assert_eq!(
            classify(head),
            FirstBytes::Http {
                host: Some("example.com".into())
            }
        );
        assert_eq!(classify(&head[..20]), FirstBytes::NeedMore);
        let v6 = b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n";
        assert_eq!(
            classify(v6),
            FirstBytes::Http {
                host: Some("2001:db8::1".into())
            }
        );
        assert!(matches!(
            classify(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            FirstBytes::Malformed(_)
        ));
    }

    #[test]
    fn other_protocols_are_other() {
        assert_eq!(classify(b"SSH-2.0-OpenSSH_9.2\r\n"), FirstBytes::Other);
        assert_eq!(classify(b"\x00\x01binary"), FirstBytes::Other);
        assert_eq!(classify(b"EHLO client.example\r\n"), FirstBytes::Other);
        assert_eq!(classify(b"PING\r\n"), FirstBytes::Other);
        assert_eq!(classify(b"GET /index.html\r\n"), FirstBytes::Other);
        assert_eq!(classify(b"EHLO client.example"), FirstBytes::NeedMore);
        assert!(matches!(
            classify(b"GET /\nHost:evil.example\nX: HTTP/1.1\r\n\r\n"),
            FirstBytes::Malformed(_)
        ));
    }

    #[test]
    fn an_empty_line_or_whitespace_before_a_request_cannot_hide_its_host() {
        for bytes in [
            &b"\r\nGET / HTTP/1.1\r\nHost: evil.example\r\n\r\n"[..],
            b"\nGET / HTTP/1.1\r\nHost: evil.example\r\n\r\n",
            b" GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        ] {
            assert!(
                matches!(classify(bytes), FirstBytes::Malformed(_)),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn any_method_token_or_version_case_is_http_so_its_host_is_checked() {
        for bytes in [
            &b"get / HTTP/1.1\r\nHost: evil.example\r\n\r\n"[..],
            b"M-SEARCH * HTTP/1.1\r\nHost: evil.example\r\n\r\n",
            b"GET / http/1.1\r\nHost: evil.example\r\n\r\n",
            b"GET /\xc3\xa9 HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        ] {
            assert_eq!(
                classify(bytes),
                FirstBytes::Http {
                    host: Some("evil.example".into())
                },
                "{bytes:?}"
            );
        }
        // HTTP/2 with prior knowledge: an HTTP head without a Host (refused by the strict
        // parser, which takes only HTTP/1.0 and HTTP/1.1).
        assert_eq!(
            classify(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            FirstBytes::Http { host: None }
        );
    }

    #[test]
    fn a_head_that_never_ends_is_undecided_then_malformed() {
        let mut head = b"GET / HTTP/1.1\r\nHost: evil.example\n\n".to_vec();
        assert_eq!(classify(&head), FirstBytes::NeedMore);
        head.resize(MAX_FIRST_BYTES, b'a');
        assert!(matches!(classify(&head), FirstBytes::Malformed(_)));
        let token = vec![b'A'; MAX_FIRST_BYTES];
        assert!(matches!(classify(&token), FirstBytes::Malformed(_)));
    }
}
