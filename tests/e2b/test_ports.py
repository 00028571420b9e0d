"""get_host(port): a server inside the sandbox is reached through strata serve with the
Host the SDK names, plain HTTP and WebSocket-style upgrades; a sandbox made without public
traffic needs its traffic token."""

import socket
import time

import httpx
import pytest
from e2b import Sandbox

SERVER = r"""
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from " + self.path + " host " + self.headers["Host"]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[::-1])
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def start_http(sb, port):
    sb.files.write("/tmp/serve.py", SERVER)
    sb.commands.run(f"python3 /tmp/serve.py {port}", background=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            sb.commands.run(
                f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 1)\""
            )
            return
        except Exception:
            time.sleep(0.2)
    pytest.fail(f"the server on port {port} did not start")


def via(server_url, host, path="/", **kwargs):
    """A request to strata serve with the Host get_host names (no wildcard DNS needed)."""
    return httpx.request(
        kwargs.pop("method", "GET"), f"{server_url}{path}", headers={"Host": host, **kwargs.pop("headers", {})},
        timeout=20, **kwargs
    )


def test_get_host_reaches_a_server_in_the_sandbox(server, sandbox):
    start_http(sandbox, 8000)
    host = sandbox.get_host(8000)
    assert host.startswith(f"8000-{sandbox.sandbox_id}.")
    response = via(server.url, host, "/page?x=1")
    assert response.status_code == 200
    assert response.text == f"hello from /page?x=1 host {host}"
    posted = via(server.url, host, "/echo", method="POST", content=b"abc")
    assert posted.status_code == 201 and posted.content == b"cba"


def test_a_closed_port_answers_502(server, sandbox):
    response = via(server.url, sandbox.get_host(8001))
    assert response.status_code == 502
    assert "nothing answers on port 8001" in response.json()["message"]


def test_an_upgrade_is_forwarded_both_ways(server, sandbox):
    sandbox.files.write("/tmp/upgrade.py", r"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8002)); s.listen()
while True:
    c, _ = s.accept()
    data = b""
    while b"\r\n\r\n" not in data:
        data += c.recv(4096)
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
    while True:
        chunk = c.recv(4096)
        if not chunk:
            break
        c.sendall(chunk.upper())
    c.close()
""")
    sandbox.commands.run("python3 /tmp/upgrade.py", background=True)
    host = sandbox.get_host(8002)
    addr = server.url.removeprefix("http://")
    ip, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + 20
    while True:
        conn = socket.create_connection((ip, int(port)), timeout=10)
        conn.sendall(
            f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        if head.startswith(b"HTTP/1.1 101") or time.monotonic() > deadline:
            break
        conn.close()
        time.sleep(0.3)
    assert head.startswith(b"HTTP/1.1 101"), head
    conn.sendall(b"both ways")
    got = b""
    while len(got) < 9:
        chunk = conn.recv(4096)
        if not chunk:
            break
        got += chunk
    assert got == b"BOTH WAYS"
    conn.close()


def test_a_private_sandbox_needs_its_traffic_token(server):
    sb = Sandbox.create(network={"allow_public_traffic": False}, timeout=60)
    try:
        assert sb.traffic_access_token
        start_http(sb, 8000)
        host = sb.get_host(8000)
        assert via(server.url, host).status_code == 403
        wrong = via(server.url, host, headers={"e2b-traffic-access-token": "nope"})
        assert wrong.status_code == 403
        right = via(server.url, host, headers={"e2b-traffic-access-token": sb.traffic_access_token})
        assert right.status_code == 200
    finally:
        sb.kill()


def test_a_paused_or_killed_sandbox_port_answers_502(server):
    sb = Sandbox.create(timeout=60)
    host = sb.get_host(8000)
    try:
        start_http(sb, 8000)
        assert via(server.url, host).status_code == 200
        sb.pause()
        assert via(server.url, host).status_code == 502
        sb.connect()
        assert via(server.url, host).status_code == 200
    finally:
        sb.kill()
    assert via(server.url, host).status_code == 502
