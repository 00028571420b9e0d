"""Sessions from Python: files across calls on the process and wasm backends, exact copies,
refusals of what a tool planted, per-call timeouts, asyncio, and nothing left behind."""

from __future__ import annotations

import asyncio
import glob
import os
import tempfile
import time
from pathlib import Path

import pytest

import strata
from conftest import PY


def session_dirs() -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), "strata-session-*"))


def test_files_persist_across_calls_and_close_removes_them(sb: strata.Sandbox) -> None:
    before = set(session_dirs())
    with sb.session() as s:
        assert s.workdir == "/workspace" and s.id.startswith("s-")
        s.write_file("notes.txt", "one\n")
        assert s.run(["/bin/sh", "-c", "echo two >> notes.txt"]).ok
        result = s.run(["/bin/sh", "-c", "cat /workspace/notes.txt; pwd"])
        assert result.stdout == "one\ntwo\n/workspace\n"
        assert [e["name"] for e in s.list_files()] == ["notes.txt"]
        assert set(session_dirs()) - before, "the session has a directory while open"
    assert s.closed
    assert set(session_dirs()) == before
    with pytest.raises(strata.InvalidRequestError, match="is closed"):
        s.run(["true"])


def test_binary_round_trip_is_exact_including_nul_bytes(
    sb: strata.Sandbox, tmp_path: Path
) -> None:
    blob = bytes(range(256)) * 1000 + b"\0\0end"
    src = tmp_path / "src"
    (src / "deep" / "er").mkdir(parents=True)
    (src / "deep" / "er" / "blob.bin").write_bytes(blob)
    with sb.session() as s:
        up = s.upload(src, "in")
        assert (up["files"], up["bytes"]) == (1, len(blob))
        code = (
            "import hashlib; d=open('in/deep/er/blob.bin','rb').read();"
            "open('out.bin','wb').write(d[::-1]); print(hashlib.sha256(d).hexdigest())"
        )
        import hashlib

        assert s.run([PY, "-c", code]).stdout.strip() == hashlib.sha256(blob).hexdigest()
        assert s.read_file("out.bin") == blob[::-1]
        s.download("in", tmp_path / "back")
        assert (tmp_path / "back" / "deep" / "er" / "blob.bin").read_bytes() == blob


def test_tool_planted_symlink_is_not_followed_and_paths_cannot_escape(
    sb: strata.Sandbox, tmp_path: Path
) -> None:
    with sb.session() as s:
        assert s.run(["/bin/sh", "-c", "ln -s /etc/shadow leak; ln -s / up"]).ok
        for path in ["leak", "up/etc/passwd", "../etc/passwd", "/etc/passwd"]:
            with pytest.raises(strata.InvalidRequestError):
                s.read_file(path)
        with pytest.raises(strata.InvalidRequestError, match="symlink"):
            s.download(".", tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_per_call_timeout_and_zero_means_none(sb: strata.Sandbox) -> None:
    with sb.session(strata.Caps(timeout=0.5)) as s:
        assert s.run(["sleep", "3"]).timed_out
        assert s.run(["/bin/sh", "-c", "sleep 1; echo done"], timeout=0).stdout == "done\n"
        assert s.run(["sleep", "3"], timeout=0.3).timed_out
        with pytest.raises(strata.InvalidRequestError):
            s.run(["true"], timeout=-1)


def test_sessions_are_isolated_from_each_other(sb: strata.Sandbox) -> None:
    with sb.session() as a, sb.session() as b:
        a.write_file("secret", b"a only")
        assert b.list_files() == []
        probe = b.run(["/bin/sh", "-c", "cat /workspace/secret 2>/dev/null || echo none"])
        assert probe.stdout == "none\n"


def test_bad_arguments_are_refused_with_typed_errors(sb: strata.Sandbox) -> None:
    with pytest.raises(strata.InvalidRequestError, match="workdir"):
        sb.session(workdir="relative")
    with pytest.raises(strata.InvalidRequestError, match="max_transfer"):
        sb.session(max_transfer="lots")
    with sb.session(max_transfer=10) as s:
        with pytest.raises(strata.InvalidRequestError, match="too large"):
            s.write_file("big", b"x" * 11)
        with pytest.raises(TypeError):
            s.write_file("x", 42)  # type: ignore[arg-type]


def test_wasm_session_runs_python_on_files_from_earlier_calls() -> None:
    with strata.Sandbox(backend="wasm") as wasm, wasm.session() as s:
        s.write_file("in.txt", "wasm")
        first = s.run(
            strata.Tool.script(
                "python", "open('/workspace/out.txt','w').write(open('/workspace/in.txt').read()*2)"
            )
        )
        assert first.ok, first.stderr
        second = s.run(strata.Tool.script("python", "print(open('/workspace/out.txt').read())"))
        assert second.stdout.strip() == "wasmwasm"
        assert second.receipt.backend == "wasm"


def test_async_session_runs_streams_and_cancels(sb: strata.Sandbox) -> None:
    async def main() -> None:
        async with sb.asession() as s:
            await s.write_file("a.txt", b"async")
            chunks: list[str] = []
            result = await s.run(["cat", "a.txt"], on_stdout=chunks.append)
            assert result.stdout == "async" and "".join(chunks) == "async"
            assert await s.read_file("a.txt") == b"async"
            assert [e["kind"] for e in await s.list_files()] == ["file"]
            task = asyncio.ensure_future(s.run(["sleep", "30"], timeout=0))
            await asyncio.sleep(0.5)
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert time.monotonic() - started < 10
        assert s.closed

    asyncio.run(main())


def test_profile_session_table_sets_the_workdir(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text('backend = "process"\n[session]\nworkdir = "/work"\n')
    with strata.Sandbox(profile=profile, warm_pool=0) as sandbox, sandbox.session() as s:
        assert s.workdir == "/work"
        assert s.run(["pwd"]).stdout == "/work\n"


def test_microvm_session_keeps_files_between_calls_in_fresh_guests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import subprocess

    root = Path(__file__).resolve().parents[3]
    target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    agent = target / "release" / "strata-guest-agent"
    assert agent.is_file(), f"{agent} missing: cargo build --release --workspace --bins"
    built = subprocess.run(
        [str(root / "scripts" / "build-vm-guest.sh")], capture_output=True, text=True
    )
    assert built.returncode == 0, "scripts/build-vm-guest.sh failed:\n" + built.stderr
    monkeypatch.setenv("STRATA_VM_AGENT", str(agent))
    with strata.Sandbox(backend="microvm") as vm, vm.session() as s:
        s.write_file("in.bin", b"a\0b")
        first = s.run(["/bin/sh", "-c", "od -An -c in.bin | tr -s ' ' > seen.txt"])
        assert first.ok, first.stderr
        assert first.receipt.backend == "microvm"
        second = s.run(["/bin/sh", "-c", "cat seen.txt; echo more >> seen.txt"])
        assert second.stdout.strip() == "a \\0 b"
        assert s.read_file("seen.txt") == b" a \\0 b\nmore\n"
