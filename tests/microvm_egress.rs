//! Network allowlists on the microVM backend, against a real upstream (see `egress_common`):
//! the guest's one network device is QEMU's user-mode network with `restrict=on`, whose only
//! peer is a forward to the host's egress proxy for this run. Needs root (the upstream's
//! network namespace, `/etc/hosts`), QEMU and the guest (`scripts/build-vm-guest.sh`).

mod common;
mod egress_common;

use std::path::Path;
use std::process::Command;

use common::require_root;
use egress_common::{Upstream, HELLO, HTTP_PORT};
use strata::{
    Backend, Capability, Caps, Mechanism, MicrovmBackend, Net, NetRule, RunContext, Tool,
};

fn guest() {
    let script =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("scripts/build-vm-guest.sh");
    let out = Command::new(&script).output().expect("build-vm-guest.sh");
    assert!(
        out.status.success(),
        "scripts/build-vm-guest.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn microvm_reaches_only_allowlisted_hosts_through_the_egress_proxy() {
    if !require_root("microvm_reaches_only_allowlisted_hosts_through_the_egress_proxy") {
        return;
    }
    guest();
    let up = Upstream::start();
    let rule: NetRule = format!("{}:{HTTP_PORT}", up.name).parse().expect("rule");
    let caps = Caps::new()
        .net(Net::Allow(vec![rule]))
        .timeout(std::time::Duration::from_secs(120));
    let script = format!(
        r#"
import socket, urllib.request, urllib.error
print(urllib.request.urlopen("{url}", timeout=30).read().decode(), flush=True)
try:
    urllib.request.urlopen("http://example.com/", timeout=30)
    print("UNLISTED-REACHED")
except urllib.error.HTTPError as e:
    print("unlisted", e.code, flush=True)
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("{ip}", {port}))
    print("DIRECT-REACHED")
except OSError:
    print("direct refused")
"#,
        url = up.http_url("hello"),
        ip = up.ip,
        port = HTTP_PORT,
    );
    let out = MicrovmBackend::new()
        .run_caps(
            &Tool::script(strata::ScriptLanguage::Python, script),
            &caps,
            &RunContext::default(),
        )
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stdout.lines().map(str::trim).collect();
    assert_eq!(
        lines,
        [HELLO, "unlisted 403", "direct refused"],
        "{:?}\n{stdout}\n{stderr}\n{}",
        out.status,
        out.receipt
    );
    let net = out.receipt.network.as_ref().expect("network receipt");
    assert!(net.enforcer.contains("10.0.2.100:3128"), "{}", net.enforcer);
    let allowed: Vec<_> = net.decisions.iter().filter(|d| d.allowed).collect();
    let refused: Vec<_> = net.decisions.iter().filter(|d| !d.allowed).collect();
    assert_eq!(allowed.len(), 1, "{net:?}");
    assert_eq!(allowed[0].host, up.name);
    assert_eq!(refused.len(), 1, "{net:?}");
    assert_eq!(refused[0].host, "example.com");
    assert!(out.receipt.has_kind(Capability::Net, Mechanism::Proxy));
    assert_eq!(
        out.receipt.layers,
        [strata::BackendKind::Microvm, strata::BackendKind::Process]
    );
}

#[test]
fn microvm_refuses_host_networking() {
    let err = MicrovmBackend::new()
        .run_caps(
            &Tool::command(["true"]),
            &Caps::new().net(Net::Host),
            &RunContext::default(),
        )
        .expect_err("net host");
    assert_eq!(err.kind(), strata::ErrorKind::Unenforceable, "{err}");
}
