"""The server's checks: API keys, one key's sandboxes hidden from another, access tokens,
loopback by default."""

import subprocess

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import AuthenticationException, NotFoundException

from conftest import OTHER_KEY, strata_bin


def test_wrong_api_key_is_refused(server):
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-a-key-of-this-server")
    response = httpx.get(f"{server.url}/sandboxes")
    assert response.status_code == 401


def test_another_keys_sandbox_is_not_found(sandbox):
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, api_key=OTHER_KEY)
    assert not Sandbox.kill(sandbox.sandbox_id, api_key=OTHER_KEY)
    listed = Sandbox.list(api_key=OTHER_KEY).next_items(api_key=OTHER_KEY)
    assert sandbox.sandbox_id not in [s.sandbox_id for s in listed]
    assert sandbox.is_running()


def test_envd_needs_the_access_token(server, sandbox):
    url = f"{server.url}/filesystem.Filesystem/Stat"
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "Content-Type": "application/json"}
    body = '{"path": "/tmp"}'
    assert httpx.post(url, headers=headers, content=body).status_code == 401
    headers["X-Access-Token"] = "wrong"
    assert httpx.post(url, headers=headers, content=body).status_code == 401
    headers["X-Access-Token"] = sandbox._envd_access_token
    assert httpx.post(url, headers=headers, content=body).status_code == 200


def test_a_public_address_needs_insecure_public():
    run = subprocess.run(
        [strata_bin(), "serve", "--e2b", "0.0.0.0:0", "--api-key", "k" * 20],
        capture_output=True, text=True, timeout=30,
    )
    assert run.returncode == 2
    assert "--insecure-public" in run.stderr


def test_a_short_api_key_is_refused():
    run = subprocess.run(
        [strata_bin(), "serve", "--e2b", "127.0.0.1:0", "--api-key", "short"],
        capture_output=True, text=True, timeout=30,
    )
    assert run.returncode == 2
    assert "at least 16" in run.stderr


def test_too_many_sandboxes_are_refused(server):
    made = []
    try:
        with pytest.raises(Exception, match="max-sandboxes"):
            for _ in range(9):
                made.append(Sandbox.create(api_key=OTHER_KEY))
        assert len(made) == 8
    finally:
        for sb in made:
            sb.kill()
