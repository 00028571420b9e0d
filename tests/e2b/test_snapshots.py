"""Snapshots and fork through the official SDK: a snapshot carries the sandbox's files, a
sandbox made from it has them, fork makes independent copies, and another API key sees
none of it."""

import os
import stat

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException, SandboxException

from conftest import OTHER_KEY


def test_a_snapshot_outlives_its_sandbox_and_starts_new_ones(server):
    sb = Sandbox.create(timeout=120)
    try:
        sb.files.write("/home/user/notes.txt", "kept\n")
        sb.commands.run("mkdir -p /home/user/proj && echo 7 > /home/user/proj/n")
        snap = sb.create_snapshot(name="notes-snap", mode="filesystem")
        assert snap.snapshot_id == "notes-snap:default"
        assert snap.names == ["notes-snap:default"]
        assert sb.commands.run("echo alive").stdout == "alive\n"
        listed = [s.snapshot_id for s in sb.list_snapshots().next_items()]
        assert listed == ["notes-snap:default"]
    finally:
        sb.kill()
    child = Sandbox.create(snap.snapshot_id, timeout=60)
    try:
        assert child.sandbox_id != sb.sandbox_id
        assert child.files.read("/home/user/notes.txt") == "kept\n"
        assert child.commands.run("cat proj/n; pwd").stdout == "7\n/home/user\n"
    finally:
        child.kill()
    assert Sandbox.delete_snapshot(snap.snapshot_id)
    assert not Sandbox.delete_snapshot(snap.snapshot_id)
    with pytest.raises(SandboxException):
        Sandbox.create(snap.snapshot_id)


def test_the_snapshot_store_is_private_to_its_owner(server, sandbox):
    snap = sandbox.create_snapshot()
    try:
        for root, dirs, files in os.walk(server.snapshots):
            for name in dirs:
                mode = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
                assert mode & 0o077 == 0, (root, name, oct(mode))
            for name in files:
                mode = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
                assert mode & 0o077 == 0, (root, name, oct(mode))
    finally:
        Sandbox.delete_snapshot(snap.snapshot_id)


def test_another_keys_snapshots_are_not_found(server, sandbox):
    snap = sandbox.create_snapshot(name="mine-only")
    try:
        others = Sandbox.list_snapshots(api_key=OTHER_KEY).next_items(api_key=OTHER_KEY)
        assert others == []
        with pytest.raises(SandboxException):
            Sandbox.create(snap.snapshot_id, api_key=OTHER_KEY)
        assert not Sandbox.delete_snapshot(snap.snapshot_id, api_key=OTHER_KEY)
        mine = Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id).next_items()
        assert [s.snapshot_id for s in mine] == ["mine-only:default"]
    finally:
        assert Sandbox.delete_snapshot(snap.snapshot_id)


def test_a_memory_snapshot_is_refused_by_name(sandbox):
    with pytest.raises(SandboxException, match="memory snapshot"):
        sandbox.create_snapshot(mode="full")


def test_fork_makes_independent_copies_and_keeps_the_parent(server, sandbox):
    sandbox.files.write("/home/user/state.txt", "before")
    end_before = sandbox.get_info().end_at
    forks = sandbox.fork(count=2, timeout=60)
    try:
        assert len(forks) == 2
        for fork in forks:
            assert isinstance(fork, Sandbox), fork
            assert fork.sandbox_id != sandbox.sandbox_id
            assert fork.files.read("/home/user/state.txt") == "before"
        forks[0].files.write("/home/user/state.txt", "changed in fork 0")
        assert forks[1].files.read("/home/user/state.txt") == "before"
        assert sandbox.files.read("/home/user/state.txt") == "before"
        assert sandbox.commands.run("echo parent").stdout == "parent\n"
        assert sandbox.get_info().end_at == end_before
        assert sandbox.get_info().state.value == "running"
    finally:
        for fork in forks:
            if isinstance(fork, Sandbox):
                fork.kill()
    assert os.listdir(server.snapshots / "forks") == [".key"]


def test_fork_beyond_the_key_limit_reports_each_failure(server, sandbox):
    forks = sandbox.fork(count=9, timeout=30)
    try:
        made = [f for f in forks if isinstance(f, Sandbox)]
        failed = [f for f in forks if not isinstance(f, Sandbox)]
        assert len(forks) == 9
        assert made and failed
        assert all("max-sandboxes" in str(f) for f in failed)
    finally:
        for fork in forks:
            if isinstance(fork, Sandbox):
                fork.kill()


def test_fork_of_a_missing_sandbox_is_not_found(server):
    with pytest.raises(NotFoundException):
        Sandbox.fork("inothere0000000000000", count=1)
