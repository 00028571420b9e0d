"""The OpenAI Agents SDK's sandbox session on one Strata live sandbox (see
:class:`strata.openai_agents.StrataSandboxClient` with ``live=True``): processes that outlive
a command, PTY sessions (``pty_exec_start``/``pty_write_stdin``) and exposed ports."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Set, Tuple, Union

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.runtime_helpers import RuntimeHelperScript
from agents.sandbox.session.workspace_payloads import coerce_write_payload
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User

import strata
from strata._openai_common import StrataSessionBase

if TYPE_CHECKING:
    from strata.openai_agents import StrataSandboxClient, StrataSandboxSessionState

#: Rows and columns of a PTY session's terminal.
TERMINAL_SIZE = (24, 80)


def _missing(error: BaseException) -> bool:
    text = str(error)
    return "not found: " in text or "not a directory on the way" in text


class _Process:
    """A process started by ``pty_exec_start``: its output as it comes (a thread follows
    it), and how it ended."""

    def __init__(self, pid: int, tty: bool) -> None:
        self.pid = pid
        self.tty = tty
        self.chunks: Deque[bytes] = deque()
        self.lock = asyncio.Lock()
        self.notify = asyncio.Event()
        self.closed = threading.Event()
        self.exit_code: Optional[int] = None
        self.last_used = time.monotonic()

    def follow(self, live: strata.LiveSandbox, loop: asyncio.AbstractEventLoop) -> None:
        def push(_stream: str, data: bytes) -> None:
            loop.call_soon_threadsafe(self._add, bytes(data))

        def run() -> None:
            try:
                followed = live._follow(self.pid, push)
                self.exit_code = _exit_code(followed if followed is not None else live.wait(self.pid))
            except strata.SandboxError:
                self.exit_code = 137  # the sandbox stopped under it
            finally:
                self.closed.set()
                try:
                    loop.call_soon_threadsafe(self.notify.set)
                except RuntimeError:
                    pass  # the loop is gone; nobody collects this output any more

        threading.Thread(target=run, name="strata-agents-pty", daemon=True).start()

    def _add(self, data: bytes) -> None:
        self.chunks.append(data)
        self.notify.set()


def _exit_code(exit: Any) -> int:
    code = exit.get("exit_code")
    if code is not None:
        return int(code)
    signal = exit.get("signal")
    return 128 + int(signal) if signal is not None else 1


class StrataLiveSandboxSession(StrataSessionBase):
    """An SDK sandbox session that is one Strata live sandbox for its whole life.

    Every ``exec`` runs in the same sandbox (``shell=True`` runs ``sh -c``; the working
    directory is ``Manifest.root``, a private host directory mounted read-write there), so
    a process started in the background keeps running for the next command.
    ``pty_exec_start`` starts a process (on a terminal with ``tty=True``) and returns its
    output so far; ``pty_write_stdin`` types into it. Ports listed in the client options'
    ``exposed_ports`` are published on host loopback when the sandbox starts
    (``resolve_exposed_port``). Files are read and written through the sandbox's own mount
    tree, never following a symlink the tool planted.

    Not supported: manifest users and groups (``run_as``), path grants with a ``host_path``.
    """

    state: "StrataSandboxSessionState"

    def __init__(self, *, state: "StrataSandboxSessionState", client: "StrataSandboxClient") -> None:
        self.state = state
        self._client = client
        self._sandbox: Optional[strata.LiveSandbox] = None
        self._ports: Dict[int, Tuple[str, int]] = {}
        self._helpers: Dict[str, RuntimeHelperScript] = {}
        self._processes: Dict[int, _Process] = {}
        self._process_ids: Set[int] = set()
        self._process_lock = asyncio.Lock()

    @property
    def live_sandbox(self) -> Optional[strata.LiveSandbox]:
        """The Strata live sandbox, once the SDK session has started."""
        return self._sandbox

    def _live(self) -> strata.LiveSandbox:
        live = self._sandbox
        if live is None or live.stopped:
            raise ExecTransportError(
                command=("strata",),
                message="the Strata live sandbox is not running (start the sandbox session first)",
            )
        return live

    # -- lifecycle --------------------------------------------------------------------

    async def _ensure_backend_started(self) -> None:
        if self._sandbox is not None and not self._sandbox.stopped:
            return
        found = self._client._find_live(self.state.strata_session_id)
        if found is not None:
            self._sandbox = found
            self._ports = _port_map(await asyncio.to_thread(found.info))
            self._set_start_state_preserved(True)
            return
        started = await asyncio.to_thread(
            self._client._start_live, self.state.manifest.root, self.state.exposed_ports
        )
        self._sandbox = started
        self._ports = _port_map(await asyncio.to_thread(started.info))
        self.state.strata_session_id = started.id
        self.state.workspace_root_ready = False
        self._set_start_state_preserved(False)

    async def running(self) -> bool:
        return self._sandbox is not None and not self._sandbox.stopped

    async def _download_workspace(self, host_dir: str) -> None:
        await asyncio.to_thread(self._live().download, self.state.manifest.root, host_dir)

    async def _upload_workspace(self, host_dir: str) -> None:
        await asyncio.to_thread(self._live().upload, host_dir, self.state.manifest.root)

    def supports_pty(self) -> bool:
        return True

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        published = self._ports.get(port)
        if published is None:
            return await super()._resolve_exposed_port(port)
        host, host_port = published
        return ExposedPortEndpoint(host=host, port=host_port, tls=False)

    # -- exec -------------------------------------------------------------------------

    def _prepare_exec_command(
        self,
        *command: Union[str, Path],
        shell: Union[bool, List[str]],
        user: Union[str, User, None],
    ) -> List[str]:
        if user is not None:
            raise ValueError(
                "StrataLiveSandboxSession runs commands as the sandbox's user only (no run_as)"
            )
        if shell is True:
            shell = ["sh", "-c"]
        return super()._prepare_exec_command(*command, shell=shell, user=None)

    async def _ensure_runtime_helper_installed(self, helper: RuntimeHelperScript) -> Any:
        # The sandbox's /tmp is noexec: remember the helper and run its script inline.
        path = helper.install_path
        self._helpers[str(path)] = helper
        return path

    def _argv(self, command: Tuple[Union[str, Path], ...]) -> List[str]:
        argv = [str(part) for part in command]
        helper = self._helpers.get(argv[0]) if argv else None
        if helper is not None:
            argv = ["sh", "-c", helper.content, argv[0], *argv[1:]]
        return argv

    async def _exec_internal(
        self,
        *command: Union[str, Path],
        timeout: Optional[float] = None,
    ) -> ExecResult:
        live = self._live()
        argv = self._argv(command)
        environment = await self.state.manifest.environment.resolve()
        root = self.state.manifest.root
        try:
            pid = await asyncio.to_thread(
                lambda: live.spawn(argv, env=environment or None, workdir=root, timeout=timeout)
            )
        except strata.SandboxError as e:
            raise ExecTransportError(command=tuple(command), cause=e) from e
        out: List[bytes] = []
        err: List[bytes] = []

        def collect(stream: str, data: bytes) -> None:
            (out if stream == "stdout" else err).append(bytes(data))

        try:
            followed = await asyncio.shield(asyncio.to_thread(live._follow, pid, collect))
        except asyncio.CancelledError:
            # The command ends with the cancelled call, and so does everything it started
            # in its process group.
            await asyncio.to_thread(_kill_quietly, live, pid)
            raise
        except strata.SandboxError as e:
            raise ExecTransportError(command=tuple(command), cause=e) from e
        exit = followed if followed is not None else await asyncio.to_thread(live.wait, pid)
        if exit.get("timed_out"):
            raise ExecTimeoutError(command=tuple(command), timeout_s=timeout)
        return ExecResult(stdout=b"".join(out), stderr=b"".join(err), exit_code=_exit_code(exit))

    async def pty_exec_start(
        self,
        *command: Union[str, Path],
        timeout: Optional[float] = None,
        shell: Union[bool, List[str]] = True,
        user: Union[str, User, None] = None,
        tty: bool = False,
        yield_time_s: Optional[float] = None,
        max_output_tokens: Optional[int] = None,
    ) -> PtyExecUpdate:
        live = self._live()
        argv = self._argv(tuple(self._prepare_exec_command(*command, shell=shell, user=user)))
        environment = await self.state.manifest.environment.resolve()
        root = self.state.manifest.root
        try:
            pid = await asyncio.to_thread(
                lambda: live.spawn(
                    argv,
                    env=environment or None,
                    workdir=root,
                    timeout=timeout,
                    stdin=not tty,
                    tty=TERMINAL_SIZE if tty else None,
                )
            )
        except strata.SandboxError as e:
            raise ExecTransportError(command=tuple(command), cause=e) from e
        process = _Process(pid, tty)
        process.follow(live, asyncio.get_running_loop())
        pruned: Optional[_Process] = None
        async with self._process_lock:
            process_id = allocate_pty_process_id(self._process_ids)
            self._process_ids.add(process_id)
            if len(self._processes) >= PTY_PROCESSES_MAX:
                meta = [(i, p.last_used, p.closed.is_set()) for i, p in self._processes.items()]
                oldest = process_id_to_prune_from_meta(meta)
                if oldest is not None:
                    pruned = self._processes.pop(oldest, None)
                    self._process_ids.discard(oldest)
            self._processes[process_id] = process
        if pruned is not None:
            await asyncio.to_thread(_kill_quietly, live, pruned.pid)
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._update(
            process_id, process, clamp_pty_yield_time_ms(yield_ms), max_output_tokens
        )

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: Optional[float] = None,
        max_output_tokens: Optional[int] = None,
    ) -> PtyExecUpdate:
        async with self._process_lock:
            process = self._resolve_pty_session_entry(
                pty_processes=self._processes, session_id=session_id
            )
        if chars:
            live = self._live()
            try:
                await asyncio.to_thread(live.write_stdin, process.pid, chars.encode("utf-8"))
            except strata.InvalidRequestError:
                pass  # it ended (or closed its input) meanwhile: its exit says so
            await asyncio.sleep(0.1)
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        wait_ms = resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=chars == "")
        process.last_used = time.monotonic()
        return await self._update(session_id, process, wait_ms, max_output_tokens)

    async def _update(
        self, process_id: int, process: _Process, wait_ms: int, max_output_tokens: Optional[int]
    ) -> PtyExecUpdate:
        output, original_tokens, closed = await collect_pty_output(
            output_chunks=process.chunks,
            output_lock=process.lock,
            output_notify=process.notify,
            is_done=process.closed.is_set,
            yield_time_ms=wait_ms,
            max_output_tokens=max_output_tokens,
        )
        exit_code = process.exit_code if closed else None
        if exit_code is None:
            return PtyExecUpdate(
                process_id=process_id,
                output=output,
                exit_code=None,
                original_token_count=original_tokens,
            )
        async with self._process_lock:
            self._processes.pop(process_id, None)
            self._process_ids.discard(process_id)
        return PtyExecUpdate(
            process_id=None,
            output=output,
            exit_code=exit_code,
            original_token_count=original_tokens,
        )

    async def pty_terminate_all(self) -> None:
        async with self._process_lock:
            processes = list(self._processes.values())
            self._processes.clear()
            self._process_ids.clear()
        live = self._sandbox
        if live is None or live.stopped:
            return
        for process in processes:
            await asyncio.to_thread(_kill_quietly, live, process.pid)

    # -- files ------------------------------------------------------------------------

    async def read(self, path: Path, *, user: Union[str, User, None] = None) -> io.IOBase:
        if user is not None:
            raise ValueError("StrataLiveSandboxSession reads as the sandbox's user only (no run_as)")
        target = self.normalize_path(path)
        try:
            data = await asyncio.to_thread(self._live().read_file, target.as_posix())
        except strata.SandboxError as e:
            if _missing(e):
                raise WorkspaceReadNotFoundError(path=path, cause=e) from e
            raise WorkspaceArchiveReadError(path=path, context={"reason": str(e)}, cause=e) from e
        return io.BytesIO(bytes(data))

    async def write(
        self,
        path: Path,
        data: io.IOBase,
        *,
        user: Union[str, User, None] = None,
    ) -> None:
        if user is not None:
            raise ValueError("StrataLiveSandboxSession writes as the sandbox's user only (no run_as)")
        payload = coerce_write_payload(path=path, data=data)
        target = self.normalize_path(path, for_write=True)
        content = payload.stream.read()
        try:
            await asyncio.to_thread(self._live().write_file, target.as_posix(), bytes(content))
        except strata.SandboxError as e:
            raise WorkspaceArchiveWriteError(path=target, context={"reason": str(e)}, cause=e) from e

def _kill_quietly(live: strata.LiveSandbox, pid: int) -> None:
    try:
        live.kill(pid, 9)
    except strata.SandboxError:
        pass  # it ended, or the sandbox stopped


def _port_map(info: Dict[str, Any]) -> Dict[int, Tuple[str, int]]:
    return {
        int(port["guest_port"]): (str(port["host_ip"]), int(port["host_port"]))
        for port in info.get("ports") or []
    }
