"""strata.openai_agents.StrataSandboxClient(live=True) with the real Agents SDK: each SDK
session is one Strata live sandbox, so processes outlive a command, PTY sessions work and
exposed ports are published on host loopback. Model turns come from the SDK's ScriptedModel
(no model calls); everything else runs for real."""

from __future__ import annotations

import asyncio
import glob
import io
import os
import tempfile
import urllib.request
from pathlib import Path
from typing import AsyncIterator

import pytest
import pytest_asyncio

import strata

from conftest import processes_with

agents = pytest.importorskip("agents", reason="openai-agents is a test dependency")

from agents import RunConfig, Runner  # noqa: E402
from agents.sandbox import (  # noqa: E402
    ExecTimeoutError,
    Manifest,
    SandboxAgent,
    SandboxRunConfig,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.entries import File  # noqa: E402
from agents.sandbox.errors import ExposedPortUnavailableError  # noqa: E402
from agents.sandbox.session import SandboxSession  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from strata.openai_agents import (  # noqa: E402
    StrataLiveSandboxSession,
    StrataSandboxClient,
    StrataSandboxClientOptions,
)


@pytest_asyncio.fixture
async def client(sb: strata.Sandbox) -> AsyncIterator[StrataSandboxClient]:
    made = StrataSandboxClient(sb, {"timeout": 60}, live=True)
    yield made
    await made.close()


def _live_of(session: SandboxSession) -> strata.LiveSandbox:
    inner = session._inner
    assert isinstance(inner, StrataLiveSandboxSession)
    live = inner.live_sandbox
    assert live is not None
    return live


def _workdirs() -> set:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "strata-agents-*")))


@pytest.mark.asyncio
async def test_a_background_process_outlives_its_command_and_delete_ends_it(
    client: StrataSandboxClient, marker: str
) -> None:
    before = _workdirs()
    manifest = Manifest(entries={"data/in.txt": File(content=b"1 2 3\n")})
    session = await client.create(manifest=manifest)
    async with session:
        live = _live_of(session)
        assert session.state.live and session.state.strata_session_id == live.id
        assert len(_workdirs() - before) == 1
        r = await session.exec("pwd; cat data/in.txt; echo err >&2; exit 4")
        assert (r.exit_code, r.stdout, r.stderr) == (4, b"/workspace\n1 2 3\n", b"err\n")
        # Started by one command, still running for the next (and not in a session run).
        await session.exec(f"setsid sleep 1000 {marker} > /dev/null 2>&1 &")
        assert (await session.exec(f"pgrep -f {marker} > /dev/null && echo alive")).stdout == (
            b"alive\n"
        )
        assert processes_with(marker) != []
        await session.write(Path("out/x.bin"), io.BytesIO(bytes(range(256))))
        assert (await session.exec("wc -c < out/x.bin")).stdout.strip() == b"256"
        assert (await session.read(Path("out/x.bin"))).read() == bytes(range(256))
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("missing.txt"))
    await client.delete(session)
    assert live.stopped
    assert processes_with(marker) == [], "delete ends every process, also one that left with setsid"
    assert _workdirs() == before, "delete removes the session's private directory"


@pytest.mark.asyncio
async def test_pty_sessions_take_input_and_report_the_exit(client: StrataSandboxClient) -> None:
    session = await client.create()
    async with session:
        assert session._inner.supports_pty()
        started = await session._inner.pty_exec_start(
            "sh", "-c", "read line; echo got:$line; exit 3", shell=False, yield_time_s=0.3
        )
        assert started.process_id is not None and started.exit_code is None
        update = await session._inner.pty_write_stdin(
            session_id=started.process_id, chars="hello\n", yield_time_s=2
        )
        assert b"got:hello" in update.output
        assert (update.process_id, update.exit_code) == (None, 3)

        terminal = await session._inner.pty_exec_start(
            "test -t 0 && echo on a terminal; stty size", tty=True, yield_time_s=2
        )
        assert terminal.exit_code == 0
        assert b"on a terminal" in terminal.output and b"24 80" in terminal.output
    await client.delete(session)


@pytest.mark.asyncio
async def test_an_exposed_port_reaches_the_server_inside_and_nothing_else(
    client: StrataSandboxClient,
) -> None:
    session = await client.create(options=StrataSandboxClientOptions(exposed_ports=(8000,)))
    async with session:
        await session.write(Path("index.html"), io.BytesIO(b"from the sandbox\n"))
        started = await session._inner.pty_exec_start(
            "python3 -u -m http.server 8000 --bind 127.0.0.1", yield_time_s=0.5
        )
        assert started.process_id is not None
        endpoint = await session.resolve_exposed_port(8000)
        assert endpoint.host == "127.0.0.1" and endpoint.port != 8000
        body = b""
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://{endpoint.host}:{endpoint.port}/index.html", timeout=5) as r:
                    body = r.read()
                break
            except OSError:
                await asyncio.sleep(0.1)
        assert body == b"from the sandbox\n"
        with pytest.raises(ExposedPortUnavailableError):
            await session.resolve_exposed_port(9000)
    await client.delete(session)


@pytest.mark.asyncio
async def test_timeouts_and_cancellation_kill_the_command_not_the_sandbox(
    client: StrataSandboxClient, marker: str
) -> None:
    session = await client.create()
    async with session:
        with pytest.raises(ExecTimeoutError):
            await session.exec(f"sleep 30 # {marker}", timeout=0.5)
        task = asyncio.ensure_future(session.exec(f"sleep 31 # {marker}"))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if not processes_with(marker):
                break
            await asyncio.sleep(0.05)
        assert processes_with(marker) == []
        assert (await session.exec("echo still here")).stdout == b"still here\n"
    await client.delete(session)


@pytest.mark.asyncio
async def test_runner_drives_the_shell_tool_in_the_live_sandbox(client: StrataSandboxClient) -> None:
    model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "sleep 1000 & echo $! > bg.pid"}, call_id="c1")],
            [function_call("exec_command", {"cmd": "kill -0 $(cat bg.pid) && echo alive"}, call_id="c2")],
            [assistant_message("done")],
        ]
    )
    agent = SandboxAgent(name="coder", instructions="x", model=model)
    session = await client.create()
    async with session:
        result = await Runner.run(
            agent, "go", run_config=RunConfig(sandbox=SandboxRunConfig(session=session))
        )
        assert result.final_output == "done"
        outputs = [str(getattr(i, "output", "")) for i in result.new_items]
        assert any("alive" in o for o in outputs), outputs
    await client.delete(session)
    model.assert_complete()


@pytest.mark.asyncio
async def test_bad_live_options_are_refused(sb: strata.Sandbox) -> None:
    session_client = StrataSandboxClient(sb)
    with pytest.raises(ValueError, match="live client"):
        await session_client.create(options=StrataSandboxClientOptions(exposed_ports=(8000,)))
    with pytest.raises(TypeError):
        StrataSandboxClient(sb, live="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_transfer"):
        StrataSandboxClient(sb, live=True, max_transfer=1)
    live_client = StrataSandboxClient(sb, live=True)
    session = await session_client.create()
    with pytest.raises(ValueError, match="live=False"):
        await live_client.resume(session.state)
    await session_client.close()
    await live_client.close()
