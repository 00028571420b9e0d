//! Secrets at egress on the process backend, against a real upstream (see
//! `egress_common`): the tool holds a placeholder; only requests to the secret's hosts
//! carry the value, over HTTP and over HTTPS through the run's own CA. The proxy trusts the
//! test upstream through `SSL_CERT_FILE`, which `egress_common` points at the system's
//! roots plus its test CA. Root only.

mod common;
mod egress_common;

use common::{ok_stdout, require_root, sandbox, sh, stderr};
use egress_common::{Upstream, HTTPS_PORT, HTTP_PORT, SECRET};
use strata::{Capability, Caps, ErrorKind, Mechanism, Net, NetRule, Secret, Tool};

fn allow(rules: &[String]) -> Caps {
    let rules: Vec<NetRule> = rules.iter().map(|r| r.parse().expect("rule")).collect();
    Caps::new().net(Net::Allow(rules))
}

#[test]
fn secret_reaches_only_its_host_and_the_tool_holds_a_placeholder() {
    if !require_root("secret_reaches_only_its_host_and_the_tool_holds_a_placeholder") {
        return;
    }
    let mut up = Upstream::start();
    let other = format!("other-{}.strata-test.example", std::process::id());
    up.alias(&other, &up.ip.to_string());
    let mut caps = allow(&[
        format!("{}:{HTTP_PORT}", up.name),
        format!("{}:{HTTPS_PORT}", up.name),
        format!("{other}:{HTTP_PORT}"),
    ]);
    caps.secrets.push(Secret {
        env: "API_TOKEN".into(),
        value: SECRET.into(),
        hosts: vec![up.name.clone()],
    });
    let auth = "-H \"Authorization: Bearer $API_TOKEN\"";
    let script = format!(
        "echo \"token=$API_TOKEN\"; \
         curl -sS -m 10 {auth} {https}; echo; \
         curl -sS -m 10 {auth} {http}; echo; \
         curl -sS -m 10 {auth} http://{other}:{HTTP_PORT}/auth; echo; \
         python3 -c 'import os, urllib.request as u; \
         r = u.Request(\"{https}\", headers={{\"Authorization\": \"Bearer \" + os.environ[\"API_TOKEN\"]}}); \
         print(u.urlopen(r, timeout=10).read().decode())'; \
         env | grep -c {SECRET}; true",
        https = up.https_url("auth"),
        http = up.http_url("auth"),
    );
    let out = sandbox()
        .run(&sh(&script), &caps)
        .unwrap_or_else(|e| panic!("run refused: {e}"));
    let text = ok_stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("token=strata-secret-"),
        "{text}\n{}",
        stderr(&out)
    );
    assert_eq!(
        &lines[1..],
        ["auth ok", "auth ok", "auth bad", "auth ok", "0"],
        "HTTPS and HTTP to the bound host get the value; another host gets the placeholder\n{}\n{:#?}",
        stderr(&out),
        out.receipt.network
    );
    assert!(!text.contains(SECRET));
    let receipt = &out.receipt;
    let json = serde_json::to_string(receipt).expect("json");
    assert!(!json.contains(SECRET), "the value is in the receipt");
    assert!(receipt.has_kind(Capability::Net, Mechanism::Proxy));
    assert!(
        receipt
            .enforced
            .iter()
            .any(|e| e.mechanism == "secrets at egress"),
        "{receipt}"
    );
    let net = receipt.network.as_ref().expect("network");
    let sent: Vec<&str> = net
        .decisions
        .iter()
        .filter(|d| d.secrets == ["API_TOKEN"])
        .map(|d| d.host.as_str())
        .collect();
    assert_eq!(sent, [up.name.as_str(); 3], "{net:?}");
    assert!(net
        .decisions
        .iter()
        .filter(|d| d.host == other)
        .all(|d| d.secrets.is_empty()));
}

#[test]
fn secrets_without_an_allowlist_or_with_header_breaking_values_are_refused() {
    let secret = |value: &str, hosts: &[&str]| Secret {
        env: "TOKEN".into(),
        value: value.into(),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
    };
    let mut no_allowlist = Caps::new();
    no_allowlist.secrets.push(secret("v", &["api.example.com"]));
    let mut crlf = allow(&["api.example.com:443".into()]);
    crlf.secrets
        .push(secret("v\r\nX-Injected: 1", &["api.example.com"]));
    let mut ip_host = allow(&["192.0.2.7:443".into()]);
    ip_host.secrets.push(secret("v", &["192.0.2.7"]));
    let mut public_suffix = allow(&["api.example.com:443".into()]);
    public_suffix.secrets.push(secret("v", &["*.com"]));
    for (name, caps) in [
        ("no allowlist", no_allowlist),
        ("CR/LF in the value", crlf),
        ("an address", ip_host),
        ("a public-suffix wildcard", public_suffix),
    ] {
        let err = sandbox()
            .run(&Tool::command(["true"]), &caps)
            .expect_err(name);
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{name}: {err}");
        assert!(!err.to_string().contains("X-Injected"), "{err}");
    }
}
