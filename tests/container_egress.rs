//! Network allowlists on the container backend's native runtime: an OCI image's tools reach
//! a real upstream (in its own network namespace, see `egress_common`) only through the
//! egress proxy, exactly as on the process backend. Root only.

mod container_common;
mod egress_common;

use container_common::{caps, images, is_root, run, stdout};
use egress_common::{Upstream, HELLO, HTTP_PORT};
use strata::{Capability, ContainerRuntime, EgressRefusal, Mechanism, Net, NetRule, Tool};

#[test]
fn native_container_reaches_only_the_allowed_host_through_the_proxy() {
    assert!(
        is_root() || std::env::var_os("STRATA_SKIP_ROOT_TESTS").is_some(),
        "needs root (network namespaces, /etc/hosts); .ci/run runs it as root"
    );
    if !is_root() {
        eprintln!(
            "SKIPPED native_container_reaches_only_the_allowed_host_through_the_proxy: needs root"
        );
        return;
    }
    let up = Upstream::start();
    let rules: Vec<NetRule> = [HTTP_PORT, egress_common::HTTPS_PORT]
        .iter()
        .map(|port| format!("{}:{port}", up.name).parse().expect("rule"))
        .collect();
    let caps = caps(&images().python_oci(), ContainerRuntime::Native).net(Net::Allow(rules));
    // The image's busybox wget follows http_proxy (with the run's credential); its
    // python3-minimal tries a direct connection.
    let script = format!(
        "wget -q -O - {ok}; echo; wget -q -O - {tls}; echo; wget -q -O - http://example.com/ 2>&1 || echo refused; \
         python3 -c 'import socket; s = socket.socket(); s.settimeout(5)\n\
         try:\n    s.connect((\"{ip}\", {HTTP_PORT})); print(\"direct connected\")\n\
         except OSError as err:\n    print(\"direct\", err.errno)'",
        ok = up.http_url("hello"),
        tls = up.https_url("hello"),
        ip = up.ip,
    );
    let out = run(&Tool::command(["/bin/sh", "-c", &script]), &caps);
    let text = stdout(&out);
    assert_eq!(
        text.matches(HELLO).count(),
        2,
        "HTTP and HTTPS (the proxy speaks TLS for an absolute https:// URI): {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("refused"), "{text}");
    assert!(text.contains("direct 101"), "ENETUNREACH expected: {text}");
    assert!(out.receipt.has_kind(Capability::Net, Mechanism::Proxy));
    let net = out.receipt.network.as_ref().expect("network receipt");
    assert!(
        net.decisions[0].allowed && net.decisions[1].allowed,
        "{net:?}"
    );
    assert_eq!(net.decisions[2].host, "example.com");
    assert_eq!(net.decisions[2].refusal, Some(EgressRefusal::Policy));
}

#[test]
fn native_container_sends_a_secret_only_to_its_host() {
    if !is_root() {
        assert!(
            std::env::var_os("STRATA_SKIP_ROOT_TESTS").is_some(),
            "needs root (network namespaces, /etc/hosts); .ci/run runs it as root"
        );
        eprintln!("SKIPPED native_container_sends_a_secret_only_to_its_host: needs root");
        return;
    }
    let mut up = Upstream::start();
    let other = format!("other-{}.strata-test.example", std::process::id());
    up.alias(&other, &up.ip.to_string());
    let rules: Vec<NetRule> = [up.name.as_str(), other.as_str()]
        .iter()
        .map(|h| format!("{h}:{HTTP_PORT}").parse().expect("rule"))
        .collect();
    let mut caps = caps(&images().python_oci(), ContainerRuntime::Native).net(Net::Allow(rules));
    caps.secrets.push(strata::Secret {
        env: "API_TOKEN".into(),
        value: egress_common::SECRET.into(),
        hosts: vec![up.name.clone()],
    });
    let script = format!(
        "echo $API_TOKEN; for h in {name} {other}; do \
         wget -q -O - --header \"Authorization: Bearer $API_TOKEN\" http://$h:{HTTP_PORT}/auth; echo; done; \
         test -s /etc/strata/ca-bundle.pem && echo trusted",
        name = up.name,
    );
    let out = run(&Tool::command(["/bin/sh", "-c", &script]), &caps);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("strata-secret-"), "{text}");
    assert_eq!(
        &lines[1..],
        ["auth ok", "auth bad", "trusted"],
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
