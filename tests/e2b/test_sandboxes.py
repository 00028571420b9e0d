"""Sandbox lifecycle through the official SDK: create, list, info, kill, timeouts, pause."""

import time

import pytest
from e2b import Sandbox, SandboxQuery
from e2b.exceptions import NotFoundException, SandboxException


def test_create_run_kill(server):
    sb = Sandbox.create(metadata={"suite": "lifecycle"}, envs={"FROM_CREATE": "yes"})
    try:
        assert sb.is_running()
        result = sb.commands.run("echo $FROM_CREATE; pwd; python3 -c 'print(6*7)'")
        assert result.stdout == "yes\n/home/user\n42\n"
        info = sb.get_info()
        assert info.sandbox_id == sb.sandbox_id
        assert info.metadata == {"suite": "lifecycle"}
        assert info.state.value == "running"
    finally:
        assert sb.kill()
    assert not sb.is_running()
    assert not Sandbox.kill(sb.sandbox_id)


def test_list_filters_by_metadata_and_pages(server):
    made = [Sandbox.create(metadata={"suite": "list", "n": str(i)}) for i in range(3)]
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"suite": "list"}), limit=2)
        first = found.next_items()
        assert len(first) == 2 and found.has_next
        rest = found.next_items()
        ids = {s.sandbox_id for s in first + rest}
        assert ids == {s.sandbox_id for s in made}
        one = Sandbox.list(query=SandboxQuery(metadata={"suite": "list", "n": "1"})).next_items()
        assert [s.sandbox_id for s in one] == [made[1].sandbox_id]
    finally:
        for sb in made:
            sb.kill()


def test_timeout_ends_the_sandbox(server):
    sb = Sandbox.create(timeout=1)
    deadline = time.time() + 20
    while sb.is_running() and time.time() < deadline:
        time.sleep(0.25)
    assert not sb.is_running()
    with pytest.raises(NotFoundException):
        sb.get_info()


def test_set_timeout_moves_the_end(sandbox):
    before = sandbox.get_info().end_at
    sandbox.set_timeout(600)
    after = sandbox.get_info().end_at
    assert after > before


def test_pause_keeps_processes_and_connect_resumes(server):
    sb = Sandbox.create()
    try:
        sb.commands.run("echo kept > /tmp/state")
        handle = sb.commands.run("sleep 60", background=True, timeout=0)
        assert sb.pause()
        assert not sb.pause()  # already paused: 409, read as False
        assert Sandbox.get_info(sb.sandbox_id).state.value == "paused"
        assert not sb.is_running()
        resumed = Sandbox.connect(sb.sandbox_id)
        assert resumed.get_info().state.value == "running"
        assert resumed.files.read("/tmp/state") == "kept\n"
        assert handle.pid in [p.pid for p in resumed.commands.list()]
    finally:
        sb.kill()


def test_unknown_template_is_refused(server):
    with pytest.raises(SandboxException, match="template"):
        Sandbox.create(template="no-such-template")


def test_metrics_report_a_sample(sandbox):
    sandbox.commands.run("python3 -c 'sum(range(2_000_000))'")
    metrics = sandbox.get_metrics()
    assert len(metrics) == 1
    assert metrics[0].cpu_used_pct >= 0
