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
        str(PACKAGE_DIR / "tests" / "typing_client.py"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
