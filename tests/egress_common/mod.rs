//! A real upstream for the egress suites: an HTTP and HTTPS server in its own network
//! namespace, reached from the host over a veth pair at a public-looking address, with a
//! name in `/etc/hosts` (added and removed by the fixture). Root only.
//!
//! The server is outside the host's own addresses and outside every always-denied range,
//! so only the allowlist decides whether the proxy reaches it; a sandbox reaches it only
//! through the proxy.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// The upstream's HTTP port.
pub const HTTP_PORT: u16 = 8080;
/// The upstream's HTTPS port.
pub const HTTPS_PORT: u16 = 8443;
/// What `GET /hello` answers.
pub const HELLO: &str = "hello from upstream";
/// The bearer token `GET /auth` accepts (answering `auth ok`, else `auth bad`).
pub const SECRET: &str = "upstream-only-s3cr3t-4242";
/// Bytes `GET /big` answers with.
pub const BIG_BYTES: usize = 8 << 20;

static NEXT: AtomicU32 = AtomicU32::new(0);
/// Edits of /etc/hosts by this test process, one at a time.
static HOSTS_LOCK: Mutex<()> = Mutex::new(());

const SERVER: &str = r#"
import http.server, socketserver, ssl, sys, threading
ip, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
SECRET = "upstream-only-s3cr3t-4242"
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/big":
            body = b"x" * (8 << 20)
        elif self.path == "/host":
            body = (self.headers.get("Host") or "").encode()
        elif self.path == "/auth":
            ok = self.headers.get("Authorization") == "Bearer " + SECRET
            body = b"auth ok" if ok else b"auth bad"
        elif self.path == "/headers":
            body = str(sorted(self.headers.items())).encode()
        else:
            body = b"hello from upstream"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
plain = S((ip, 8080), H)
tls = S((ip, 8443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
print("ready", flush=True)
plain.serve_forever()
"#;

/// One upstream: its namespace, server, certificate and name. Everything is removed on
/// drop.
pub struct Upstream {
    /// The name `/etc/hosts` gives the server.
    pub name: String,
    /// The server's address.
    pub ip: Ipv4Addr,
    /// A directory with `ca.pem` (the test CA that issued the server's certificate),
    /// readable by sandboxes that are granted it.
    pub dir: tempfile::TempDir,
    netns: String,
    server: Child,
    hosts_line: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Upstream {
    /// Starts an upstream (root only).
    pub fn start() -> Upstream {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(n < 60, "too many upstreams in one test process");
        let pid = std::process::id();
        let netns = format!("strata-eg-{pid}-{n}");
        let host_if = format!("seh{}x{n}", pid % 100_000);
        let peer_if = format!("sep{}x{n}", pid % 100_000);
        // 11.0.0.0/8 is public (no reserved range): a /30 per upstream, from the pid.
        let (a, b) = (((pid >> 8) & 0xff) as u8, (pid & 0xff) as u8);
        let host_ip = Ipv4Addr::new(11, a, b, (n * 4 + 1) as u8);
        let up_ip = Ipv4Addr::new(11, a, b, (n * 4 + 2) as u8);
        let name = format!("up{n}-{pid}.strata-test.example");
        let dir = tempfile::Builder::new()
            .prefix("strata-upstream")
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        make_cert(dir.path(), &name);
        ip(&["netns", "add", &netns]);
        let mut upstream = Upstream {
            name,
            ip: up_ip,
            dir,
            netns: netns.clone(),
            server: Command::new("true").spawn().expect("placeholder"),
            hosts_line: String::new(),
        };
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if,
        ]);
        ip(&["link", "set", &peer_if, "netns", &netns]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{up_ip}/30"),
            "dev",
            &peer_if,
        ]);
        ip(&["-n", &netns, "link", "set", &peer_if, "up"]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        let _ = upstream.server.wait();
        upstream.server = Command::new("ip")
            .args(["netns", "exec", &netns, "python3", "-c", SERVER])
            .arg(up_ip.to_string())
            .arg(upstream.dir.path().join("leaf.pem"))
            .arg(upstream.dir.path().join("key.pem"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start upstream server");
        let mut first = String::new();
        let stdout = upstream.server.stdout.take().expect("stdout");
        BufReader::new(stdout)
            .read_line(&mut first)
            .expect("read server");
        assert_eq!(first.trim(), "ready", "upstream server did not start");
        upstream.hosts_line = format!("{up_ip} {} # strata egress test {pid}", upstream.name);
        edit_hosts(|text| format!("{text}{}\n", upstream.hosts_line));
        upstream
    }

    /// The CA that issued the server's certificate (what clients must trust).
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// `http://NAME:8080/PATH`.
    pub fn http_url(&self, path: &str) -> String {
        format!("http://{}:{HTTP_PORT}/{path}", self.name)
    }

    /// `https://NAME:8443/PATH`.
    pub fn https_url(&self, path: &str) -> String {
        format!("https://{}:{HTTPS_PORT}/{path}", self.name)
    }

    /// Maps another name to `ip` in `/etc/hosts` until the upstream drops.
    pub fn alias(&mut self, name: &str, ip: &str) {
        let line = format!(
            "{ip} {name} # strata egress test alias {}",
            std::process::id()
        );
        edit_hosts(|text| format!("{text}{line}\n"));
        self.hosts_line.push('\n');
        self.hosts_line.push_str(&line);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
        let lines: Vec<String> = self.hosts_line.lines().map(str::to_string).collect();
        edit_hosts(|text| {
            text.lines()
                .filter(|l| !lines.iter().any(|ours| ours == l))
                .map(|l| format!("{l}\n"))
                .collect()
        });
    }
}

/// Rewrites /etc/hosts: atomically by rename, so a concurrent reader (the proxy resolving
/// another test's name) never sees it half written; in place when it is a mount point
/// that cannot be renamed over (a container's bind mount).
fn edit_hosts(f: impl FnOnce(&str) -> String) {
    let _guard = HOSTS_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut text = String::new();
    std::fs::File::open("/etc/hosts")
        .and_then(|mut f| f.read_to_string(&mut text))
        .expect("read /etc/hosts");
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let new = f(&text);
    let staged = format!("/etc/.hosts.strata-{}", std::process::id());
    std::fs::write(&staged, &new).expect("write staged hosts");
    std::fs::set_permissions(&staged, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod staged hosts");
    if std::fs::rename(&staged, "/etc/hosts").is_err() {
        let _ = std::fs::remove_file(&staged);
        std::fs::write("/etc/hosts", new).expect("write /etc/hosts");
    }
}

/// The test process's CA (one per process: the proxy loads its upstream roots once per
/// process), created on first use, with `SSL_CERT_FILE` pointed at the system's roots plus
/// it so the proxy trusts the test upstreams it issues for.
fn test_ca() -> &'static Path {
    static CA: OnceLock<tempfile::TempDir> = OnceLock::new();
    CA.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("strata-test-ca")
            .tempdir()
            .expect("tempdir");
        openssl(
            dir.path(),
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=strata egress test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        );
        let mut roots =
            std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
        roots.push_str(&std::fs::read_to_string(dir.path().join("ca.pem")).expect("ca"));
        let bundle = dir.path().join("roots.pem");
        std::fs::write(&bundle, roots).expect("bundle");
        std::env::set_var("SSL_CERT_FILE", &bundle);
        dir
    })
    .path()
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A server certificate for `name` issued by the process's test CA (`leaf.pem`,
/// `key.pem`), and a copy of the CA (`ca.pem`, what clients must trust), in `dir`.
fn make_cert(dir: &Path, name: &str) {
    let ca = test_ca();
    std::fs::write(
        dir.join("leaf.ext"),
        format!(
            "subjectAltName=DNS:{name}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        ),
    )
    .expect("write ext");
    std::fs::copy(ca.join("ca.pem"), dir.join("ca.pem")).expect("copy ca");
    let subject = format!("/CN={name}");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &subject,
            "-keyout",
            "key.pem",
            "-out",
            "leaf.csr",
        ],
    );
    let (ca_pem, ca_key) = (ca.join("ca.pem"), ca.join("ca.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            &ca_pem.display().to_string(),
            "-CAkey",
            &ca_key.display().to_string(),
            "-CAcreateserial",
            "-CAserial",
            "leaf.srl",
            "-days",
            "2",
            "-extfile",
            "leaf.ext",
            "-out",
            "leaf.pem",
        ],
    );
    for file in ["ca.pem", "leaf.pem", "key.pem"] {
        std::fs::set_permissions(
            dir.join(file),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .expect("chmod");
    }
}
