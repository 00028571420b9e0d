//! Network allowlists on the process backend, against real servers: an upstream in its own
//! network namespace (see `egress_common`), reached only through Strata's egress proxy.
//! Each test is named after what it stops. Most need root (network namespaces, veth pairs,
//! `/etc/hosts`); the unprivileged embedder's test runs a copy of this binary as uid 65534.

mod common;
mod egress_common;

use std::io::{Read, Write};
use std::net::TcpListener;

use common::{ok_stdout, require_root, sandbox, sh, stderr, stdout, PY};
use egress_common::{Upstream, HELLO, HTTPS_PORT, HTTP_PORT};
use strata::{
    ByteSize, Capability, Caps, ErrorKind, LimitKind, Mechanism, Net, NetRule, RunOutput, Sandbox,
    Tool,
};
use strata::{EgressDecision, EgressRefusal, NetworkReceipt};

fn allow(rules: &[String]) -> Caps {
    let rules: Vec<NetRule> = rules
        .iter()
        .map(|r| r.parse().unwrap_or_else(|e| panic!("rule {r}: {e}")))
        .collect();
    Caps::new().net(Net::Allow(rules))
}

fn run_with(sandbox: &Sandbox, tool: &Tool, caps: &Caps) -> RunOutput {
    sandbox
        .run(tool, caps)
        .unwrap_or_else(|e| panic!("run refused: {e}"))
}

fn network(out: &RunOutput) -> &NetworkReceipt {
    out.receipt
        .network
        .as_ref()
        .unwrap_or_else(|| panic!("no network section in {:?}", out.receipt))
}

fn refusals(out: &RunOutput) -> Vec<&EgressDecision> {
    network(out)
        .decisions
        .iter()
        .filter(|d| !d.allowed)
        .collect()
}

/// Stdout's lines, trimmed.
fn lines(out: &RunOutput) -> Vec<String> {
    stdout(out).lines().map(|l| l.trim().to_string()).collect()
}

/// `curl` printing only the HTTP status (000 when it could not connect at all).
fn curl_status(url: &str, extra: &str) -> String {
    format!("curl -sS -m 10 -o /dev/null -w '%{{http_code}}\\n' {extra} '{url}'; true")
}

#[test]
fn allowed_host_is_reached_over_http_and_https_by_curl_and_python() {
    if !require_root("allowed_host_is_reached_over_http_and_https_by_curl_and_python") {
        return;
    }
    let up = Upstream::start();
    let caps = allow(&[
        format!("{}:{HTTP_PORT}", up.name),
        format!("{}:{HTTPS_PORT}", up.name),
    ])
    .read_only(up.dir.path());
    let cert = up.cert();
    let script = format!(
        "curl -sS -m 10 {http}; echo; curl -sS -m 10 --cacert {cert} {https}; echo; \
         {PY} -c 'import ssl, urllib.request as u; \
         print(u.urlopen(\"{http}\", timeout=10).read().decode()); \
         c = ssl.create_default_context(cafile=\"{cert}\"); \
         print(u.urlopen(\"{https}\", timeout=10, context=c).read().decode())'",
        http = up.http_url("hello"),
        https = up.https_url("hello"),
        cert = cert.display(),
    );
    let out = run_with(&sandbox(), &sh(&script), &caps);
    let text = ok_stdout(&out);
    assert_eq!(text.matches(HELLO).count(), 4, "{text}\n{}", stderr(&out));
    let net = network(&out);
    assert_eq!(net.enforcer, "127.0.0.1:3128");
    assert_eq!(net.decisions.len(), 4, "{net:?}");
    for decision in &net.decisions {
        assert!(decision.allowed, "{decision:?}");
        assert_eq!(decision.host, up.name);
        assert_eq!(decision.addr, Some(up.ip.into()), "pinned address");
    }
    assert!(net.bytes > 0);
    assert!(
        out.receipt.has_kind(Capability::Net, Mechanism::Proxy),
        "{:?}",
        out.receipt
    );
}

#[test]
fn unlisted_host_unlisted_port_and_unlisted_ip_literal_are_refused_and_logged() {
    if !require_root("unlisted_host_unlisted_port_and_unlisted_ip_literal_are_refused_and_logged") {
        return;
    }
    let up = Upstream::start();
    let caps = allow(&[format!("{}:{HTTP_PORT}", up.name)]);
    let script = [
        curl_status(&up.http_url("hello"), ""),
        curl_status(&format!("http://{}:{HTTPS_PORT}/", up.name), ""),
        curl_status("http://example.com/", ""),
        curl_status(&format!("http://{}:{HTTP_PORT}/", up.ip), ""),
    ]
    .join(";");
    let out = run_with(&sandbox(), &sh(&script), &caps);
    let codes = lines(&out);
    assert_eq!(codes, ["200", "403", "403", "403"], "{}", stderr(&out));
    let refused = refusals(&out);
    assert_eq!(refused.len(), 3, "{refused:?}");
    for decision in &refused {
        assert_eq!(
            decision.refusal,
            Some(EgressRefusal::Policy),
            "{decision:?}"
        );
        assert!(decision.reason.is_some());
    }
    assert_eq!(refused[0].port, HTTPS_PORT);
    assert_eq!(refused[1].host, "example.com");
    assert_eq!(refused[2].host, up.ip.to_string());
    assert!(
        out.receipt
            .denials
            .iter()
            .any(|d| d.detail.contains("example.com:80")),
        "{:?}",
        out.receipt.denials
    );
}

#[test]
fn tls_or_http_naming_another_host_inside_an_allowed_tunnel_is_cut() {
    if !require_root("tls_or_http_naming_another_host_inside_an_allowed_tunnel_is_cut") {
        return;
    }
    let up = Upstream::start();
    let caps = allow(&[
        format!("{}:{HTTP_PORT}", up.name),
        format!("{}:{HTTPS_PORT}", up.name),
    ])
    .read_only(up.dir.path());
    // curl --connect-to tunnels to the allowed host while its TLS server name (and its
    // Host header) name another: the front-end trick of domain fronting.
    let fronted = |scheme: &str, port: u16| {
        format!(
            "curl -sS -m 10 -o /dev/null -w '%{{http_code}}\\n' --proxytunnel --cacert {cert} \
             --connect-to evil.example:{port}:{name}:{port} {scheme}://evil.example:{port}/; true",
            cert = up.cert().display(),
            name = up.name,
        )
    };
    let script = [
        fronted("https", HTTPS_PORT),
        fronted("http", HTTP_PORT),
        format!(
            "curl -sS -m 10 -o /dev/null -w '%{{http_code}}\\n' --cacert {} {}",
            up.cert().display(),
            up.https_url("hello")
        ),
    ]
    .join(";");
    let out = run_with(&sandbox(), &sh(&script), &caps);
    let codes = lines(&out);
    assert_eq!(codes, ["000", "000", "200"], "{}", stderr(&out));
    let cut: Vec<&EgressDecision> = refusals(&out)
        .into_iter()
        .filter(|d| d.refusal == Some(EgressRefusal::BadRequest))
        .collect();
    assert_eq!(cut.len(), 2, "{:?}", network(&out));
    assert!(
        cut[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("TLS server name")),
        "{cut:?}"
    );
    assert!(
        cut[1]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("HTTP Host")),
        "{cut:?}"
    );
}

#[test]
fn tool_ignoring_proxy_variables_is_intercepted_transparently() {
    if !require_root("tool_ignoring_proxy_variables_is_intercepted_transparently") {
        return;
    }
    let up = Upstream::start();
    let caps = allow(&[
        format!("{}:{HTTP_PORT}", up.name),
        format!("{}:{HTTPS_PORT}", up.name),
    ])
    .read_only(up.dir.path());
    // No proxy variables at all: the name resolves (sandbox /etc/hosts) to a synthetic
    // address whose connections the proxy takes, checks and forwards.
    let script = format!(
        "unset http_proxy https_proxy all_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY; \
         curl -sS -m 10 {http}; echo; curl -sS -m 10 --cacert {cert} {https}; echo; \
         {PY} -c 'import ssl, urllib.request as u; \
         print(u.urlopen(\"{http}\", timeout=10).read().decode())'; \
         curl -sS -m 10 -o /dev/null -w '%{{http_code}}\\n' --cacert {cert} \
         --connect-to evil.example:{HTTPS_PORT}:{name}:{HTTPS_PORT} https://evil.example:{HTTPS_PORT}/; true",
        http = up.http_url("hello"),
        https = up.https_url("hello"),
        cert = up.cert().display(),
        name = up.name,
    );
    let out = run_with(&sandbox(), &sh(&script), &caps);
    let text = ok_stdout(&out);
    assert_eq!(text.matches(HELLO).count(), 3, "{text}\n{}", stderr(&out));
    assert!(
        text.ends_with("000\n"),
        "SNI naming another host must be cut: {text}"
    );
    let net = network(&out);
    let allowed: Vec<&EgressDecision> = net.decisions.iter().filter(|d| d.allowed).collect();
    assert_eq!(allowed.len(), 4, "{net:?}");
    assert!(allowed
        .iter()
        .all(|d| d.host == up.name && d.addr == Some(up.ip.into())));
    let cut = refusals(&out);
    assert!(
        matches!(&cut[..], [d] if d.reason.as_deref().is_some_and(|r| r.contains("evil.example"))),
        "{cut:?}"
    );
}

#[test]
fn connecting_around_the_proxy_reaches_nothing() {
    if !require_root("connecting_around_the_proxy_reaches_nothing") {
        return;
    }
    let up = Upstream::start();
    let caps = allow(&[format!("{}:{HTTP_PORT}", up.name)]);
    // The upstream's own address, without the proxy: no interface but loopback, no route.
    let code = format!(
        "import socket, errno\n\
         for addr in [('{ip}', {HTTP_PORT}), ('1.1.1.1', 443)]:\n\
         \x20   s = socket.socket()\n\
         \x20   s.settimeout(5)\n\
         \x20   try:\n\
         \x20       s.connect(addr); print('connected', addr)\n\
         \x20   except OSError as e:\n\
         \x20       print('refused', errno.errorcode.get(e.errno, e.errno))\n",
        ip = up.ip
    );
    let out = run_with(&sandbox(), &Tool::command([PY, "-c", &code]), &caps);
    let text = ok_stdout(&out);
    assert!(!text.contains("connected"), "{text}");
    assert_eq!(text.matches("refused ENETUNREACH").count(), 2, "{text}");
    // By address, around the proxy: nothing routes there. A synthetic address no allowed
    // name has lands on the transparent listener and is refused.
    let script = [
        curl_status(
            &format!("http://{}:{HTTP_PORT}/hello", up.ip),
            "--noproxy '*'",
        ),
        curl_status(
            &format!("http://198.18.0.200:{HTTP_PORT}/hello"),
            "--noproxy '*'",
        ),
    ]
    .join(";");
    let bypass = run_with(&sandbox(), &sh(&script), &caps);
    assert_eq!(lines(&bypass), ["000", "000"], "{}", stderr(&bypass));
    let refused = refusals(&bypass);
    assert_eq!(refused.len(), 1, "{:?}", network(&bypass));
    assert_eq!(refused[0].host, "198.18.0.200");
    assert!(network(&bypass).decisions.iter().all(|d| !d.allowed));
}

#[test]
fn dns_from_inside_reaches_no_resolver() {
    if !require_root("dns_from_inside_reaches_no_resolver") {
        return;
    }
    let up = Upstream::start();
    let caps = allow(&[format!("{}:{HTTP_PORT}", up.name)]);
    // The name the proxy resolves does not resolve inside, and no DNS server is reachable
    // over UDP or TCP (the host's resolvers, a public one).
    let code = format!(
        "import socket, errno\n\
         try:\n\
         \x20   print('resolved', socket.getaddrinfo('{name}', 80))\n\
         except OSError as e:\n\
         \x20   print('no resolution', e)\n\
         try:\n\
         \x20   print('unlisted resolved', socket.getaddrinfo('example.com', 80))\n\
         except OSError as e:\n\
         \x20   print('unlisted: no resolution', e)\n\
         servers = ['8.8.8.8', '1.1.1.1', '{ip}']\n\
         try:\n\
         \x20   servers += [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')]\n\
         except OSError:\n\
         \x20   pass\n\
         for server in servers:\n\
         \x20   u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         \x20   try:\n\
         \x20       u.sendto(b'\\x12\\x34' + b'\\x01\\x00' + b'\\x00\\x01' + b'\\x00' * 6, (server, 53)); print('sent', server)\n\
         \x20   except OSError as e:\n\
         \x20       print('udp', errno.errorcode.get(e.errno, e.errno))\n",
        name = up.name,
        ip = up.ip
    );
    let out = run_with(&sandbox(), &Tool::command([PY, "-c", &code]), &caps);
    let text = ok_stdout(&out);
    // The allowed name "resolves" only to its synthetic address, from the sandbox's own
    // /etc/hosts (static data): never to the upstream's real address.
    assert!(
        text.contains("resolved") && text.contains("'198.18.0.1'"),
        "{text}"
    );
    assert!(!text.contains(&up.ip.to_string()[..]), "{text}");
    assert!(text.contains("unlisted: no resolution"), "{text}");
    assert!(!text.contains("sent"), "{text}");
    assert!(text.contains("udp ENETUNREACH"), "{text}");
}

#[test]
fn name_resolving_to_loopback_private_or_metadata_is_refused_without_a_cidr_opt_in() {
    if !require_root(
        "name_resolving_to_loopback_private_or_metadata_is_refused_without_a_cidr_opt_in",
    ) {
        return;
    }
    let mut up = Upstream::start();
    let pid = std::process::id();
    let sneaky = [
        (format!("loop-{pid}.strata-test.example"), "127.0.0.1"),
        (format!("meta-{pid}.strata-test.example"), "169.254.169.254"),
        (format!("lan-{pid}.strata-test.example"), "10.9.8.7"),
    ];
    for (name, ip) in &sneaky {
        up.alias(name, ip);
    }
    let rules: Vec<String> = sneaky
        .iter()
        .map(|(name, _)| format!("{name}:80"))
        .collect();
    let script = sneaky
        .iter()
        .map(|(name, _)| curl_status(&format!("http://{name}/"), ""))
        .chain([curl_status("http://169.254.169.254/latest/meta-data/", "")])
        .collect::<Vec<_>>()
        .join(";");
    let out = run_with(&sandbox(), &sh(&script), &allow(&rules));
    let codes = lines(&out);
    assert_eq!(codes, ["403", "403", "403", "403"], "{}", stderr(&out));
    let refused = refusals(&out);
    for (name, ip) in &sneaky {
        let decision = refused
            .iter()
            .find(|d| &d.host == name)
            .unwrap_or_else(|| panic!("no decision for {name}: {refused:?}"));
        assert_eq!(decision.addr.map(|a| a.to_string()).as_deref(), Some(*ip));
        assert_eq!(decision.refusal, Some(EgressRefusal::Policy));
    }
}

#[test]
fn empty_allowlist_denies_everything_and_has_no_proxy() {
    if !require_root("empty_allowlist_denies_everything_and_has_no_proxy") {
        return;
    }
    let up = Upstream::start();
    let caps = Caps::new().net(Net::Allow(Vec::new()));
    let script = format!(
        "env | grep -i _proxy; {}",
        curl_status(&up.http_url("hello"), "")
    );
    let out = run_with(&sandbox(), &sh(&script), &caps);
    assert_eq!(stdout(&out).trim(), "000", "{}", stderr(&out));
    assert!(out.receipt.network.is_none());
    assert!(!out.receipt.has_kind(Capability::Net, Mechanism::Proxy));
}

#[test]
fn byte_budget_cuts_a_download_flood() {
    if !require_root("byte_budget_cuts_a_download_flood") {
        return;
    }
    let up = Upstream::start();
    let mut caps = allow(&[format!("{}:{HTTP_PORT}", up.name)]);
    caps.limits.egress_bytes = ByteSize::kib(256);
    let script = format!(
        "curl -sS -m 20 -o /dev/null -w '%{{size_download}}\\n' {}; true",
        up.http_url("big")
    );
    let out = run_with(&sandbox(), &sh(&script), &caps);
    let got: u64 = stdout(&out).trim().parse().unwrap_or(0);
    assert!(
        got < 512 * 1024,
        "downloaded {got} bytes past a 256 KiB budget"
    );
    let net = network(&out);
    let cut = net
        .decisions
        .iter()
        .find(|d| d.limit == Some(LimitKind::EgressBytes))
        .unwrap_or_else(|| panic!("no byte-budget decision: {net:?}"));
    assert_eq!(cut.refusal, Some(EgressRefusal::Budget));
}

#[test]
fn connection_budget_cuts_a_connection_flood() {
    if !require_root("connection_budget_cuts_a_connection_flood") {
        return;
    }
    let up = Upstream::start();
    let mut caps = allow(&[format!("{}:{HTTP_PORT}", up.name)]);
    caps.limits.egress_connections = 3;
    let script = (0..6)
        .map(|_| curl_status(&up.http_url("hello"), ""))
        .collect::<Vec<_>>()
        .join(";");
    let out = run_with(&sandbox(), &sh(&script), &caps);
    let codes = lines(&out);
    assert_eq!(
        codes,
        ["200", "200", "200", "429", "429", "429"],
        "{}",
        stderr(&out)
    );
    let net = network(&out);
    assert_eq!(net.connections, 6);
    assert_eq!(
        net.decisions
            .iter()
            .filter(|d| d.limit == Some(LimitKind::EgressConnections))
            .count(),
        3
    );
}

#[test]
fn tool_cannot_take_over_the_proxy_port_or_replace_the_proxy_variables() {
    if !require_root("tool_cannot_take_over_the_proxy_port_or_replace_the_proxy_variables") {
        return;
    }
    let up = Upstream::start();
    let caps = allow(&[format!("{}:{HTTP_PORT}", up.name)])
        .env("HTTP_PROXY", "http://attacker.example:8080")
        .env("http_proxy", "http://attacker.example:8080");
    let code = "import os, socket, errno\n\
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
        try:\n\
        \x20   s.bind(('127.0.0.1', 3128)); print('bound')\n\
        except OSError as e:\n\
        \x20   print('bind', errno.errorcode.get(e.errno, e.errno))\n\
        print(sorted(set(v.split('@')[-1] for k, v in os.environ.items() if k.lower().endswith('_proxy'))))\n";
    let out = run_with(&sandbox(), &Tool::command([PY, "-c", code]), &caps);
    let text = ok_stdout(&out);
    assert!(text.contains("bind EADDRINUSE"), "{text}");
    assert!(text.contains("['127.0.0.1:3128']"), "{text}");
    assert!(!text.contains("attacker"), "{text}");
}

#[test]
fn each_pooled_sandbox_gets_its_own_listener_and_credential() {
    if !require_root("each_pooled_sandbox_gets_its_own_listener_and_credential") {
        return;
    }
    let up = Upstream::start();
    let caps = allow(&[format!("{}:{HTTP_PORT}", up.name)]);
    let pooled = Sandbox::builder()
        .backend(strata::BackendChoice::Only(strata::BackendKind::Process))
        .helper(common::helper())
        .warm_pool(1)
        .build()
        .expect("sandbox");
    let script = format!("echo $HTTP_PROXY; curl -sS -m 10 {}", up.http_url("hello"));
    let first = run_with(&pooled, &sh(&script), &caps);
    let second = run_with(&pooled, &sh(&script), &caps);
    let (a, b) = (ok_stdout(&first), ok_stdout(&second));
    assert!(a.contains(HELLO) && b.contains(HELLO), "{a}\n{b}");
    let token = |text: &str| text.lines().next().unwrap_or_default().to_string();
    assert_ne!(token(&a), token(&b), "two runs shared a credential");
    // The first run's credential is revoked with its run.
    let replay = format!(
        "curl -sS -m 10 -o /dev/null -w '%{{http_code}}\\n' -x '{}' {}",
        token(&a),
        up.http_url("hello")
    );
    let third = run_with(&pooled, &sh(&replay), &caps);
    assert_eq!(stdout(&third).trim(), "407", "{}", stderr(&third));
}

#[test]
fn rules_that_would_widen_or_smuggle_are_refused_before_anything_runs() {
    // Built field by field, as caps deserialized from JSON are: the run re-validates.
    for host in [
        "*.com",
        "*.co.uk",
        "127.1",
        "0x7f.0.0.1",
        "evil.example\0.com",
        "a@b.example",
    ] {
        let rule = NetRule {
            host: host.to_string(),
            port: Some(443),
        };
        let flag = tempfile::NamedTempFile::new().expect("temp");
        let tool = sh(&format!("rm {}", flag.path().display()));
        let err = sandbox()
            .run(&tool, &Caps::new().net(Net::Allow(vec![rule])))
            .expect_err(host);
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{host}: {err}");
        assert!(flag.path().exists(), "{host}: the tool ran");
    }
}

// ------------------------------------------------- the library as an unprivileged embedder

/// A loopback HTTP server answering `HELLO` to every request, on its own thread.
fn loopback_http() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let body = HELLO;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn unprivileged_embedder_gets_the_same_egress_enforcement() {
    if !require_root("unprivileged_embedder_gets_the_same_egress_enforcement") {
        return;
    }
    common::run_inner_as("unprivileged_egress_inner", (65534, 65534), &[]);
}

#[test]
#[ignore = "runs as uid 65534 under unprivileged_embedder_gets_the_same_egress_enforcement"]
fn unprivileged_egress_inner() {
    assert!(!common::is_root(), "must run unprivileged");
    let helper = std::env::var("STRATA_INNER_HELPER").expect("run by its outer test");
    // No cgroup for an unprivileged embedder on this host: best effort, with the gap listed.
    let sandbox = Sandbox::builder()
        .backend(strata::BackendChoice::Only(strata::BackendKind::Process))
        .helper(&helper)
        .strictness(strata::Strictness::BestEffort)
        .build()
        .expect("sandbox");
    let allowed = loopback_http();
    let other = loopback_http();
    // The host's loopback only by an explicit CIDR rule, and only on its port.
    let caps = allow(&[format!("127.0.0.1/32:{allowed}")]);
    let script = [
        curl_status(&format!("http://127.0.0.1:{allowed}/"), ""),
        curl_status(&format!("http://127.0.0.1:{other}/"), ""),
        curl_status(&format!("http://127.0.0.1:{allowed}/"), "--noproxy '*'"),
    ]
    .join(";");
    let out = run_with(&sandbox, &sh(&script), &caps);
    let codes = lines(&out);
    assert_eq!(codes, ["200", "403", "000"], "{}", stderr(&out));
    assert!(out.receipt.has_kind(Capability::Net, Mechanism::Proxy));
}
