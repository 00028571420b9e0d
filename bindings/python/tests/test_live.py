"""Live sandboxes from Python: one sandbox for a task (files and processes kept between
execs), output followed as a generator, pause and resume, files, published ports, asyncio,
typed errors for bad input, and nothing left once it is stopped."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

import strata
from conftest import PY, processes_with


def wait_until(what: str, done, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_files_and_processes_live_between_execs_and_stop_ends_them(
    sb: strata.Sandbox, marker: str
) -> None:
    with sb.start() as live:
        assert live.id.startswith("sb-")
        assert live.exec(["sh", "-c", "echo kept > /tmp/note"])["exit_code"] == 0
        result = live.exec(["sh", "-c", "cat /tmp/note; echo err >&2; exit 3"])
        assert (result["exit_code"], result["stdout"], result["stderr"]) == (3, b"kept\n", b"err\n")
        echoed = live.exec(["cat"], stdin=b"piped")
        assert echoed["stdout"] == b"piped"
        pid = live.spawn(["sleep", f"1000.{marker}"])
        wait_until("the detached process runs", lambda: processes_with(marker) != [])
        listed = {p["pid"]: p for p in live.ps()}
        assert listed[pid]["state"] == "running"
        assert live.info()["receipt"]
    assert live.stopped
    assert processes_with(marker) == [], "stop ends every process of the sandbox"


def test_output_is_followed_as_a_generator_until_the_process_exits(sb: strata.Sandbox) -> None:
    with sb.start() as live:
        pid = live.spawn(["sh", "-c", "echo one; sleep 0.2; echo two >&2; exit 4"])
        chunks = list(strata.follow(live, pid))
        assert b"".join(d for s, d in chunks if s == "stdout") == b"one\n"
        assert b"".join(d for s, d in chunks if s == "stderr") == b"two\n"
        assert live.wait(pid)["exit_code"] == 4
        assert live.logs(pid) == b"one\ntwo\n"


def test_pause_stops_the_processes_and_resume_continues_them(sb: strata.Sandbox) -> None:
    with sb.start() as live:
        pid = live.spawn(
            ["sh", "-c", "i=0; while :; do i=$((i+1)); [ $((i % 5000)) = 0 ] && echo $i; done"]
        )
        wait_until("the loop prints", lambda: live.logs(pid) != b"")
        assert live.pause() in ("freezer", "signals")
        assert live.info()["paused"]
        time.sleep(0.3)
        before = live.logs(pid)
        time.sleep(0.7)
        assert live.logs(pid) == before, "nothing runs while paused"
        with pytest.raises(strata.InvalidRequestError, match="paused"):
            live.exec(["true"])
        live.resume()
        wait_until("the loop prints again", lambda: len(live.logs(pid)) > len(before))


def test_files_in_and_out_never_follow_a_planted_symlink(
    sb: strata.Sandbox, tmp_path: Path
) -> None:
    with sb.start() as live:
        live.write_file("/tmp/d/a.txt", b"from python")
        assert live.exec(["cat", "/tmp/d/a.txt"])["stdout"] == b"from python"
        assert [e["name"] for e in live.list_dir("/tmp/d")] == ["a.txt"]
        assert live.stat("/tmp/d/a.txt")["kind"] == "file"
        live.mkdir("/tmp/d/sub", parents=True)
        live.rename("/tmp/d/a.txt", "/tmp/d/sub/b.txt")
        source = tmp_path / "tree"
        (source / "x").mkdir(parents=True)
        (source / "x" / "y.bin").write_bytes(bytes(range(256)))
        assert live.upload(source, "/tmp/up")["files"] == 1
        assert live.download("/tmp/up", tmp_path / "back")["bytes"] == 256
        assert (tmp_path / "back" / "x" / "y.bin").read_bytes() == bytes(range(256))
        live.exec(["ln", "-s", "/etc/hostname", "/tmp/link"])
        with pytest.raises(strata.InvalidRequestError):
            live.read_file("/tmp/link")
        with pytest.raises(strata.InvalidRequestError):
            live.read_file("../etc/passwd")
        live.remove("/tmp/d")
        assert live.exec(["test", "-e", "/tmp/d"])["exit_code"] == 1


def test_a_published_port_reaches_the_server_inside(sb: strata.Sandbox) -> None:
    server = (
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "s.bind(('127.0.0.1',8000))\ns.listen(8)\nwhile True:\n  c,_=s.accept()\n"
        "  c.sendall(b'hi from inside')\n  c.close()\n"
    )
    with sb.start() as live:
        live.spawn([PY, "-c", server])
        port = live.publish(8000)
        assert port["host_ip"] == "127.0.0.1" and port["guest_port"] == 8000

        def answer() -> bytes:
            try:
                with socket.create_connection(("127.0.0.1", port["host_port"]), timeout=5) as c:
                    return c.recv(100)
            except OSError:
                return b""

        wait_until("the server answers", lambda: answer() == b"hi from inside")
        assert live.info()["ports"] == [port]


def test_bad_input_is_a_typed_error_and_nothing_runs(sb: strata.Sandbox) -> None:
    with sb.start() as live:
        with pytest.raises(strata.InvalidRequestError):
            live.exec([])
        with pytest.raises(TypeError):
            live.exec("ls -l")  # type: ignore[arg-type]
        with pytest.raises(strata.InvalidRequestError):
            live.exec(["true"], env={"BAD NAME": "x"})
        with pytest.raises(strata.InvalidRequestError):
            live.kill(999999)
        with pytest.raises(strata.InvalidRequestError):
            live.spawn(["true"], tty=(0, 80))
    with pytest.raises(strata.InvalidRequestError, match="stopped"):
        live.exec(["true"])
    with pytest.raises(strata.InvalidRequestError):
        strata.LiveSandbox.attach("sb-0000000000000000")


def test_asyncio_live_sandbox(sb: strata.Sandbox) -> None:
    async def main() -> None:
        async with await sb.astart() as live:
            result = await live.exec(["sh", "-c", "echo async"])
            assert result["stdout"] == b"async\n"
            pid = await live.spawn(["sh", "-c", "echo a; echo b"])
            chunks = [data async for _, data in live.stream(pid)]
            assert b"".join(chunks) == b"a\nb\n"
            assert (await live.wait(pid))["exit_code"] == 0
            await live.write_file("/tmp/f", b"x")
            assert await live.read_file("/tmp/f") == b"x"

    asyncio.run(main())


def test_a_live_sandbox_in_an_image_runs_every_exec_there_and_ends_with_stop(marker: str) -> None:
    # The repository's test images, built from Debian packages (cached; never pulled).
    repo = Path(__file__).resolve().parents[3]
    subprocess.run([str(repo / "scripts" / "build-test-images.sh")], check=True, capture_output=True)
    image = repo / ".ci" / "cache" / "images" / "python-oci"
    with strata.Sandbox("container") as containers:
        with containers.start(strata.Caps(image=str(image), timeout=30)) as live:
            info = live.info()
            assert info["backend"] == "container"
            assert info["receipt"]["container"]["runtime"] == "native"
            ran = live.exec(["python3", "-c", "print(6 * 7)"])
            assert (ran["exit_code"], ran["stdout"]) == (0, b"42\n"), ran
            assert live.exec(["sh", "-c", "echo kept > /usr/note"])["exit_code"] == 0
            assert live.exec(["cat", "/usr/note"])["stdout"] == b"kept\n"
            live.spawn(["sleep", f"1000.{marker}"])
            wait_until("the detached process runs", lambda: processes_with(marker) != [])
    assert processes_with(marker) == [], "stop ends every process of the sandbox"


def test_a_live_sandbox_under_a_tier_refuses_a_program_beyond_it_and_audits_every_exec(
    tmp_path: Path,
) -> None:
    audit = tmp_path / "audit.jsonl"
    with strata.Sandbox("process", tier="medium", audit=audit) as sb:
        with sb.start() as live:
            assert live.info()["receipt"]["policy"]["tier"] == "medium"
            assert live.exec(["echo", "approved"])["stdout"] == b"approved\n"
            with pytest.raises(strata.DeniedError, match="program:uname"):
                live.exec(["uname"])
    kinds = [r["event"] for r in map(json.loads, audit.read_text().splitlines())]
    execs = [(e["command"], e["status"]) for e in kinds if e["kind"] == "exec"]
    assert ("echo approved", "started") in execs and ("echo approved", "exited 0") in execs
    assert any(c == "uname" and s.startswith("refused") for c, s in execs), execs
    assert strata.verify_audit(audit)["records"] == len(kinds)


def test_a_live_microvm_keeps_one_vm_pauses_its_vcpus_and_serves_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The microVM backend from Python: every exec in one VM (one boot id), pause stops the
    VM's vCPUs ("vm"), files go through the guest agent, and stop switches the VM off."""
    import os

    root = Path(__file__).resolve().parents[3]
    target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    agent = target / "release" / "strata-guest-agent"
    assert agent.is_file(), f"{agent} missing: cargo build --release --workspace --bins"
    built = subprocess.run(
        [str(root / "scripts" / "build-vm-guest.sh")], capture_output=True, text=True
    )
    assert built.returncode == 0, "scripts/build-vm-guest.sh failed:\n" + built.stderr
    monkeypatch.setenv("STRATA_VM_AGENT", str(agent))
    vm = strata.Sandbox(backend="microvm")
    with vm.start() as live:
        assert live.info()["backend"] == "microvm"
        boot = live.exec(["cat", "/proc/sys/kernel/random/boot_id"])["stdout"]
        live.write_file("/tmp/in.txt", b"from python")
        again = live.exec(["sh", "-c", "cat /tmp/in.txt; echo; cat /proc/sys/kernel/random/boot_id"])
        assert again["stdout"] == b"from python\n" + boot
        assert live.read_file("/tmp/in.txt") == b"from python"
        assert live.pause() == "vm"
        live.resume()
        assert live.exec(["true"])["exit_code"] == 0
    assert live.stopped
