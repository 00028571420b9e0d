"""Running tools: every public path of Sandbox.run, RunResult and Receipt, on the real
process backend."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

import strata
from conftest import PY, assert_nothing_left, child_processes


def test_argv_list_runs_and_result_is_readable(sb: strata.Sandbox) -> None:
    result = sb.run([PY, "-c", "import sys; print('hi'); print('warn', file=sys.stderr)"])
    assert result.ok
    assert result.exit_code == 0
    assert result.stdout == "hi\n"
    assert result.stderr == "warn\n"
    assert result.stdout_bytes == b"hi\n"
    assert result.stderr_bytes == b"warn\n"
    assert not result.stdout_truncated and not result.stderr_truncated
    assert result.signal is None
    assert not result.timed_out
    assert result.limit is None
    assert result.status == "exit code 0"
    assert result.duration > 0
    assert result.backend == "process"
    assert set(result.usage) == {"user_cpu_us", "system_cpu_us", "peak_memory_bytes"}
    assert result.check() is result


def test_non_zero_exit_is_data_and_check_raises_tool_failed(sb: strata.Sandbox) -> None:
    result = sb.run([PY, "-c", "import sys; print('partial'); sys.exit(3)"])
    assert not result.ok
    assert result.exit_code == 3
    assert result.stdout == "partial\n"
    with pytest.raises(strata.ToolFailedError) as info:
        result.check()
    assert info.value.code == "tool_failed"
    assert info.value.result is result
    assert "exit code 3" in str(info.value)


def test_tool_kinds(sb: strata.Sandbox) -> None:
    py = strata.Tool.script("python", "print(6 * 7)")
    assert (py.kind, py.language, py.source, py.argv) == ("script", "python", "print(6 * 7)", None)
    assert sb.run(py).stdout == "42\n"
    sh = strata.Tool.script("sh", "echo $((40 + 2))")
    assert sb.run(sh).stdout == "42\n"
    cmd = strata.Tool.command(["/bin/echo", "a b"])
    assert (cmd.kind, cmd.argv) == ("command", ["/bin/echo", "a b"])
    assert sb.run(cmd).stdout == "a b\n"
    assert sb.run(("/bin/echo", "tuple")).stdout == "tuple\n"
    assert sb.run([Path("/bin/echo"), "path"]).stdout == "path\n"
    wasm = strata.Tool.wasm("/tmp/m.wasm", ["x"])
    assert (wasm.kind, wasm.module, wasm.args) == ("wasm", "/tmp/m.wasm", ["x"])
    assert cmd == strata.Tool.command(["/bin/echo", "a b"])
    assert cmd != sh
    assert repr(cmd) == "Tool.command(['/bin/echo', 'a b'])"
    assert repr(py) == "Tool.script(\"python\", 'print(6 * 7)')"
    assert cmd.to_dict() == {"kind": "command", "argv": ["/bin/echo", "a b"]}
    assert strata.Tool.script("js", "1").language == "javascript"


def test_stdin_env_and_workdir(sb: strata.Sandbox, tmp_path: Path) -> None:
    echo_stdin = [PY, "-c", "import sys; print(sys.stdin.read().upper())"]
    assert sb.run(echo_stdin, {"stdin": "text"}).stdout == "TEXT\n"
    assert sb.run(echo_stdin, {"stdin": b"bytes"}).stdout == "BYTES\n"
    os.environ["STRATA_TEST_HOST_SECRET"] = "canary"
    try:
        result = sb.run(
            [PY, "-c", "import os; print(os.environ.get('GIVEN'), os.environ.get('STRATA_TEST_HOST_SECRET'))"],
            strata.Caps(env={"GIVEN": "yes"}),
        )
    finally:
        del os.environ["STRATA_TEST_HOST_SECRET"]
    assert result.stdout == "yes None\n", "only declared env reaches the tool"
    (tmp_path / "f.txt").write_text("in workdir")
    result = sb.run(["/bin/cat", "f.txt"], strata.Caps(read_only=[(tmp_path, "/work")], workdir="/work"))
    assert result.stdout == "in workdir"


def test_read_only_and_read_write_mounts(sb: strata.Sandbox, tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = tmp_path / "out"
    data.mkdir()
    out.mkdir()
    (data / "in.txt").write_text("input")
    code = """
import pathlib
print(pathlib.Path('/data/in.txt').read_text())
try:
    pathlib.Path('/data/in.txt').write_text('x')
    print('WROTE')
except OSError as e:
    print('denied', e.errno)
pathlib.Path('/out/result.txt').write_text('output')
"""
    caps = strata.Caps(read_only={str(data): "/data"}, read_write=[(out, "/out")])
    result = sb.run([PY, "-c", code], caps)
    assert result.ok, result.stderr
    assert result.stdout.startswith("input\ndenied ")
    assert (data / "in.txt").read_text() == "input"
    assert (out / "result.txt").read_text() == "output"
    # Nothing else of the host is visible.
    secret = sb.run(["/bin/cat", str(tmp_path / "data" / "in.txt")], caps)
    assert secret.exit_code != 0


def test_symlinked_grant_is_refused_unless_follow_symlinks(sb: strata.Sandbox, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "f.txt").write_text("linked")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(strata.InvalidRequestError, match="is a symlink"):
        sb.run(["/bin/cat", f"{link}/f.txt"], strata.Caps(read_only=[link]))
    caps = strata.Caps(mounts=[{"host": str(link), "guest": "/data", "follow_symlinks": True}])
    assert caps.mounts[0]["follow_symlinks"] is True
    result = sb.run(["/bin/cat", "/data/f.txt"], caps)
    assert result.stdout == "linked"
    details = [e["detail"] for e in result.receipt.enforced]
    assert any(f"/data={real} (symlinks followed from {link})" in d for d in details), details


def test_git_hook_in_read_write_grant_stays_read_only_unless_opted_out(
    sb: strata.Sandbox, tmp_path: Path
) -> None:
    hooks = tmp_path / "repo" / ".git" / "hooks"
    hooks.mkdir(parents=True)
    hook = hooks / "pre-commit"
    hook.write_text("original\n")
    attack = ["/bin/sh", "-c", f"echo evil > {hook}"]
    denied = sb.run(attack, strata.Caps(read_write=[tmp_path / "repo"]))
    assert denied.exit_code != 0
    assert hook.read_text() == "original\n"
    assert any(
        f"host-executed paths read-only: {hooks}" in e["detail"] for e in denied.receipt.enforced
    ), denied.receipt.enforced
    caps = strata.Caps(read_write=[tmp_path / "repo"], protect_host_executed=False)
    assert caps.protect_host_executed is False and strata.Caps().protect_host_executed is True
    allowed = sb.run(attack, caps)
    assert allowed.ok, allowed.stderr
    assert hook.read_text() == "evil\n"


def test_timeout_is_data_and_check_raises_a_timeout_error(sb: strata.Sandbox, marker: str) -> None:
    result = sb.run(["/bin/sleep", f"1000.{marker}"], strata.Caps(timeout=0.3))
    assert result.timed_out
    assert result.limit == "wall"
    assert result.exit_code is None
    assert not result.ok
    assert "limit=" in repr(result)
    with pytest.raises(strata.SandboxTimeoutError) as info:
        result.check()
    err = info.value
    assert isinstance(err, TimeoutError)
    assert isinstance(err, strata.LimitExceededError)
    assert isinstance(err, strata.SandboxError)
    assert err.limit == "wall" and err.code == "limit_exceeded" and err.result is result
    assert_nothing_left(marker)


def test_output_limit_truncates(sb: strata.Sandbox) -> None:
    result = sb.run([PY, "-c", "print('x' * 100000)"], strata.Caps(output="4K"))
    assert result.stdout_truncated
    assert len(result.stdout_bytes) <= 4096
    assert result.limit == "output"
    with pytest.raises(strata.LimitExceededError) as info:
        result.check()
    assert not isinstance(info.value, TimeoutError)
    assert info.value.limit == "output"


def test_receipt_and_to_dict(sb: strata.Sandbox) -> None:
    result = sb.run(["/bin/true"])
    receipt = result.receipt
    assert receipt.backend == "process"
    assert receipt.container is None
    assert receipt.network is None, "no allowlist, no egress decisions"
    assert "network" not in receipt.to_dict()
    assert receipt.layers == ["process"]
    assert receipt.strictness == "strict"
    assert receipt.gaps == []
    assert receipt.enforced and set(receipt.enforced[0]) == {
        "capability",
        "kind",
        "mechanism",
        "detail",
    }
    assert receipt.has_kind("syscalls", "seccomp") and receipt.has_kind("fs", "landlock")
    assert not receipt.has_kind("net", "wasm")
    with pytest.raises(strata.InvalidRequestError):
        receipt.has_kind("fs", "magic")
    capabilities = {e["capability"] for e in receipt.enforced}
    assert {"fs", "net", "env"} <= capabilities
    assert receipt.has("net", "netns") or receipt.has("net", "namespace")
    assert not receipt.has("fs", "no-such-mechanism")
    with pytest.raises(strata.InvalidRequestError):
        receipt.has("teleport", "x")
    text = str(receipt)
    assert text.startswith("backend: process")
    assert "fs:" in text
    assert repr(receipt).startswith("Receipt(backend='process'")
    as_dict = result.to_dict()
    assert set(as_dict) >= {
        "exit_code", "signal", "timed_out", "limit", "stdout", "stderr", "stdout_truncated",
        "stderr_truncated", "duration_ms", "usage", "receipt",
    }
    assert as_dict["receipt"] == receipt.to_dict()
    assert repr(result).startswith("RunResult(exit_code=0, duration=")


def test_streaming_callbacks_text_and_bytes(sb: strata.Sandbox) -> None:
    # 'é' is written in two halves, flushed separately: text callbacks never see half of it.
    code = r"""
import sys, time
out = sys.stdout.buffer
for part in (b'a\xc3', b'\xa9b\n', b'end\n'):
    out.write(part); out.flush(); time.sleep(0.05)
sys.stderr.write('err\n')
"""
    chunks: list = []
    errs: list = []
    result = sb.run([PY, "-c", code], on_stdout=chunks.append, on_stderr=errs.append)
    assert "".join(chunks) == "aéb\nend\n" == result.stdout
    assert all(isinstance(c, str) and "\ufffd" not in c for c in chunks)
    assert "".join(errs) == "err\n"
    raw: list = []
    result = sb.run([PY, "-c", code], on_stdout=raw.append, text=False)
    assert b"".join(raw) == result.stdout_bytes == "aéb\nend\n".encode()
    assert all(isinstance(c, bytes) for c in raw)


def test_invalid_utf8_is_replaced_in_text_but_kept_in_bytes(sb: strata.Sandbox) -> None:
    result = sb.run([PY, "-c", "import sys; sys.stdout.buffer.write(b'\\xff ok')"])
    assert result.stdout == "\ufffd ok"
    assert result.stdout_bytes == b"\xff ok"


def test_raising_callback_kills_the_run_and_propagates(sb: strata.Sandbox, marker: str) -> None:
    class Stop(Exception):
        pass

    def on_stdout(chunk: str) -> None:
        raise Stop(chunk)

    with pytest.raises(Stop):
        sb.run(["/bin/sh", "-c", f"echo ready; exec /bin/sleep 1000.{marker}"], on_stdout=on_stdout)
    assert_nothing_left(marker)
    with pytest.raises(TypeError):
        sb.run(["/bin/true"], on_stdout="not callable")  # type: ignore[arg-type]


def test_context_manager_closes_and_close_kills_runs_in_flight(marker: str) -> None:
    with strata.Sandbox(backend="process") as sb:
        assert not sb.closed
        assert sb.run(["/bin/true"]).ok
    assert sb.closed
    with pytest.raises(strata.InvalidRequestError, match="closed"):
        sb.run(["/bin/true"])

    sb = strata.Sandbox(backend="process")
    started = threading.Event()
    outcome: list = []

    def worker() -> None:
        try:
            sb.run(
                ["/bin/sh", "-c", f"echo ready; exec /bin/sleep 1000.{marker}"],
                on_stdout=lambda _: started.set(),
            )
        except BaseException as e:  # noqa: BLE001 (recorded for the assertion below)
            outcome.append(e)

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(30)
    sb.close()
    thread.join(30)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], strata.CancelledError)
    assert outcome[0].code == "cancelled"
    assert_nothing_left(marker)


def test_sandbox_options_and_repr() -> None:
    sb = strata.Sandbox()
    assert (sb.backend, sb.strict) == ("auto", True)
    assert repr(sb) == "Sandbox(backend='auto', strict=True)"
    best = strata.Sandbox("process", strict=False)
    assert (best.backend, best.strict) == ("process", False)
    result = best.run(["/bin/true"])
    assert result.receipt.strictness == "best_effort"


def test_bundled_helper_is_used_and_executable() -> None:
    helper = strata.bundled_helper()
    assert helper is not None, "the wheel must ship strata-helper"
    assert os.access(helper, os.X_OK)
    if "STRATA_HELPER" not in os.environ:
        assert strata.Sandbox().helper == str(helper)


def test_missing_helper_is_backend_unavailable() -> None:
    sb = strata.Sandbox("process", helper="/nonexistent/strata-helper")
    with pytest.raises(strata.BackendUnavailableError) as info:
        sb.run(["/bin/true"])
    assert isinstance(info.value, RuntimeError)
    assert info.value.code == "backend_unavailable"
    assert "/nonexistent/strata-helper" in str(info.value)


def test_doctor_reports_the_process_backend() -> None:
    report = strata.doctor()
    assert report.available("process"), str(report)
    assert "process" in str(report)
    names = [b["backend"] for b in report.backends]
    assert names[:2] == ["process", "wasm"]
    assert report.to_dict()["backends"] == report.backends
    assert repr(report).startswith("DoctorReport(process=ok")


def test_helper_gets_its_own_fds_when_the_host_has_hundreds_open(sb: strata.Sandbox) -> None:
    # Regression: the helper's fds were shuffled through fixed numbers (100+), so an
    # embedding process with that many fds open handed the helper the wrong files.
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(160)]
    try:
        for fd in held[90:130]:
            os.close(fd)
        results = [sb.run(["/bin/echo", str(i)]) for i in range(3)]
    finally:
        for fd in held[:90] + held[130:]:
            os.close(fd)
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]


def test_default_sandbox_prebuilds_and_close_kills_what_it_built(marker: str) -> None:
    sb = strata.Sandbox("process")
    assert sb.run(["/bin/true"]).ok
    # After the first run of a shape, the default pool builds one sandbox for the next.
    deadline = time.monotonic() + 10
    while not child_processes() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert child_processes(), "nothing was pre-built after the first run"
    out = sb.run(["/bin/sh", "-c", f"echo {marker}; ls /tmp"])
    assert out.ok and out.stdout.strip() == marker, "a warm run starts clean"
    sb.close()
    assert_nothing_left(marker)


def test_warm_pool_runs_the_same(marker: str) -> None:
    sb = strata.Sandbox("process", warm_pool=2)
    caps = strata.Caps(timeout=10)
    outputs = [sb.run(["/bin/echo", str(i)], caps).stdout for i in range(4)]
    assert outputs == ["0\n", "1\n", "2\n", "3\n"]
    sb.close()


def test_container_image_runs_natively_with_cpus() -> None:
    # The repository's test images, built from Debian packages (cached; never pulled).
    repo = Path(__file__).resolve().parents[3]
    subprocess.run([str(repo / "scripts" / "build-test-images.sh")], check=True, capture_output=True)
    image = repo / ".ci" / "cache" / "images" / "python-oci"
    with strata.Sandbox("container") as containers:
        result = containers.run(
            ["python3", "-c", "import os; print(os.path.exists('/usr/bin/python3'))"],
            strata.Caps(image=str(image), runtime="native", cpus=0.5, timeout=30),
        )
    assert result.ok, result.stderr
    assert result.stdout == "True\n"
    receipt = result.receipt
    assert receipt.backend == "container"
    container = receipt.container
    assert container is not None and container == receipt.to_dict()["container"]
    assert container["runtime"] == "native"
    assert container["digest"].startswith("sha256:")
    quota = [e for e in receipt.enforced if e["mechanism"] == "cgroup cpu quota"]
    assert quota and "0.5 core" in quota[0]["detail"], receipt.enforced


def test_agent_runs_under_its_own_host_identity(sb: strata.Sandbox, tmp_path: Path) -> None:
    # As root (CI), each agent gets its own unprivileged host uid; files it creates are its.
    assert os.geteuid() == 0, "run the suite as root (.ci/run does)"
    os.chmod(tmp_path, 0o755)
    caps = strata.Caps(read_write=tmp_path, agent="py-agent")
    assert caps.agent == "py-agent"
    assert caps.to_dict()["agent"] == "py-agent"
    result = sb.run(["/bin/sh", "-c", f"touch {tmp_path}/made"], caps)
    assert result.ok, result.stderr
    identity = result.receipt.identity
    assert identity["agent"] == "py-agent" and identity["source"] == "agent"
    assert identity["host_uid"] != 0
    assert (tmp_path / "made").stat().st_uid == identity["host_uid"]
    again = sb.run(["/bin/true"], strata.Caps(agent="py-agent")).receipt.identity
    assert again["host_uid"] == identity["host_uid"]
    fresh = sb.run(["/bin/true"]).receipt.identity
    assert fresh["source"] == "fresh" and fresh["host_uid"] != identity["host_uid"]
    with pytest.raises(strata.InvalidRequestError, match="agent name"):
        strata.Caps(agent="../evil")
