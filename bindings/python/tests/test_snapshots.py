"""Snapshots and fork of live sandboxes from Python: a snapshot carries the sandbox's own
files and says so, a sandbox started from it has them, fork children are independent, an
altered snapshot raises DeniedError, and removing one leaves nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import strata


def out(live: strata.LiveSandbox, script: str) -> bytes:
    result = live.exec(["sh", "-c", script])
    assert result["exit_code"] == 0, result
    return result["stdout"]


def test_snapshot_and_start_from_carry_the_files_and_say_what_they_carry(
    sb: strata.Sandbox, tmp_path: Path
) -> None:
    store = tmp_path / "snapshots"
    with sb.start() as live:
        out(live, "mkdir -p /tmp/d && echo kept > /tmp/d/note")
        info = live.snapshot("py-base", snapshot_dir=store)
        assert info["name"] == "py-base" and info["id"].startswith("snap-")
        assert "files:/tmp" in info["carries"]
        assert any("processes" in item for item in info["not_carried"])
        assert info["source"] == live.id
    assert [s["name"] for s in strata.snapshots(snapshot_dir=store)] == ["py-base"]
    with sb.start_from("py-base", snapshot_dir=store) as copy:
        assert out(copy, "cat /tmp/d/note") == b"kept\n"
        assert "started from snapshot py-base" in str(copy.info()["receipt"])
    strata.remove_snapshot("py-base", snapshot_dir=store)
    assert strata.snapshots(snapshot_dir=store) == []
    assert sorted(p.name for p in store.iterdir()) == [".key"], "nothing of it is left"


def test_fork_children_do_not_see_each_others_writes(sb: strata.Sandbox, tmp_path: Path) -> None:
    store = tmp_path / "snapshots"
    with sb.start() as parent:
        out(parent, "echo before > /tmp/f")
        children = parent.fork(2, snapshot_dir=store)
        try:
            assert len({c.id for c in children} | {parent.id}) == 3
            out(children[0], "echo mine > /tmp/f")
            out(parent, "echo parent > /tmp/f")
            assert out(children[1], "cat /tmp/f") == b"before\n"
            assert out(children[0], "cat /tmp/f") == b"mine\n"
        finally:
            for child in children:
                child.stop()
        with pytest.raises(strata.InvalidRequestError, match="1 to 100"):
            parent.fork(101, snapshot_dir=store)
    assert sorted(p.name for p in store.iterdir()) == [".key"]


def test_an_altered_snapshot_raises_denied(sb: strata.Sandbox, tmp_path: Path) -> None:
    store = tmp_path / "snapshots"
    with sb.start() as live:
        out(live, "echo original > /tmp/a")
        live.snapshot("edited", snapshot_dir=store)
    stored = store / "edited" / "files" / "t0" / "a"
    stored.write_text("tampered")
    with pytest.raises(strata.DeniedError, match="altered"):
        sb.start_from("edited", snapshot_dir=store)
    with pytest.raises(strata.InvalidRequestError, match="no snapshot"):
        sb.start_from("missing", snapshot_dir=store)


def test_snapshot_and_fork_work_from_asyncio(sb: strata.Sandbox, tmp_path: Path) -> None:
    store = tmp_path / "snapshots"

    async def main() -> bytes:
        async with await sb.astart() as live:
            await live.exec(["sh", "-c", "echo async > /tmp/x"])
            info = await live.snapshot("async-one", snapshot_dir=store)
            assert info["name"] == "async-one"
            children = await live.fork(1, snapshot_dir=store)
            try:
                return children[0].exec(["cat", "/tmp/x"])["stdout"]
            finally:
                children[0].stop()

    assert asyncio.run(main()) == b"async\n"
