"""Shared fixtures: real sandboxes (process backend), Debian's interpreter, and checks that
nothing a run started is left behind."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Iterator, List

import pytest

import strata

#: Debian's interpreter: the `python3` first on PATH may be a slow pyenv shim.
PY = "/usr/bin/python3"


@pytest.fixture(scope="session")
def sb() -> Iterator[strata.Sandbox]:
    """One process-backend sandbox shared by the session (it is thread-safe). Its warm pool
    is off: the leak checks below count helper processes, and a pre-built sandbox is one
    by design (``test_default_sandbox_prebuilds_and_close_kills_what_it_built`` covers it)."""
    sandbox = strata.Sandbox(backend="process", warm_pool=0)
    yield sandbox
    sandbox.close()


@pytest.fixture
def marker() -> str:
    """A unique token to put on a sandboxed command line and look for afterwards."""
    return f"{uuid.uuid4().int % 10**9}"


def processes_with(token: str) -> List[int]:
    """Pids of host processes whose command line contains ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(entry))
    return found


def child_processes() -> List[int]:
    """Pids of this test process's children (helpers it spawned and did not reap)."""
    me = str(os.getpid())
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces; ppid follows it.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[1] == me:
            children.append(int(entry))
    return children


def assert_nothing_left(token: str, grace: float = 5.0) -> None:
    """Fails if a process carrying ``token`` still exists (the tool's processes are gone
    when a run returns), or if a child of this process is still there after ``grace``
    seconds (a run returns before its helper has finished exiting: the kernel tears the
    namespaces down after the result is back)."""
    assert processes_with(token) == [], f"processes with {token} survived the run"
    deadline = time.monotonic() + grace
    while child_processes() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert child_processes() == [], "a helper process of this test survived the run"
