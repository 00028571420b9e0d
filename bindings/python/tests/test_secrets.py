"""Secrets at egress from Python: ``Caps(secrets=[...])`` in every caps form, the value never
read back (getter, ``repr``, ``to_dict``, ``to_json``, errors), bad input refused with
InvalidRequestError before anything runs, and one end-to-end run against a plain-HTTP
loopback server that checks the header the server got and the placeholder the tool saw."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import strata

VALUE = "s3cr3t-Value-never-read-back"
NET = "allow:api.example.com:443"


def secret(**changes: Any) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"env": "API_TOKEN", "value": VALUE, "hosts": ["api.example.com"]}
    entry.update(changes)
    return entry


def test_secrets_round_trip_without_the_value() -> None:
    caps = strata.Caps(net=NET, secrets=[secret()])
    assert caps.secrets == [{"env": "API_TOKEN", "hosts": ["api.example.com"]}]
    for text in [repr(caps), caps.to_json(), json.dumps(caps.to_dict()), repr(caps.secrets)]:
        assert VALUE not in text, text
        assert "API_TOKEN" in text, text
    assert caps.to_dict()["secrets"] == [{"env": "API_TOKEN", "hosts": ["api.example.com"]}]
    # The dict form, and a mapping passed as `caps` to run, build the same caps.
    assert strata.Caps({"net": NET, "secrets": [secret()]}) == caps
    assert strata.Caps(net=NET, secrets=(secret(hosts=("api.example.com",)),)) == caps
    assert strata.Caps().secrets == []
    # Caps equality sees the value (never shown): another value is other caps.
    assert strata.Caps(net=NET, secrets=[secret(value="other")]) != caps


def test_derived_caps_keep_the_base_values_and_add_secrets_like_env() -> None:
    base = strata.Caps(net=NET, secrets=[secret()])
    derived = strata.Caps(base, timeout=5)
    assert derived == strata.Caps(net=NET, secrets=[secret()], timeout=5), "the value carried over"
    more = strata.Caps(base, secrets=[secret(env="OTHER", hosts=["*.example.com"])])
    assert [s["env"] for s in more.secrets] == ["API_TOKEN", "OTHER"]
    replaced = strata.Caps(base, secrets=[secret(value="rotated")])
    assert replaced == strata.Caps(net=NET, secrets=[secret(value="rotated")])
    assert len(replaced.secrets) == 1
    assert strata.Caps({"net": NET, "secrets": [secret()]}, secrets=[secret(value="rotated")]) == replaced
    with pytest.raises(strata.InvalidRequestError, match="two secrets use the variable API_TOKEN"):
        strata.Caps(base, secrets=[secret(value="a"), secret(value="b")])


def test_forms_without_values_are_refused_naming_the_missing_value() -> None:
    caps = strata.Caps(net=NET, secrets=[secret()])
    with pytest.raises(strata.InvalidRequestError, match=r"secrets\[0\]: missing key `value`"):
        strata.Caps(caps.to_dict())
    with pytest.raises(strata.InvalidRequestError, match="value must be non-empty"):
        strata.Caps.from_json(caps.to_json())


@pytest.mark.parametrize(
    "value, message",
    [
        ("API_TOKEN@api.example.com", r"secrets must be a list of .* dicts, got str"),
        (secret(), r"secrets must be a list of .* dicts, got dict"),
        (7, r"secrets must be a list of .* dicts, got int"),
        (["API_TOKEN"], r"secrets\[0\] must be a dict .*got str"),
        ([secret(), ("API_TOKEN", VALUE)], r"secrets\[1\] must be a dict .*got tuple"),
        ([{"value": VALUE, "hosts": ["a.example.com"]}], r"secrets\[0\]: missing key `env`"),
        ([{"env": "T", "hosts": ["a.example.com"]}], r"secrets\[0\]: missing key `value`"),
        ([{"env": "T", "value": VALUE}], r"secrets\[0\]: missing key `hosts`"),
        ([secret(env=None)], r"secrets\[0\]\.env must be a str, got NoneType"),
        ([secret(value=b"bytes")], r"secrets\[0\]\.value must be a str, got bytes"),
        ([secret(value=42)], r"secrets\[0\]\.value must be a str, got int"),
        ([secret(hosts="api.example.com")], r"secrets\[0\]\.hosts must be a list of host names, got str"),
        ([secret(hosts=["api.example.com", 3])], r"secrets\[0\]\.hosts\[1\] must be a str, got int"),
        ([secret(valeu=VALUE)], r"secrets\[0\]: unknown key `valeu` \(a secret has `env`, `value` and `hosts`\)"),
        ([{1: "x"}], r"secrets\[0\]: keys must be str"),
    ],
)
def test_malformed_secrets_are_refused_naming_the_problem(value: Any, message: str) -> None:
    for build in (
        lambda: strata.Caps(net=NET, secrets=value),
        lambda: strata.Caps({"net": NET, "secrets": value}),
    ):
        with pytest.raises(strata.InvalidRequestError, match=message) as info:
            build()
        assert info.value.code == "invalid_request"
        assert VALUE not in str(info.value)


def test_a_misspelled_key_names_secrets() -> None:
    with pytest.raises(strata.InvalidRequestError, match=r"unknown field `secret`, did you mean `secrets`\?"):
        strata.Caps(net=NET, secret=[secret()])
    with pytest.raises(strata.InvalidRequestError, match=r"did you mean `secrets`\?"):
        strata.Caps({"net": NET, "secret": [secret()]})


@pytest.mark.parametrize(
    "caps, message",
    [
        ({"secrets": [secret()]}, "secrets need a network allowlist"),
        ({"net": "host", "secrets": [secret()]}, "secrets need a network allowlist"),
        ({"net": NET, "secrets": [secret(value=VALUE + "\r\nX-Injected: 1")]}, "no CR, LF"),
        ({"net": NET, "secrets": [secret(value="")]}, "non-empty"),
        ({"net": "allow:192.0.2.7:443", "secrets": [secret(hosts=["192.0.2.7"])]}, "is an address"),
        ({"net": NET, "secrets": [secret(hosts=[])]}, "name the hosts"),
        ({"net": NET, "secrets": [secret(hosts=["*.com"])]}, r"\*\.com"),
        ({"net": NET, "secrets": [secret(env="1BAD")]}, "variable name"),
        ({"net": NET, "secrets": [secret(), secret()]}, "two secrets use the variable API_TOKEN"),
        ({"net": NET, "env": {"API_TOKEN": "x"}, "secrets": [secret()]}, "would replace another variable"),
        ({"net": NET, "secrets": [secret(env="HTTPS_PROXY")]}, "would replace another variable"),
    ],
)
def test_secrets_the_core_refuses_are_invalid_requests_and_nothing_runs(
    sb: strata.Sandbox, tmp_path: Path, caps: Dict[str, Any], message: str
) -> None:
    marker = tmp_path / "ran"
    tool = ["/bin/touch", str(marker)]
    granted = {"read_write": [str(tmp_path)], **caps}
    with pytest.raises(strata.InvalidRequestError, match=message) as info:
        sb.run(tool, granted)
    assert info.value.code == "invalid_request"
    assert VALUE not in str(info.value) and "X-Injected" not in str(info.value)
    with pytest.raises(strata.InvalidRequestError, match=message):
        strata.Caps(granted)
    assert not marker.exists(), "nothing ran"
    assert sb.run(tool, strata.Caps(read_write=[str(tmp_path)])).ok
    assert marker.exists(), "the same tool without the secrets runs"


@pytest.fixture
def auth_server() -> Iterator[Tuple[int, List[str]]]:
    """A plain-HTTP server on the host's loopback that records each request's
    Authorization header and answers whether it carried the value."""
    seen: List[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            auth = self.headers.get("Authorization", "")
            seen.append(auth)
            body = b"auth ok" if auth == f"Bearer {VALUE}" else b"auth bad"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


def test_secret_reaches_a_loopback_server_by_name_and_the_tool_holds_a_placeholder(
    sb: strata.Sandbox, auth_server: Tuple[int, List[str]]
) -> None:
    # The secret is bound to the name `localhost`; the proxy resolves it (the host's
    # /etc/hosts) to 127.0.0.1, a loopback address only an explicit CIDR rule opens.
    port, seen = auth_server
    caps = strata.Caps(
        net=f"allow:localhost:{port},127.0.0.1/32:{port}",
        secrets=[secret(env="TOKEN", hosts=["localhost"])],
    )
    code = f"""
import os, urllib.request
print(os.environ["TOKEN"])
request = urllib.request.Request(
    "http://localhost:{port}/auth", headers={{"Authorization": "Bearer " + os.environ["TOKEN"]}}
)
print(urllib.request.urlopen(request, timeout=10).read().decode())
print(sum(VALUE in v for v in os.environ.values()))
""".replace("VALUE", repr(VALUE))
    result = sb.run(strata.Tool.script("python", code), caps)
    assert result.ok, result.stderr
    placeholder, answer, copies = result.stdout.splitlines()
    assert placeholder.startswith("strata-secret-") and VALUE not in placeholder
    assert answer == "auth ok", (seen, result.receipt.network)
    assert copies == "0", "the value is nowhere in the tool's environment"
    assert seen == [f"Bearer {VALUE}"], "the server got the value, not the placeholder"
    network = result.receipt.network
    assert network is not None
    sent = [d for d in network["decisions"] if d.get("secrets")]
    assert [(d["host"], d["secrets"]) for d in sent] == [("localhost", ["TOKEN"])], network
    assert VALUE not in json.dumps(result.to_dict())
    assert VALUE not in str(result.receipt)
