"""`strata mcp` against the official MCP Python SDK client (PyPI `mcp`): stdio and
streamable HTTP, protocol revisions 2026-07-28 (mode="auto": server/discover) and
2025-11-25 (mode="legacy": the initialize handshake)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from conftest import processes_with  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]

#: mode of mcp.Client -> the revision the server must agree to.
MODES = {"auto": "2026-07-28", "legacy": "2025-11-25"}

TOOLS = {
    "run",
    "session_open",
    "session_run",
    "session_write_file",
    "session_read_file",
    "session_list_files",
    "session_close",
}


def strata_cli() -> str:
    """The `strata` binary: $STRATA_CLI, else the workspace's release build (scripts/test.sh
    builds it, with strata-helper next to it, before the Python suite)."""
    explicit = os.environ.get("STRATA_CLI")
    if explicit:
        return explicit
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    cli = target / "release" / "strata"
    if not os.access(cli, os.X_OK):
        pytest.fail(f"{cli} not found: run `cargo build --release --workspace --bins` or set STRATA_CLI")
    return str(cli)


def write_profile(directory: Path, text: str) -> Path:
    path = directory / "profile.toml"
    path.write_text(text)
    return path


DEFAULT_PROFILE = 'backend = "process"\n[caps]\nlimits = { timeout_ms = 20000 }\n'


@pytest.fixture
def tmpdir_env(tmp_path: Path) -> Dict[str, str]:
    """A private TMPDIR for the server: its sessions' directories are made there."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return {"TMPDIR": str(tmp)}


def session_dirs(env: Dict[str, str]) -> List[str]:
    return sorted(p.name for p in Path(env["TMPDIR"]).glob("strata-session-*"))


def stdio(profile: Path, env: Dict[str, str], *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=strata_cli(), args=["mcp", "--profile", str(profile), *extra], env=env
    )


class HttpServer:
    """`strata mcp --http 127.0.0.1:0` in a child process; its URL is read from stdout."""

    def __init__(self, profile: Path, env: Dict[str, str], *extra: str) -> None:
        self.proc = subprocess.Popen(
            [strata_cli(), "mcp", "--profile", str(profile), "--http", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE,
            env={**os.environ, **env},
            text=True,
        )
        line: List[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(30)
        if not line or not line[0].startswith("http://"):
            self.proc.kill()
            raise AssertionError(f"strata mcp --http printed no URL: {line!r}")
        self.url = line[0].strip()

    def stop(self) -> int:
        """SIGTERM, as a supervisor would: the server closes its sessions and exits 0."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


@pytest.fixture
def http_server(tmp_path: Path, tmpdir_env: Dict[str, str]) -> Iterator[HttpServer]:
    server = HttpServer(write_profile(tmp_path, DEFAULT_PROFILE), tmpdir_env)
    try:
        yield server
    finally:
        # SIGTERM first: the server closes its sessions (a session's tmpfs is unmounted);
        # SIGKILL would leave them for the next server's sweep.
        if server.proc.poll() is None:
            server.proc.terminate()
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()


def structured(result: Any) -> Dict[str, Any]:
    """A result's structured content, which is also its JSON text."""
    assert result.structured_content is not None, result
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def annotations(tools: Any) -> Dict[str, Any]:
    return {t.name: t.annotations for t in tools.tools}


async def exercise_runs(client: Client) -> None:
    ok = await client.call_tool("run", {"argv": ["sh", "-c", "echo hi"]})
    assert not ok.is_error, ok
    out = structured(ok)
    assert out["ok"] is True and out["exit_code"] == 0 and out["stdout"] == "hi\n"
    assert out["status"] == {"kind": "exited", "code": 0}

    code = await client.call_tool("run", {"code": "print(6 * 7)", "language": "python"})
    assert not code.is_error, code
    assert structured(code)["stdout"] == "42\n"

    failed = await client.call_tool("run", {"argv": ["sh", "-c", "echo out; echo err >&2; exit 3"]})
    assert failed.is_error
    out = structured(failed)
    assert (out["ok"], out["exit_code"], out["stdout"], out["stderr"]) == (False, 3, "out\n", "err\n")
    assert out["timed_out"] is False


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", sorted(MODES))
async def test_stdio_serves_both_revisions_with_tools_annotated_from_the_caps(
    tmp_path: Path, tmpdir_env: Dict[str, str], mode: str
) -> None:
    profile = write_profile(tmp_path, DEFAULT_PROFILE)
    async with Client(stdio(profile, tmpdir_env), mode=mode) as client:
        assert client.protocol_version == MODES[mode]
        assert client.server_info is not None and client.server_info.name == "strata"
        tools = await client.list_tools()
        assert {t.name for t in tools.tools} == TOOLS
        hints = annotations(tools)
        # Default caps: no mounts, no network.
        assert hints["run"].read_only_hint is True
        assert hints["run"].destructive_hint is False
        assert hints["run"].open_world_hint is False
        assert hints["session_read_file"].read_only_hint is True
        assert hints["session_write_file"].read_only_hint is False
        assert hints["session_run"].read_only_hint is False
        await exercise_runs(client)


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", sorted(MODES))
async def test_streamable_http_serves_both_revisions(http_server: HttpServer, mode: str) -> None:
    async with Client(http_server.url, mode=mode) as client:
        assert client.protocol_version == MODES[mode]
        tools = await client.list_tools()
        assert {t.name for t in tools.tools} == TOOLS
        await exercise_runs(client)
    assert http_server.stop() == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", sorted(MODES))
async def test_a_session_keeps_files_between_runs_and_close_removes_it(
    http_server: HttpServer, tmpdir_env: Dict[str, str], mode: str
) -> None:
    async with Client(http_server.url, mode=mode) as client:
        opened = await client.call_tool("session_open", {})
        assert not opened.is_error, opened
        session = structured(opened)
        sid = session["session_id"]
        assert sid.startswith("s-") and session["workdir"] == "/workspace"
        assert len(session_dirs(tmpdir_env)) == 1

        wrote = await client.call_tool(
            "session_write_file", {"session_id": sid, "path": "src/a.txt", "content": "hello"}
        )
        assert not wrote.is_error, wrote
        assert structured(wrote)["bytes"] == 5

        ran = await client.call_tool(
            "session_run",
            {"session_id": sid, "argv": ["sh", "-c", "cat src/a.txt > b.txt; printf ' world' >> b.txt; pwd"]},
        )
        assert not ran.is_error, ran
        assert structured(ran)["stdout"] == "/workspace\n"

        read = await client.call_tool("session_read_file", {"session_id": sid, "path": "b.txt"})
        assert structured(read)["content"] == "hello world"
        binary = await client.call_tool(
            "session_read_file", {"session_id": sid, "path": "/workspace/b.txt", "encoding": "base64"}
        )
        assert structured(binary)["content"] == "aGVsbG8gd29ybGQ="

        listed = structured(await client.call_tool("session_list_files", {"session_id": sid}))
        kinds = {e["name"]: e["kind"] for e in listed["entries"]}
        assert kinds == {"src": "dir", "b.txt": "file"}

        escape = await client.call_tool("session_read_file", {"session_id": sid, "path": "../etc/passwd"})
        assert escape.is_error
        assert structured(escape)["error"]["kind"] == "invalid_request"

        closed = await client.call_tool("session_close", {"session_id": sid})
        assert structured(closed) == {"session_id": sid, "closed": True}
        assert session_dirs(tmpdir_env) == []
        after = await client.call_tool("session_run", {"session_id": sid, "argv": ["true"]})
        assert after.is_error
        assert structured(after)["error"]["kind"] == "invalid_request"


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.asyncio
async def test_reading_a_file_over_the_cap_is_refused_before_it_is_read(
    http_server: HttpServer,
) -> None:
    """Round 3: twelve concurrent reads of a 60 MiB file took the server from 17 MB to
    470 MB, because each read the whole file before checking the 16 MiB cap. The size is
    checked first now: every read is refused and the server's peak memory stays small."""
    async with Client(http_server.url) as client:
        sid = structured(await client.call_tool("session_open", {}))["session_id"]
        made = await client.call_tool(
            "session_run", {"session_id": sid, "argv": ["sh", "-c", "head -c 62914560 /dev/zero > big"]}
        )
        assert not made.is_error, made
        import asyncio

        reads = await asyncio.gather(
            *(client.call_tool("session_read_file", {"session_id": sid, "path": "big"}) for _ in range(12))
        )
        for read in reads:
            assert read.is_error
            error = structured(read)["error"]
            assert error["kind"] == "invalid_request" and "too large" in error["message"], error
        peak = peak_rss_kib(http_server.proc.pid)
        assert peak < 200 * 1024, f"the server peaked at {peak} KiB reading refused files"


@pytest.mark.asyncio
async def test_timeout_ms_only_lowers_the_profiles_timeout(tmp_path: Path, tmpdir_env: Dict[str, str]) -> None:
    profile = write_profile(tmp_path, 'backend = "process"\n[caps]\nlimits = { timeout_ms = 1500 }\n')
    async with Client(stdio(profile, tmpdir_env)) as client:
        start = time.monotonic()
        lowered = await client.call_tool("run", {"argv": ["sleep", "10"], "timeout_ms": 300})
        assert lowered.is_error and structured(lowered)["timed_out"] is True
        assert time.monotonic() - start < 1.4

        start = time.monotonic()
        raised = await client.call_tool("run", {"argv": ["sleep", "10"], "timeout_ms": 600_000})
        assert raised.is_error and structured(raised)["timed_out"] is True
        assert time.monotonic() - start < 8, "timeout_ms lifted the profile's timeout"


@pytest.mark.asyncio
async def test_a_model_cannot_widen_the_caps(tmp_path: Path, tmpdir_env: Dict[str, str], marker: str) -> None:
    profile = write_profile(tmp_path, DEFAULT_PROFILE)
    secret = tmp_path / "secret.txt"
    secret.write_text(marker)
    async with Client(stdio(profile, tmpdir_env)) as client:
        for arguments in (
            {"argv": ["true"], "caps": {"net": "host"}},
            {"argv": ["true"], "mounts": [{"host": "/", "guest": "/host"}]},
            {"argv": ["true"], "code": "x", "language": "sh"},
            {"code": "x", "language": "cobol"},
            {},
        ):
            result = await client.call_tool("run", arguments)
            assert result.is_error, arguments
            assert structured(result)["error"]["kind"] == "invalid_request", arguments
        # The host's files stay out of reach: no mount, so the path does not exist inside.
        read = await client.call_tool("run", {"argv": ["cat", str(secret)]})
        assert read.is_error and marker not in structured(read)["stdout"]
        with pytest.raises(MCPError):
            await client.call_tool("no_such_tool", {})


@pytest.mark.asyncio
async def test_annotations_follow_writable_mounts_and_network(tmp_path: Path, tmpdir_env: Dict[str, str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    profile = write_profile(
        tmp_path,
        'backend = "process"\n[caps]\nnet = "host"\n'
        f'mounts = [{{ host = "{data}", guest = "/data", access = "rw" }}]\n',
    )
    async with Client(stdio(profile, tmpdir_env)) as client:
        hints = annotations(await client.list_tools())
        assert hints["run"].read_only_hint is False
        assert hints["run"].destructive_hint is True
        assert hints["run"].open_world_hint is True
        assert hints["session_run"].open_world_hint is True
        assert hints["session_list_files"].read_only_hint is True
        assert hints["session_list_files"].open_world_hint is False


@pytest.mark.asyncio
async def test_sessions_are_capped_and_closed_when_the_server_stops(
    tmp_path: Path, tmpdir_env: Dict[str, str]
) -> None:
    profile = write_profile(tmp_path, DEFAULT_PROFILE)
    server = HttpServer(profile, tmpdir_env, "--max-sessions", "2")
    try:
        async with Client(server.url) as client:
            for _ in range(2):
                assert not (await client.call_tool("session_open", {})).is_error
            third = await client.call_tool("session_open", {})
            assert third.is_error
            assert structured(third)["error"]["kind"] == "invalid_request"
        assert len(session_dirs(tmpdir_env)) == 2
        assert server.stop() == 0
        assert session_dirs(tmpdir_env) == []
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


@pytest.mark.asyncio
async def test_stdio_server_closes_its_sessions_when_the_client_goes(
    tmp_path: Path, tmpdir_env: Dict[str, str]
) -> None:
    profile = write_profile(tmp_path, DEFAULT_PROFILE)
    async with Client(stdio(profile, tmpdir_env)) as client:
        sid = structured(await client.call_tool("session_open", {}))["session_id"]
        assert sid
    # The client closed stdin: the server closed its sessions and exited.
    deadline = time.monotonic() + 10
    while session_dirs(tmpdir_env) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session_dirs(tmpdir_env) == []


def test_a_bad_profile_is_refused_before_serving(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "[caps]\nnet = \"everywhere\"\n")
    done = subprocess.run(
        [strata_cli(), "mcp", "--profile", str(profile)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done
    assert "caps" in done.stderr and done.stdout == ""


def test_http_refuses_a_public_address_without_allow_host(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, DEFAULT_PROFILE)
    done = subprocess.run(
        [strata_cli(), "mcp", "--profile", str(profile), "--http", "0.0.0.0:0"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done
    assert "--allow-host" in done.stderr



@pytest.mark.asyncio
async def test_stopping_the_server_kills_the_runs_in_flight(
    tmp_path: Path, tmpdir_env: Dict[str, str], marker: str
) -> None:
    import anyio

    server = HttpServer(write_profile(tmp_path, DEFAULT_PROFILE), tmpdir_env)
    try:

        async def long_run() -> None:
            try:
                async with Client(server.url) as client:
                    await client.call_tool("run", {"argv": ["sh", "-c", f"sleep 1000; echo {marker}"]})
            except Exception:  # the server went away mid-call
                pass

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(long_run)
            deadline = time.monotonic() + 20
            while not processes_with(marker) and time.monotonic() < deadline:
                await anyio.sleep(0.05)
            assert processes_with(marker), "the run did not start"
            assert server.stop() == 0
            tasks.cancel_scope.cancel()
        assert processes_with(marker) == []
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
