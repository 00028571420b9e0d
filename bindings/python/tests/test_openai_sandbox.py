"""strata.openai_agents.StrataSandboxClient with the real Agents SDK (``agents.sandbox``) on
real Strata sessions (process backend: the SDK's shell, file and patch tools need a shell,
which the wasm backend does not have). Model turns come from the SDK's ScriptedModel (no
model calls); everything else runs for real."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
import pytest_asyncio

import strata

from conftest import assert_nothing_left

agents = pytest.importorskip("agents", reason="openai-agents is a test dependency")

from agents import RunConfig, Runner  # noqa: E402
from agents.sandbox import (  # noqa: E402
    ExecTimeoutError,
    LocalSnapshotSpec,
    Manifest,
    SandboxAgent,
    SandboxRunConfig,
    User,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.entries import File  # noqa: E402
from agents.sandbox.errors import InvalidManifestPathError  # noqa: E402
from agents.sandbox.manifest import Environment  # noqa: E402
from agents.sandbox.session import SandboxSession  # noqa: E402
from agents.sandbox.workspace_paths import SandboxPathGrant  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from strata.openai_agents import (  # noqa: E402
    StrataSandboxClient,
    StrataSandboxClientOptions,
    StrataSandboxSession,
    StrataSandboxSessionState,
)


@pytest_asyncio.fixture
async def client(sb: strata.Sandbox) -> AsyncIterator[StrataSandboxClient]:
    made = StrataSandboxClient(sb, {"timeout": 30})
    yield made
    await made.close()


def _strata_of(session: SandboxSession) -> Any:
    inner = session._inner
    assert isinstance(inner, StrataSandboxSession)
    return inner.strata_session


@pytest.mark.asyncio
async def test_exec_files_and_patch_in_a_strata_session(client: StrataSandboxClient) -> None:
    manifest = Manifest(
        entries={"data/in.txt": File(content=b"1 2 3\n")},
        environment=Environment(value={"GREETING": "hello from the manifest"}),
    )
    session = await client.create(manifest=manifest, options=StrataSandboxClientOptions())
    async with session:
        live = _strata_of(session)
        assert live is not None and not live.closed
        assert session.state.type == "strata"
        assert session.state.strata_session_id == live.id

        r = await session.exec("pwd; cat data/in.txt; echo $GREETING; echo err >&2; exit 4")
        assert (r.exit_code, r.stdout, r.stderr) == (
            4,
            b"/workspace\n1 2 3\nhello from the manifest\n",
            b"err\n",
        )
        assert (await session.exec("echo", "a b", shell=False)).stdout == b"a b\n"

        await session.write(Path("out/x.bin"), io.BytesIO(bytes(range(256))))
        assert (await session.read(Path("/workspace/out/x.bin"))).read() == bytes(range(256))
        # Host-side copies and the sandbox see the same files.
        assert await live.read_file("out/x.bin") == bytes(range(256))
        assert (await session.exec("wc -c < out/x.bin")).stdout.strip() == b"256"
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("missing.txt"))
        with pytest.raises(InvalidManifestPathError):
            await session.read(Path("/etc/passwd"))
        with pytest.raises(InvalidManifestPathError):
            await session.write(Path("../escape.txt"), io.BytesIO(b"x"))

        names = sorted(Path(e.path).name for e in await session.ls("."))
        assert names == ["data", "out"]
        await session.mkdir("made/deep", parents=True)
        assert [e.is_dir() for e in await session.ls("made")] == [True]
        await session.apply_patch({"type": "create_file", "path": "notes.md", "diff": "+one\n"})
        await session.apply_patch(
            {"type": "update_file", "path": "notes.md", "diff": "@@\n-one\n+two\n"}
        )
        assert (await session.read(Path("notes.md"))).read() == b"two"
        await session.rm("out", recursive=True)
        assert (await session.exec("test -e out")).exit_code == 1
    await client.delete(session)
    assert live.closed


@pytest.mark.asyncio
async def test_timeouts_and_cancellation_kill_the_run(
    client: StrataSandboxClient, marker: str
) -> None:
    session = await client.create()
    async with session:
        with pytest.raises(ExecTimeoutError):
            await session.exec(f"sleep 30 # {marker}", timeout=0.5)
        assert_nothing_left(marker)
        task = asyncio.ensure_future(session.exec(f"sleep 30 # {marker}"))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert_nothing_left(marker)
        assert (await session.exec("echo still here")).stdout == b"still here\n"
    await client.delete(session)


@pytest.mark.asyncio
async def test_runner_drives_the_shell_tool(client: StrataSandboxClient) -> None:
    model = ScriptedModel(
        [
            [
                function_call(
                    "exec_command",
                    {"cmd": "python3 -c 'print(6 * 7)' | tee answer.txt"},
                    call_id="call-1",
                )
            ],
            [assistant_message("The answer is 42.")],
        ]
    )
    agent = SandboxAgent(name="coder", instructions="Compute.", model=model)
    session = await client.create()
    async with session:
        result = await Runner.run(
            agent, "compute 6*7", run_config=RunConfig(sandbox=SandboxRunConfig(session=session))
        )
        assert result.final_output == "The answer is 42."
        outputs = [str(getattr(i, "output", "")) for i in result.new_items]
        assert any("Process exited with code 0" in o and "42" in o for o in outputs)
        assert (await session.read(Path("answer.txt"))).read() == b"42\n"
    await client.delete(session)
    model.assert_complete()


@pytest.mark.asyncio
async def test_runner_owned_session_is_closed_after_the_run(client: StrataSandboxClient) -> None:
    model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "echo hi > f.txt"}, call_id="c")],
            [assistant_message("done")],
        ]
    )
    agent = SandboxAgent(name="coder", instructions="x", model=model)
    result = await Runner.run(
        agent, "go", run_config=RunConfig(sandbox=SandboxRunConfig(client=client))
    )
    assert result.final_output == "done"
    assert client._sessions == {}


@pytest.mark.asyncio
async def test_snapshot_resume_reattaches_then_restores(
    client: StrataSandboxClient, tmp_path: Path
) -> None:
    session = await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path))
    await session.start()
    await session.exec("mkdir -p src && echo kept > src/a.txt")
    first = _strata_of(session)
    payload = client.serialize_session_state(session.state)
    assert payload["type"] == "strata" and payload["strata_session_id"] == first.id
    await session.aclose()  # persists the snapshot; the Strata session stays open

    state = client.deserialize_session_state(payload)
    assert isinstance(state, StrataSandboxSessionState)
    again = await client.resume(state)
    await again.start()
    assert _strata_of(again) is first
    assert (await again.exec("cat src/a.txt")).stdout == b"kept\n"
    await client.delete(again)
    assert first.closed

    # The Strata session is gone: resume opens a new one and restores the snapshot.
    state = client.deserialize_session_state(client.serialize_session_state(again.state))
    restored = await client.resume(state)
    async with restored:
        assert _strata_of(restored) is not first
        assert (await restored.exec("cat src/a.txt")).stdout == b"kept\n"
    await client.delete(restored)


@pytest.mark.asyncio
async def test_what_strata_will_not_copy_or_run(client: StrataSandboxClient) -> None:
    with pytest.raises(ValueError, match="users or groups"):
        await client.create(manifest=Manifest(users=[User(name="alice")]))
    grant = SandboxPathGrant(path="/data", host_path="/tmp", read_only=True)
    with pytest.raises(ValueError, match="host_path"):
        await client.create(manifest=Manifest(extra_path_grants=(grant,)))
    session = await client.create()
    async with session:
        with pytest.raises(ValueError, match="run_as"):
            await session.exec("true", user="root")
        # A symlink in the workspace: Strata never copies one out, so no snapshot.
        await session.exec("echo x > t.txt && ln -s t.txt link")
        with pytest.raises(WorkspaceArchiveReadError):
            await session.persist_workspace()
        with pytest.raises(WorkspaceArchiveWriteError):
            await session.hydrate_workspace(io.BytesIO(b"not a tar"))
    await client.delete(session)


@pytest.mark.asyncio
async def test_client_close_closes_every_session(sb: strata.Sandbox) -> None:
    client = StrataSandboxClient(sb)
    sessions = [await client.create() for _ in range(2)]
    for s in sessions:
        await s.start()
    lives = [_strata_of(s) for s in sessions]
    assert all(not live.closed for live in lives)
    await client.close()
    assert all(live.closed for live in lives)
