"""The runnable example, the type stubs (mypy.stubtest) and typed client code (mypy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE_DIR = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "python" / "agent_tool.py"


def test_agent_example_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "north sold most: 265" in out
    assert "refused: Read-only file system" in out or "refused: Permission denied" in out
    assert "/etc/shadow not visible" in out
    assert "no network" in out
    assert "timed out after 3 s" in out
    assert "== receipt of the first run\nbackend: process" in out


def test_two_agent_example_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python" / "two_agents.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for expected in [
        "coder accepted 'fix add() in calc.py' from planner, to run under tier low",
        "a replay of it was refused",
        "the fix ran on process",
        "approved run: would pip install here (grant 1)",
        "a second network run was refused",
        "commit refused .git/hooks/post-checkout",
        "calc.py now: return a + b",
        "hook on the host: False",
        "planner got: {'fixed': 'add'}",
        "audit log intact:",
    ]:
        assert expected in out, out


def _example(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python" / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_sessions_example_runs() -> None:
    out = _example("sessions.py")
    for expected in [
        "uploaded 2 files",
        "call 1: total 345",
        "call 2 sees call 1's files: summary.txt 2",
        "call 3 timed out: True",
        "downloaded: rows 3",
        "closed; the session's directory is gone: True",
        "async: hello from an async session",
    ]:
        assert expected in out, out


def test_deepagents_example_runs() -> None:
    out = _example("deepagents_backend.py")
    assert "execute: 5050 exit 0" in out, out
    assert "timed out call: exit 124" in out, out
    assert "('/etc/passwd', 'permission_denied')" in out, out
    assert "('/workspace/nope', 'file_not_found')" in out, out


def test_openai_sandbox_example_runs() -> None:
    out = _example("openai_sandbox.py")
    assert "agent: The answer is 42." in out and "answer.txt: 42" in out, out


def test_mcp_client_example_runs() -> None:
    from test_mcp import strata_cli

    out = _example("mcp_client.py", strata_cli())
    assert "run: 42" in out and "session_run: persisted" in out, out
    assert "a failing run is an isError result: True" in out, out


def _mypy(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy", reason="mypy is a test dependency")
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=PACKAGE_DIR, timeout=600
    )


def test_stubs_match_the_native_module() -> None:
    proc = _mypy(
        "mypy.stubtest", "strata", "--allowlist", str(PACKAGE_DIR / "stubtest-allowlist.txt")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_typed_client_code_checks_strictly() -> None:
    proc = _mypy(
        "mypy",
        "--strict",
        str(EXAMPLE),
        str(ROOT / "examples" / "python" / "two_agents.py"),
        str(ROOT / "examples" / "python" / "sessions.py"),
        str(ROOT / "examples" / "python" / "deepagents_backend.py"),
        str(ROOT / "examples" / "python" / "openai_sandbox.py"),
        str(PACKAGE_DIR / "tests" / "typing_client.py"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
