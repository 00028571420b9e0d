//! Python and JavaScript code runs in the wasm backend through interpreters compiled to
//! WASI (installed by scripts/fetch-wasm-interpreters.sh; these tests fail, never skip,
//! when they are missing).

mod common;

use common::*;
use sandbox_core::{
    Access, Backend, ByteSize, Capability, ErrorKind, ExitStatus, LimitKind, Net, NetRule,
    RunContext, ScriptLanguage, Tool,
};
use sandbox_wasm::{WasmBackend, WasmConfig};

fn python(code: &str) -> Tool {
    Tool::script(ScriptLanguage::Python, code)
}

fn js(code: &str) -> Tool {
    Tool::script(ScriptLanguage::Javascript, code)
}

/// Python that connects to 127.0.0.1:PORT with raw WASI preview 2 sockets (this CPython
/// build has no `socket` module), sends "hi", and prints CONNECTED or REFUSED.
fn wasi_connect_code(ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    format!(
        r#"
from componentize_py_types import Err
from wit_world.imports import instance_network, network, tcp_create_socket

def connect(port):
    net = instance_network.instance_network()
    sock = tcp_create_socket.create_tcp_socket(network.IpAddressFamily.IPV4)
    addr = network.Ipv4SocketAddress(port=port, address=(127, 0, 0, 1))
    sock.start_connect(net, network.IpSocketAddress_Ipv4(addr))
    ready = sock.subscribe()
    while True:
        try:
            rx, tx = sock.finish_connect()
            tx.blocking_write_and_flush(b"hi")
            return "CONNECTED"
        except Err as e:
            if e.value != network.ErrorCode.WOULD_BLOCK:
                raise
            ready.block()

for port in ({},):
    try:
        print(connect(port), port)
    except Err as e:
        print("REFUSED", port, e.value)
"#,
        ports.join(", ")
    )
}

#[test]
fn python_one_liner() {
    require_interpreters();
    let out = run(&python("print(6 * 7)"), &caps());
    assert_eq!(out.status, ExitStatus::Exited { code: 0 }, "{out:?}");
    assert_eq!(stdout(&out), "42\n");
}

#[test]
fn javascript_one_liner() {
    require_interpreters();
    let out = run(&js("console.log(6 * 7)"), &caps());
    assert_eq!(out.status, ExitStatus::Exited { code: 0 }, "{out:?}");
    assert_eq!(stdout(&out), "42\n");
}

#[test]
fn python_sees_args_env_stdin_and_mounts() {
    require_interpreters();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("in.txt"), "from host").expect("write");
    let caps = caps()
        .mount(dir.path(), "/work", Access::ReadWrite)
        .env("WHO", "agent")
        .stdin(b"piped".to_vec());
    let code = r#"
import os, sys
print(os.environ.get("WHO"), sorted(os.environ))
print(sys.stdin.read())
print(open("/work/in.txt").read())
open("/work/out.txt", "w").write("written by python")
"#;
    let out = run(&python(code), &caps);
    assert!(out.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        stdout(&out),
        "agent ['WHO']\npiped\nfrom host\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).expect("out"),
        "written by python"
    );
}

#[test]
fn python_exceptions_and_exit_codes() {
    require_interpreters();
    let out = run(&python("raise ValueError('boom')"), &caps());
    assert_eq!(out.status, ExitStatus::Exited { code: 1 });
    assert!(String::from_utf8_lossy(&out.stderr).contains("ValueError: boom"));
    let out = run(&python("import sys; sys.exit(5)"), &caps());
    assert_eq!(out.status, ExitStatus::Exited { code: 5 });
}

#[test]
fn python_cannot_escape_its_mounts_or_read_host_env() {
    require_interpreters();
    let dir = tempfile::tempdir().expect("tempdir");
    let code = r#"
import os
for p in ["/etc/passwd", "/work/../etc/passwd", "/proc/self/environ"]:
    try:
        open(p).read()
        print("READ", p)
    except OSError as e:
        print("DENIED", p)
print("ENV", dict(os.environ))
"#;
    let caps = caps().mount(dir.path(), "/work", Access::ReadOnly);
    let out = run(&python(code), &caps);
    let text = stdout(&out);
    assert!(!text.contains("READ"), "{text}");
    assert!(text.contains("ENV {}"), "{text}");
}

#[test]
fn python_writes_to_read_only_mounts_fail() {
    require_interpreters();
    let dir = tempfile::tempdir().expect("tempdir");
    let caps = caps().mount(dir.path(), "/ro", Access::ReadOnly);
    let out = run(&python("open('/ro/x', 'w').write('x')"), &caps);
    assert_eq!(out.status, ExitStatus::Exited { code: 1 });
    assert!(!dir.path().join("x").exists());
}

#[test]
fn python_disk_quota_applies_to_component_writes() {
    require_interpreters();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut caps = caps().mount(dir.path(), "/out", Access::ReadWrite);
    caps.limits.disk = ByteSize::kib(256);
    let code = "f = open('/out/big', 'wb')\nfor _ in range(100):\n    f.write(b'x' * 65536)\n    f.flush()\n";
    let out = run(&python(code), &caps);
    assert_eq!(
        out.limit(),
        Some(LimitKind::Disk),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let size = std::fs::metadata(dir.path().join("big"))
        .expect("big")
        .len();
    assert!(size <= 256 << 10, "wrote {size} bytes past a 256 KiB quota");
}

/// Round 3: the same flood through preview 2 (the Python component): symbolic links with
/// long targets stop at the disk limit.
#[test]
fn python_symlink_flood_stops_at_the_disk_limit() {
    require_interpreters();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut caps = caps().mount(dir.path(), "/out", Access::ReadWrite);
    caps.limits.disk = ByteSize::kib(256);
    let code = "import os\nfor i in range(100000):\n    os.symlink('a' * 4000, f'/out/l{i}')\n";
    let out = run(&python(code), &caps);
    assert_eq!(
        out.limit(),
        Some(LimitKind::Disk),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made = std::fs::read_dir(dir.path()).expect("read_dir").count() as u64;
    assert!(
        made * 4096 <= 256 << 10,
        "{made} links made under a 256 KiB limit"
    );
}

#[test]
fn python_sockets_are_refused_and_the_listener_sees_nothing() {
    require_interpreters();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let out = run(&python(&wasi_connect_code(&[port])), &caps());
    let text = stdout(&out);
    assert!(
        text.starts_with(&format!("REFUSED {port}")),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        listener.accept().is_err(),
        "the host listener received a connection"
    );
}

#[test]
fn python_memory_bomb_ends_at_the_limit() {
    require_interpreters();
    let caps = caps().memory(ByteSize::mib(128));
    let out = run(&python("x = bytearray(1 << 30)"), &caps);
    assert!(
        matches!(
            out.status,
            ExitStatus::Limit {
                limit: LimitKind::Memory,
                ..
            }
        ),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn javascript_errors_exit_nonzero_and_std_is_available() {
    require_interpreters();
    let out = run(&js("throw new Error('nope')"), &caps());
    assert_eq!(out.status, ExitStatus::Exited { code: 1 });
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
    let out = run(
        &js("std.out.puts(std.getenv('X') + '\\n'); std.exit(3)"),
        &caps().env("X", "y"),
    );
    assert_eq!(stdout(&out), "y\n");
    assert_eq!(out.status, ExitStatus::Exited { code: 3 });
}

#[test]
fn javascript_async_code_completes() {
    require_interpreters();
    let code = "async function main() { await null; console.log('after await'); } main()";
    let out = run(&js(code), &caps());
    assert_eq!(
        stdout(&out),
        "after await\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn javascript_spin_ends_at_the_wall_limit() {
    require_interpreters();
    let caps = caps().timeout(std::time::Duration::from_millis(500));
    let out = run(&js("for (;;) {}"), &caps);
    assert_eq!(out.limit(), Some(LimitKind::Wall));
}

#[test]
fn missing_interpreter_names_the_fetch_script() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = WasmConfig::default()
        .cache_dir(None)
        .interpreter_dir(dir.path());
    let backend = WasmBackend::with_config(config).expect("backend");
    let err = backend
        .run_caps(&python("print(1)"), &caps(), &RunContext::default())
        .expect_err("missing");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(
        err.to_string().contains("fetch-wasm-interpreters.sh"),
        "{err}"
    );
}

#[test]
fn script_receipts_are_wasm_receipts() {
    require_interpreters();
    let out = run(&python("pass"), &caps());
    assert!(out.receipt.has(Capability::Fs, "WASI preopens"));
    assert_eq!(out.receipt.backend, sandbox_core::BackendKind::Wasm);
}

#[test]
fn python_allowlist_connects_only_to_the_allowed_address() {
    require_interpreters();
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let other = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    other.set_nonblocking(true).expect("nonblocking");
    let (a, o) = (
        allowed.local_addr().expect("addr").port(),
        other.local_addr().expect("addr").port(),
    );
    let caps = caps().net(Net::Allow(vec![NetRule {
        host: "127.0.0.1".into(),
        port: Some(a),
    }]));
    let out = run(&python(&wasi_connect_code(&[a, o])), &caps);
    let text = stdout(&out);
    assert!(
        text.contains(&format!("CONNECTED {a}")),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("REFUSED {o}")), "{text}");
    assert!(
        other.accept().is_err(),
        "the unlisted listener received a connection"
    );
    let (mut conn, _) = allowed.accept().expect("allowed connection");
    let mut buf = [0u8; 2];
    std::io::Read::read_exact(&mut conn, &mut buf).expect("read");
    assert_eq!(&buf, b"hi");
    assert!(out
        .receipt
        .has(Capability::Net, "wasi:sockets egress policy"));
}

#[test]
fn python_allowlist_never_allows_listening() {
    require_interpreters();
    let code = r#"
from componentize_py_types import Err
from wit_world.imports import instance_network, network, tcp_create_socket
net = instance_network.instance_network()
sock = tcp_create_socket.create_tcp_socket(network.IpAddressFamily.IPV4)
try:
    sock.start_bind(net, network.IpSocketAddress_Ipv4(network.Ipv4SocketAddress(port=0, address=(0, 0, 0, 0))))
    sock.finish_bind()
    sock.start_listen()
    sock.finish_listen()
    print("LISTENING")
except Err as e:
    print("REFUSED", e.value)
"#;
    let caps = caps().net(Net::Allow(vec![NetRule {
        host: "127.0.0.1".into(),
        port: Some(9),
    }]));
    let out = run(&python(code), &caps);
    assert!(
        stdout(&out).starts_with("REFUSED"),
        "{}{}",
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn python_starts_in_the_workdir() {
    require_interpreters();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rel.txt"), "relative").expect("write");
    let caps = caps()
        .mount(dir.path(), "/work", Access::ReadOnly)
        .workdir("/work");
    let out = run(
        &python("import os; print(os.getcwd(), open('rel.txt').read())"),
        &caps,
    );
    assert_eq!(
        stdout(&out),
        "/work relative\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
