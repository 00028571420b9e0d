"""OpenAI Agents SDK function tools that run model-written code or commands in a Strata
sandbox.

Requires ``openai-agents`` (``pip install strata-sandbox[openai-agents]``)::

    from agents import Agent
    from strata.openai_agents import code_tool
    agent = Agent(name="analyst", tools=[code_tool(caps=strata.Caps(read_only=["/data"]))])

The caps are fixed when the tool is built: the developer decides what the model's code may
touch, the model only supplies code. Runs use ``Sandbox.arun`` (the event loop is never
blocked; cancelling the agent run kills the sandbox). The model sees the status line,
stdout and stderr. When the sandbox refuses a run, the default ``failure_error_function``
(:func:`report_failure`) tells the model why if the request itself was at fault (an
``InvalidRequestError`` or ``DeniedError``: a program that does not exist, an empty argv),
and only the error code otherwise, so host details stay out of the conversation. Extra
keyword arguments go to ``agents.function_tool`` (``needs_approval``, ``timeout``,
``failure_error_function``, ...).

:class:`StrataSandboxClient` is a sandbox client of the SDK (``agents.sandbox``): a
``SandboxAgent`` run with ``RunConfig(sandbox=SandboxRunConfig(client=StrataSandboxClient()))``
gets a workspace that is a Strata session (``Manifest.root``, default ``/workspace``, is
the session's workdir), and its shell, file and patch tools run in Strata sandboxes::

    from agents import Runner, RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from strata.openai_agents import StrataSandboxClient

    client = StrataSandboxClient(strata.Sandbox(), strata.Caps(timeout=60))
    agent = SandboxAgent(name="coder", instructions="...")
    result = await Runner.run(agent, "...", run_config=RunConfig(
        sandbox=SandboxRunConfig(client=client)))
"""

from __future__ import annotations

import asyncio
import io
import shutil
import tempfile
import threading
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Dict, List, Literal, Optional, Tuple, Union, final

from agents import FunctionTool, RunContextWrapper, function_tool
from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.runtime_helpers import RuntimeHelperScript
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.workspace_payloads import coerce_write_payload
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User

import strata
from strata._agent import as_caps, describe_caps, format_result, tool_for
from strata._openai_common import StrataSessionBase, check_manifest
from strata._openai_live import StrataLiveSandboxSession

__all__ = [
    "StrataLiveSandboxSession",
    "StrataSandboxClient",
    "StrataSandboxClientOptions",
    "StrataSandboxSession",
    "StrataSandboxSessionState",
    "code_tool",
    "command_tool",
    "report_failure",
]


def report_failure(ctx: RunContextWrapper[Any], error: Exception) -> str:
    """The message the model sees when a run fails to happen (the default
    ``failure_error_function`` of these tools)."""
    if isinstance(error, (strata.InvalidRequestError, strata.DeniedError)):
        return f"The sandbox refused the run ({error.code}): {error}"
    if isinstance(error, strata.SandboxError):
        return f"The sandbox could not run the tool ({error.code})."
    return "An error occurred while running the tool. Please try again."


def _with_defaults(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    return {"failure_error_function": report_failure, **kwargs}


def code_tool(
    sandbox: Optional[strata.Sandbox] = None,
    caps: Union[strata.Caps, Dict[str, Any], None] = None,
    *,
    language: str = "python",
    name: str = "run_code",
    description: Optional[str] = None,
    max_output_chars: Optional[int] = 20_000,
    **function_tool_kwargs: Any,
) -> FunctionTool:
    """A function tool ``name(code: str)`` running ``code`` in ``language`` (``"python"``
    by default, ``"javascript"`` or ``"sh"``) in ``sandbox`` (default ``strata.Sandbox()``)
    with ``caps`` (default ``Caps()``)."""
    sb = sandbox if sandbox is not None else strata.Sandbox()
    fixed_caps = as_caps(caps)
    tool_for(language, "")  # validates the language now

    async def run_code(code: str) -> str:
        """Runs a program in an isolated sandbox and returns its status, stdout and stderr.

        Args:
            code: The complete program to run; print what you need to see.
        """
        result = await sb.arun(tool_for(language, code), fixed_caps)
        return format_result(result, max_output_chars)

    return function_tool(
        run_code,
        name_override=name,
        description_override=description
        or (
            f"Runs a {language} program in an isolated sandbox and returns its exit status, "
            f"stdout and stderr. {describe_caps(fixed_caps)}"
        ),
        **_with_defaults(function_tool_kwargs),
    )


def command_tool(
    sandbox: Optional[strata.Sandbox] = None,
    caps: Union[strata.Caps, Dict[str, Any], None] = None,
    *,
    name: str = "run_command",
    description: Optional[str] = None,
    max_output_chars: Optional[int] = 20_000,
    **function_tool_kwargs: Any,
) -> FunctionTool:
    """A function tool ``name(argv: list[str])`` running a program (never a shell string)
    in ``sandbox`` (default ``strata.Sandbox()``) with ``caps`` (default ``Caps()``)."""
    sb = sandbox if sandbox is not None else strata.Sandbox()
    fixed_caps = as_caps(caps)

    async def run_command(argv: List[str]) -> str:
        """Runs a program with arguments in an isolated sandbox (no shell).

        Args:
            argv: The program and its arguments, e.g. ["ls", "-l", "/data"].
        """
        result = await sb.arun(strata.Tool.command(argv), fixed_caps)
        return format_result(result, max_output_chars)

    return function_tool(
        run_command,
        name_override=name,
        description_override=description
        or (
            "Runs a program with arguments (no shell) in an isolated sandbox and returns its "
            f"exit status, stdout and stderr. {describe_caps(fixed_caps)}"
        ),
        **_with_defaults(function_tool_kwargs),
    )


# ---------------------------------------------------------------------------------------
# Sandbox client (agents.sandbox): SDK sessions on Strata sessions
# ---------------------------------------------------------------------------------------


@final
class StrataSandboxClientOptions(BaseSandboxClientOptions):
    """Options of :class:`StrataSandboxClient` (``SandboxRunConfig.options``): what a
    session may touch is fixed by the client's caps, not by run-time options.
    ``exposed_ports``: TCP ports inside a live session (the client's ``live=True``)
    published on host loopback, for ``resolve_exposed_port``."""

    type: Literal["strata"] = "strata"
    exposed_ports: Tuple[int, ...] = ()

    def __init__(
        self, exposed_ports: Tuple[int, ...] = (), *, type: Literal["strata"] = "strata"
    ) -> None:
        super().__init__(type=type, exposed_ports=tuple(exposed_ports))


class StrataSandboxSessionState(SandboxSessionState):
    """Serializable state of a :class:`StrataSandboxSession`: the SDK's (manifest,
    snapshot, ...) plus the id of the Strata session, which a client of the same process
    reattaches to on ``resume``. The caps are never part of it: they stay with the client."""

    type: Literal["strata"] = "strata"
    strata_session_id: Optional[str] = None
    #: The session is one live sandbox (the client's ``live=True``), not a Strata session.
    live: bool = False


def _guest_str(path: Union[Path, PurePosixPath, str]) -> str:
    return PurePosixPath(str(path)).as_posix()


class StrataSandboxSession(StrataSessionBase):
    """An SDK sandbox session whose workspace is a Strata session.

    Every ``exec`` is one sandbox run of the Strata session (``shell=True`` runs
    ``sh -c``; the working directory is ``Manifest.root``); the manifest's environment is
    set with ``env NAME=VALUE ...``. ``read`` and ``write`` copy bytes on the host side
    (no run); paths outside the workspace are read with ``cat`` in a run and cannot be
    written. ``ls``, ``mkdir``, ``rm``, ``mv`` and ``apply_patch`` run their commands in
    the session. Snapshots (``persist_workspace``/``hydrate_workspace``) are tar streams of
    the workspace's regular files and directories: Strata never copies a symlink, device
    or hard-linked file out or in, so a workspace holding one cannot be persisted.

    Not supported: manifest users and groups (``run_as``), extra path grants with a
    ``host_path`` (give the session's caps the mount instead), PTYs and exposed ports.
    Processes a call starts end with the call.
    """

    state: StrataSandboxSessionState

    def __init__(self, *, state: StrataSandboxSessionState, client: "StrataSandboxClient") -> None:
        self.state = state
        self._client = client
        self._strata: Optional[strata.AsyncSession] = None
        self._helpers: Dict[str, RuntimeHelperScript] = {}

    @property
    def strata_session(self) -> Optional["strata.AsyncSession"]:
        """The Strata session, once the SDK session has started (or been reattached)."""
        return self._strata

    def _live(self) -> "strata.AsyncSession":
        session = self._strata
        if session is None or session.closed:
            raise ExecTransportError(
                command=("strata",),
                message="the Strata session is not open (start the sandbox session first)",
            )
        return session

    # -- lifecycle --------------------------------------------------------------------

    async def _ensure_backend_started(self) -> None:
        if self._strata is not None and not self._strata.closed:
            return
        found = self._client._find(self.state.strata_session_id)
        if found is not None:
            self._strata = found
            self._set_start_state_preserved(True)
            return
        opened = self._client._open(self.state.manifest.root)
        self._strata = opened
        self.state.strata_session_id = str(opened.id)
        self.state.workspace_root_ready = False
        self._set_start_state_preserved(False)

    async def running(self) -> bool:
        return self._strata is not None and not self._strata.closed

    async def _download_workspace(self, host_dir: str) -> None:
        await self._live().download(".", host_dir)

    async def _upload_workspace(self, host_dir: str) -> None:
        await self._live().upload(host_dir, ".")

    # -- exec -------------------------------------------------------------------------

    def _prepare_exec_command(
        self,
        *command: Union[str, Path],
        shell: Union[bool, List[str]],
        user: Union[str, User, None],
    ) -> List[str]:
        if user is not None:
            raise ValueError(
                "StrataSandboxSession runs commands as the sandbox's user only (no run_as)"
            )
        if shell is True:
            shell = ["sh", "-c"]
        return super()._prepare_exec_command(*command, shell=shell, user=None)

    async def _ensure_runtime_helper_installed(self, helper: RuntimeHelperScript) -> PurePosixPath:
        # Each call is a fresh sandbox whose /tmp is private: a helper installed there by
        # one call is gone in the next. Remember it and run its script inline instead.
        path = PurePosixPath(str(helper.install_path))
        self._helpers[path.as_posix()] = helper
        return path

    async def _exec_internal(
        self,
        *command: Union[str, Path],
        timeout: Optional[float] = None,
    ) -> ExecResult:
        session = self._live()
        argv = [str(part) for part in command]
        helper = self._helpers.get(argv[0]) if argv else None
        if helper is not None:
            argv = ["sh", "-c", helper.content, argv[0], *argv[1:]]
        environment = await self.state.manifest.environment.resolve()
        if environment:
            argv = ["env", *(f"{name}={value}" for name, value in environment.items()), *argv]
        try:
            result = await session.run(argv, timeout=timeout)
        except strata.SandboxError as e:
            raise ExecTransportError(command=tuple(command), cause=e) from e
        if result.timed_out:
            raise ExecTimeoutError(command=tuple(command), timeout_s=timeout)
        exit_code = result.exit_code
        if exit_code is None:
            exit_code = 128 + int(result.signal) if result.signal is not None else 1
        return ExecResult(
            stdout=bytes(result.stdout_bytes),
            stderr=bytes(result.stderr_bytes),
            exit_code=exit_code,
        )

    # -- files ------------------------------------------------------------------------

    def _in_workspace(self, path: Path) -> bool:
        root = self.state.manifest.root.rstrip("/") or "/"
        text = _guest_str(path)
        return text == root or text.startswith(root + "/")

    async def read(self, path: Path, *, user: Union[str, User, None] = None) -> io.IOBase:
        if user is not None:
            raise ValueError("StrataSandboxSession reads as the sandbox's user only (no run_as)")
        target = self.normalize_path(path)
        if not self._in_workspace(target):
            return await self._read_with_cat(path, target)
        try:
            data = await self._live().read_file(_guest_str(target))
        except strata.SandboxError as e:
            if "not found: " in str(e) or "not a directory on the way" in str(e):
                raise WorkspaceReadNotFoundError(path=path, cause=e) from e
            raise WorkspaceArchiveReadError(path=path, context={"reason": str(e)}, cause=e) from e
        return io.BytesIO(bytes(data))

    async def _read_with_cat(self, path: Path, target: Path) -> io.IOBase:
        result = await self.exec("cat", "--", _guest_str(target), shell=False)
        if result.ok():
            return io.BytesIO(result.stdout)
        if b"No such file" in result.stderr:
            raise WorkspaceReadNotFoundError(path=path)
        raise WorkspaceArchiveReadError(
            path=path, context={"stderr": result.stderr.decode("utf-8", errors="replace")[:4096]}
        )

    async def write(
        self,
        path: Path,
        data: io.IOBase,
        *,
        user: Union[str, User, None] = None,
    ) -> None:
        if user is not None:
            raise ValueError("StrataSandboxSession writes as the sandbox's user only (no run_as)")
        payload = coerce_write_payload(path=path, data=data)
        target = self.normalize_path(path, for_write=True)
        if not self._in_workspace(target):
            raise WorkspaceArchiveWriteError(
                path=target, context={"reason": "outside the Strata session's workspace"}
            )
        content = payload.stream.read()
        try:
            await self._live().write_file(_guest_str(target), bytes(content))
        except strata.SandboxError as e:
            raise WorkspaceArchiveWriteError(
                path=target, context={"reason": str(e)}, cause=e
            ) from e

class StrataSandboxClient(BaseSandboxClient[Optional[StrataSandboxClientOptions]]):
    """Creates SDK sandbox sessions that are Strata sessions.

    ``sandbox`` is the :class:`strata.Sandbox` to open sessions on (default
    ``strata.Sandbox()``, backend ``"auto"``; the SDK's tools need a shell, so a backend
    with one: ``process``, ``container`` or ``microvm``). ``caps`` (default ``Caps()``)
    bound every call of every session: they are fixed here, never taken from session state
    or run options. ``max_transfer`` bounds each copy in or out (default 256 MiB).

    ``create`` opens a Strata session whose workdir is ``Manifest.root`` (default
    ``/workspace``) and materializes the manifest; ``delete`` closes it (its files are
    removed); ``resume`` reattaches to the Strata session named in the state while this
    client has it open, and otherwise opens a new one and restores the state's snapshot.
    :meth:`close` closes every session the client still has open.

    ``live=True``: every SDK session is one Strata live sandbox
    (:class:`StrataLiveSandboxSession`) started on ``sandbox`` with the caps and a private
    host directory (0700) mounted read-write at ``Manifest.root``: processes outlive a
    command, PTY sessions work, and the options' ``exposed_ports`` are published on host
    loopback. ``delete`` stops it (every process in it ends) and removes the directory.
    """

    backend_id = "strata"
    supports_default_options = True

    def __init__(
        self,
        sandbox: Optional[strata.Sandbox] = None,
        caps: Union[strata.Caps, Dict[str, Any], None] = None,
        *,
        max_transfer: Union[int, str, None] = None,
        live: bool = False,
        instrumentation: Optional[Instrumentation] = None,
        dependencies: Optional[Dependencies] = None,
    ) -> None:
        if not isinstance(live, bool):
            raise TypeError("live must be True or False")
        if live and max_transfer is not None:
            raise ValueError("max_transfer bounds a session's copies; a live client has none")
        self._live = live
        self._lives: Dict[str, "tuple[strata.LiveSandbox, str]"] = {}
        self._sandbox = sandbox if sandbox is not None else strata.Sandbox()
        self._caps = as_caps(caps)
        self._max_transfer = max_transfer
        self._instrumentation = (
            instrumentation if instrumentation is not None else Instrumentation()
        )
        self._dependencies = dependencies
        self._sessions: Dict[str, strata.AsyncSession] = {}
        self._lock = threading.Lock()

    def _open(self, workdir: str) -> "strata.AsyncSession":
        session = self._sandbox.asession(
            self._caps, workdir=workdir, max_transfer=self._max_transfer
        )
        with self._lock:
            self._sessions[str(session.id)] = session
        return session

    def _start_live(self, root: str, ports: Tuple[int, ...]) -> "strata.LiveSandbox":
        """A live sandbox with the client's caps and a private directory at ``root``."""
        workdir = tempfile.mkdtemp(prefix="strata-agents-")
        try:
            caps = self._caps.to_dict()
            caps["mounts"] = [
                *(caps.get("mounts") or []),
                {"host": str(Path(workdir).resolve()), "guest": root, "access": "rw"},
            ]
            caps["workdir"] = root
            live = self._sandbox.start(strata.Caps(caps), publish=list(ports))
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        with self._lock:
            self._lives[live.id] = (live, workdir)
        return live

    def _find_live(self, sandbox_id: Optional[str]) -> Optional["strata.LiveSandbox"]:
        if sandbox_id is None:
            return None
        with self._lock:
            found = self._lives.get(sandbox_id)
        if found is None or found[0].stopped:
            return None
        return found[0]

    def _stop_live(self, sandbox_id: Optional[str]) -> None:
        with self._lock:
            found = self._lives.pop(sandbox_id, None) if sandbox_id is not None else None
        if found is None:
            return
        live, workdir = found
        try:
            live.stop()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _find(self, session_id: Optional[str]) -> Optional["strata.AsyncSession"]:
        if session_id is None:
            return None
        with self._lock:
            found = self._sessions.get(session_id)
        if found is None or found.closed:
            return None
        return found

    async def create(
        self,
        *,
        snapshot: Union[SnapshotSpec, SnapshotBase, None] = None,
        manifest: Optional[Manifest] = None,
        options: Optional[StrataSandboxClientOptions] = None,
    ) -> SandboxSession:
        manifest = manifest if manifest is not None else Manifest()
        check_manifest(manifest)
        self._validate_manifest_for_create(manifest)
        ports = tuple(options.exposed_ports) if options is not None else ()
        if ports and not self._live:
            raise ValueError(
                "exposed_ports need a live client (StrataSandboxClient(..., live=True)): a "
                "Strata session runs each command in a sandbox of its own"
            )
        session_id = uuid.uuid4()
        state = StrataSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            exposed_ports=ports,
            live=self._live,
        )
        return self._wrap_session(self._inner(state), instrumentation=self._instrumentation)

    def _inner(self, state: StrataSandboxSessionState) -> BaseSandboxSession:
        if state.live:
            return StrataLiveSandboxSession(state=state, client=self)
        return StrataSandboxSession(state=state, client=self)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if isinstance(inner, StrataLiveSandboxSession):
            await inner.pty_terminate_all()
            await asyncio.to_thread(self._stop_live, inner.state.strata_session_id)
            return session
        if not isinstance(inner, StrataSandboxSession):
            raise TypeError("StrataSandboxClient.delete expects a StrataSandboxSession")
        live = inner.strata_session
        session_id = inner.state.strata_session_id
        if session_id is not None:
            with self._lock:
                self._sessions.pop(session_id, None)
        if live is not None:
            await live.close()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, StrataSandboxSessionState):
            raise TypeError("StrataSandboxClient.resume expects a StrataSandboxSessionState")
        state.assert_path_grants_rebound()
        check_manifest(state.manifest)
        if state.live != self._live:
            raise ValueError(
                "this session state is of a "
                + ("live" if state.live else "session-backed")
                + " client: resume it with StrataSandboxClient(..., live="
                + str(state.live)
                + ")"
            )
        return self._wrap_session(self._inner(state), instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: Dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, StrataSandboxSessionState)

    async def close(self) -> None:
        """Closes every Strata session this client still has open (their files are
        removed) and stops its live sandboxes."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
            lives = list(self._lives)
        for session in sessions:
            await session.close()
        for sandbox_id in lives:
            await asyncio.to_thread(self._stop_live, sandbox_id)
