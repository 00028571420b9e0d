"""A LangChain Deep Agents sandbox backend on a Strata session.

Requires ``deepagents`` (``pip install strata-sandbox[deepagents]``)::

    import strata
    from deepagents import create_deep_agent
    from strata.deepagents import StrataBackend

    sb = strata.Sandbox()
    with sb.session(strata.Caps(timeout=60)) as session:
        agent = create_deep_agent(model=..., backend=StrataBackend(session))

:class:`StrataBackend` implements ``deepagents.backends.protocol.SandboxBackendProtocol``
through ``deepagents.backends.sandbox.BaseSandbox``: ``execute`` runs ``sh -c COMMAND`` as
one sandbox run of the session (its working directory is the session's workdir, by default
``/workspace``; files there persist from call to call, nothing else does: ``/tmp`` is
private to each run); ``upload_files``, ``download_files`` and ``write`` copy bytes in and
out of the session's directory on the host side (no run, any backend); ``ls``, ``read``,
``edit``, ``grep``, ``glob`` and ``delete`` are BaseSandbox's, which run ``python3`` or
``sh`` scripts through ``execute`` (so they need a backend with a shell: ``process``,
``container``, ``microvm``; the ``wasm`` backend has neither, so only the file copies work
there).

Paths are absolute, as the protocol wants. Files can be copied in and out only inside the
session's workdir: a relative path is ``invalid_path``, a path outside the workdir is
``permission_denied`` (the sandbox cannot write there for good, and Strata never copies
out anything else). Deep Agents' own scratch paths (e.g. ``/large_tool_results/``) are
outside it: route them to another backend with ``CompositeBackend`` if the agent needs them.

:class:`StrataBackend` also takes a :class:`strata.LiveSandbox` (``Sandbox.start``, or
``AsyncLiveSandbox``): then every ``execute`` runs in that one sandbox, so a server or a
watcher started in the background (``cmd &``) is still running for the next command, and
files persist anywhere the sandbox can write. Its ``workdir`` is the directory files are
copied in and out of (default ``/tmp``, the live sandbox's own; pass the guest path of a
read-write mount to keep the files on the host). ``close_session=True`` stops it.

Deep Agents Code discovers sandbox providers through the ``deepagents_code.sandbox_providers``
entry-point group (or ``[sandboxes.providers.NAME] class_path = "..."`` in its config);
:class:`StrataSandboxProvider` is such a provider.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import posixpath
import threading
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Tuple,
    TypeVar,
    Union,
)

from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileOperationError,
    FileUploadResponse,
    WriteResult,
)
from deepagents.backends.sandbox import BaseSandbox

import strata

__all__ = [
    "StrataBackend",
    "StrataSandboxNotFoundError",
    "StrataSandboxProvider",
    "TIMEOUT_EXIT_CODE",
]

#: The exit code ``execute`` reports for a command killed by its timeout (as GNU
#: ``timeout`` and Deep Agents' ``LocalShellBackend`` do).
TIMEOUT_EXIT_CODE = 124

#: A session of either flavour: the sync :class:`strata.Session` or :class:`strata.AsyncSession`.
SessionLike = Union["strata.Session", "strata.AsyncSession"]

_T = TypeVar("_T")


def _file_error(error: BaseException) -> str:
    """A Strata file-copy error as a ``FileOperationError`` code when one fits (the Rust
    side names the common cases in its messages), else the message itself."""
    text = str(error)
    if isinstance(error, strata.DeniedError):
        return "permission_denied"
    if "not found: " in text or "not a directory on the way" in text:
        return "file_not_found"
    if "is a directory: " in text:
        return "is_directory"
    if text.startswith("invalid path") or "invalid path " in text:
        return "invalid_path"
    return text


class _LiveResult:
    """A live exec's result with the fields ``_response`` reads of a RunResult."""

    def __init__(self, exit: Mapping[str, Any]) -> None:
        self.stdout = bytes(exit.get("stdout") or b"").decode("utf-8", errors="replace")
        self.stderr = bytes(exit.get("stderr") or b"").decode("utf-8", errors="replace")
        self.exit_code = exit.get("exit_code")
        self.signal = exit.get("signal")
        self.timed_out = bool(exit.get("timed_out"))
        # A live sandbox keeps the newest output in its ring and never kills for more.
        self.stdout_truncated = False
        self.stderr_truncated = False
        self.limit = None


class _LiveSession:
    """A :class:`strata.LiveSandbox` in the shape of the session calls StrataBackend makes
    (run, write_file, read_file, list_files, close)."""

    def __init__(self, live: "strata.LiveSandbox", workdir: str) -> None:
        self.live = live
        self.workdir = workdir

    @property
    def id(self) -> str:
        return self.live.id

    def run(self, argv: List[str], *, timeout: Optional[float] = None) -> _LiveResult:
        return _LiveResult(
            self.live.exec(argv, workdir=self.workdir, timeout=timeout if timeout else None)
        )

    def write_file(self, path: str, data: bytes) -> None:
        parent = posixpath.dirname(path)
        if parent and parent != "/":
            self.live.mkdir(parent, parents=True)
        self.live.write_file(path, data)

    def read_file(self, path: str) -> bytes:
        return self.live.read_file(path)

    def list_files(self, path: str) -> List[Mapping[str, Any]]:
        return [dict(entry) for entry in self.live.list_dir(path)]

    def close(self) -> None:
        self.live.stop()


def _combined_output(result: "strata.RunResult") -> str:
    """stdout, then stderr (on a new line), as the protocol's single ``output``."""
    out = result.stdout
    err = result.stderr
    if out and err:
        return out + ("" if out.endswith("\n") else "\n") + err
    return out or err


class StrataBackend(BaseSandbox):
    """Deep Agents' ``SandboxBackendProtocol`` on a Strata session.

    ``session`` is a :class:`strata.Session` or a :class:`strata.AsyncSession`: the sync
    methods call the former directly and the async twins run it on a worker thread; with an
    ``AsyncSession`` the async methods await it (cancelling the awaiting task kills the
    run) and the sync ones run it on a private event loop. The backend does not own the
    session unless ``close_session=True`` (default ``False``): :meth:`close` then closes it
    (which removes its files).

    ``timeout`` (seconds) is the default of ``execute`` calls that give none; ``None``
    (default) keeps the session caps' timeout, ``0`` means none. A call's own ``timeout``
    overrides it (``0``: none). A command killed by its timeout returns exit code
    :data:`TIMEOUT_EXIT_CODE` (124) and its output so far with a note; one killed by another
    limit (memory, output, ...) returns ``128 + signal`` with a note. ``truncated`` is set
    when the session's output limit (caps ``output``, default 1 MiB per stream) cut stdout
    or stderr; Strata kills the command when that happens, so raise ``output`` in the caps
    for chatty commands. A run the sandbox refuses (a policy, invalid caps) returns the reason as
    output with ``exit_code=None``; it never raises.
    """

    def __init__(
        self,
        session: Union[SessionLike, "strata.LiveSandbox", "strata.AsyncLiveSandbox"],
        *,
        timeout: Optional[float] = None,
        close_session: bool = False,
        workdir: Optional[str] = None,
    ) -> None:
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")
        if isinstance(session, strata.AsyncLiveSandbox):
            session = session.live
        if isinstance(session, strata.LiveSandbox):
            guest = "/tmp" if workdir is None else workdir
            if not isinstance(guest, str) or not guest.startswith("/") or "\0" in guest:
                raise ValueError(f"workdir must be an absolute guest path, got {guest!r}")
            self._session: Any = _LiveSession(session, posixpath.normpath(guest))
        elif workdir is not None:
            raise ValueError("workdir is the live sandbox's; a session has its own")
        else:
            self._session = session
        self._is_async = isinstance(self._session, strata.AsyncSession)
        self._timeout = timeout
        self._close_session = close_session
        workdir_text = str(self._session.workdir)
        self._workdir = workdir_text.rstrip("/") or "/"

    # -- identity and lifecycle -------------------------------------------------------

    @property
    def id(self) -> str:
        """The Strata session id (``s-`` and 32 hex digits)."""
        return str(self._session.id)

    @property
    def session(self) -> Any:
        """The Strata session this backend runs in (for a live sandbox, a small adapter
        whose ``live`` is the :class:`strata.LiveSandbox`)."""
        return self._session

    @property
    def workdir(self) -> str:
        """The session's workdir (guest path), the only place files persist and can be
        copied in or out."""
        return self._workdir

    def close(self) -> None:
        """Closes the session if this backend owns it (``close_session=True``)."""
        if self._close_session:
            self._call(lambda s: s.close(), lambda a: a.close())

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        if self._close_session:
            await self._acall(lambda s: s.close(), lambda a: a.close())

    # -- plumbing: one operation on either session flavour ----------------------------

    def _call(
        self,
        sync: Callable[[Any], _T],
        make_async: Callable[[Any], Awaitable[_T]],
    ) -> _T:
        """Runs an operation from sync code."""
        if not self._is_async:
            return sync(self._session)
        return _run_coroutine(lambda: make_async(self._session))

    async def _acall(
        self,
        sync: Callable[[Any], _T],
        make_async: Callable[[Any], Awaitable[_T]],
    ) -> _T:
        """Runs an operation from async code."""
        if self._is_async:
            return await make_async(self._session)
        session = self._session
        return await asyncio.to_thread(sync, session)

    # -- execute ----------------------------------------------------------------------

    def _call_timeout(self, timeout: Optional[int]) -> Optional[float]:
        if timeout is not None:
            if timeout < 0:
                raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")
            return float(timeout)
        return self._timeout

    def execute(self, command: str, *, timeout: Optional[int] = None) -> ExecuteResponse:
        """Runs ``sh -c command`` in the session (see the class docstring)."""
        if not command or not isinstance(command, str):
            return ExecuteResponse(
                output="Error: the command must be a non-empty string.", exit_code=1
            )
        seconds = self._call_timeout(timeout)
        argv = ["sh", "-c", command]
        try:
            result = self._call(
                lambda s: s.run(argv, timeout=seconds),
                lambda a: a.run(argv, timeout=seconds),
            )
        except strata.SandboxError as e:
            return _refused(e)
        return _response(result, seconds)

    async def aexecute(self, command: str, *, timeout: Optional[int] = None) -> ExecuteResponse:  # noqa: ASYNC109
        """Async :meth:`execute`; cancelling the awaiting task kills the run when the
        session is an ``AsyncSession``."""
        if not command or not isinstance(command, str):
            return ExecuteResponse(
                output="Error: the command must be a non-empty string.", exit_code=1
            )
        seconds = self._call_timeout(timeout)
        argv = ["sh", "-c", command]
        try:
            result = await self._acall(
                lambda s: s.run(argv, timeout=seconds),
                lambda a: a.run(argv, timeout=seconds),
            )
        except strata.SandboxError as e:
            return _refused(e)
        return _response(result, seconds)

    # -- file copies ------------------------------------------------------------------

    def _guest(self, path: str) -> Tuple[Optional[str], Optional[FileOperationError]]:
        """``path`` checked for a copy: the normalized guest path, or the error code."""
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            return None, "invalid_path"
        normalized = posixpath.normpath("/" + path.lstrip("/"))
        if normalized == self._workdir:
            return None, "is_directory"
        if not normalized.startswith(self._workdir.rstrip("/") + "/"):
            return None, "permission_denied"
        return normalized, None

    def upload_files(self, files: List[Tuple[str, bytes]]) -> List[FileUploadResponse]:
        """Writes each ``(path, content)`` into the session's directory (parent directories
        are created; an existing file is replaced). Order is kept; failures are per file."""
        responses = []
        for path, content in files:
            guest, code = self._guest(path)
            if guest is None:
                responses.append(FileUploadResponse(path=path, error=code))
                continue
            try:
                self._call(
                    lambda s: s.write_file(guest, content),
                    lambda a: a.write_file(guest, content),
                )
            except strata.SandboxError as e:
                responses.append(FileUploadResponse(path=path, error=_file_error(e)))
                continue
            responses.append(FileUploadResponse(path=path, error=None))
        return responses

    async def aupload_files(self, files: List[Tuple[str, bytes]]) -> List[FileUploadResponse]:
        """Async :meth:`upload_files`."""
        responses = []
        for path, content in files:
            guest, code = self._guest(path)
            if guest is None:
                responses.append(FileUploadResponse(path=path, error=code))
                continue
            try:
                await self._acall(
                    lambda s: s.write_file(guest, content),
                    lambda a: a.write_file(guest, content),
                )
            except strata.SandboxError as e:
                responses.append(FileUploadResponse(path=path, error=_file_error(e)))
                continue
            responses.append(FileUploadResponse(path=path, error=None))
        return responses

    def download_files(self, paths: List[str]) -> List[FileDownloadResponse]:
        """Reads each path from the session's directory. Order is kept; failures are per
        file: ``file_not_found``, ``is_directory``, ``permission_denied`` (outside the
        workdir, or a file without its owner's read bit), ``invalid_path`` (relative), or
        Strata's reason (a symlink or a hard-linked file is never copied out)."""
        responses = []
        for path in paths:
            guest, code = self._guest(path)
            if guest is None:
                responses.append(FileDownloadResponse(path=path, content=None, error=code))
                continue
            parent = posixpath.dirname(guest)
            try:
                entries = self._call(
                    lambda s: s.list_files(parent),
                    lambda a: a.list_files(parent),
                )
                problem = _download_problem(entries, guest)
                if problem is not None:
                    responses.append(FileDownloadResponse(path=path, content=None, error=problem))
                    continue
                data = self._call(
                    lambda s: s.read_file(guest),
                    lambda a: a.read_file(guest),
                )
            except strata.SandboxError as e:
                responses.append(
                    FileDownloadResponse(path=path, content=None, error=_file_error(e))
                )
                continue
            responses.append(FileDownloadResponse(path=path, content=bytes(data), error=None))
        return responses

    async def adownload_files(self, paths: List[str]) -> List[FileDownloadResponse]:
        """Async :meth:`download_files`."""
        responses = []
        for path in paths:
            guest, code = self._guest(path)
            if guest is None:
                responses.append(FileDownloadResponse(path=path, content=None, error=code))
                continue
            parent = posixpath.dirname(guest)
            try:
                entries = await self._acall(
                    lambda s: s.list_files(parent),
                    lambda a: a.list_files(parent),
                )
                problem = _download_problem(entries, guest)
                if problem is not None:
                    responses.append(FileDownloadResponse(path=path, content=None, error=problem))
                    continue
                data = await self._acall(
                    lambda s: s.read_file(guest),
                    lambda a: a.read_file(guest),
                )
            except strata.SandboxError as e:
                responses.append(
                    FileDownloadResponse(path=path, content=None, error=_file_error(e))
                )
                continue
            responses.append(FileDownloadResponse(path=path, content=bytes(data), error=None))
        return responses

    # -- write without a run ----------------------------------------------------------

    def write(self, file_path: str, content: str) -> WriteResult:
        """Writes ``content`` (UTF-8) to ``file_path`` in the session's directory, creating
        parent directories and replacing an existing file, without a sandbox run."""
        response = self.upload_files([(file_path, content.encode("utf-8"))])[0]
        if response.error:
            return WriteResult(error=f"Failed to write file '{file_path}': {response.error}")
        return WriteResult(path=file_path)

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        """Async :meth:`write`."""
        response = (await self.aupload_files([(file_path, content.encode("utf-8"))]))[0]
        if response.error:
            return WriteResult(error=f"Failed to write file '{file_path}': {response.error}")
        return WriteResult(path=file_path)


def _download_problem(entries: List[Mapping[str, Any]], guest: str) -> Optional[str]:
    """Why ``guest`` cannot be downloaded, judged from its parent's listing, or ``None``."""
    name = posixpath.basename(guest)
    entry = next((e for e in entries if e.get("name") == name), None)
    if entry is None:
        return "file_not_found"
    kind = entry.get("kind")
    if kind == "dir":
        return "is_directory"
    if kind == "file" and not int(entry.get("mode", 0o644)) & 0o400:
        # The host side could read it, but the sandboxed tools cannot: say so.
        return "permission_denied"
    return None


def _response(result: "strata.RunResult", seconds: Optional[float]) -> ExecuteResponse:
    output = _combined_output(result)
    truncated = bool(result.stdout_truncated or result.stderr_truncated)
    if result.timed_out:
        limit = f" after {seconds:g} seconds" if seconds else ""
        note = f"Error: Command timed out{limit} and was killed."
        output = f"{output}\n{note}" if output else note
        return ExecuteResponse(output=output, exit_code=TIMEOUT_EXIT_CODE, truncated=truncated)
    exit_code = result.exit_code
    if exit_code is None and result.signal is not None:
        exit_code = 128 + int(result.signal)
    if result.limit is not None:
        note = f"Error: Command killed by the sandbox's {result.limit} limit."
        output = f"{output}\n{note}" if output else note
    return ExecuteResponse(output=output, exit_code=exit_code, truncated=truncated)


def _refused(error: "strata.SandboxError") -> ExecuteResponse:
    """A run the sandbox refused, as output the model can read (never an exception)."""
    if isinstance(error, (strata.InvalidRequestError, strata.DeniedError)):
        text = f"Error: the sandbox refused the command ({error.code}): {error}"
    else:
        text = f"Error: the sandbox could not run the command ({error.code})."
    return ExecuteResponse(output=text, exit_code=None)


def _run_coroutine(make: Callable[[], Awaitable[_T]]) -> _T:
    """Runs a coroutine to completion from sync code, on this thread when no event loop
    runs here, else on a short-lived worker thread (never blocking a running loop on
    itself)."""

    async def main() -> _T:
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


class StrataSandboxNotFoundError(LookupError):
    """``get_or_create(sandbox_id=...)`` named no session this provider has open."""


class StrataSandboxProvider:
    """A Deep Agents Code sandbox provider: each sandbox is a Strata session.

    Register it under the ``deepagents_code.sandbox_providers`` entry-point group, or in
    ``~/.deepagents/config.toml``::

        [sandboxes.providers.strata]
        class_path = "strata.deepagents:StrataSandboxProvider"
        [sandboxes.providers.strata.params]
        backend = "process"

    The registry builds it without arguments. ``get_or_create`` takes the provider's
    params: ``backend`` (default ``"auto"``), ``caps`` (a dict of ``strata.Caps`` keywords;
    default ``Caps()``), ``workdir`` (default ``"/workspace"``), ``timeout`` (default
    ``execute`` timeout in seconds; default the caps'), ``max_transfer`` (default 256 MiB),
    ``profile`` (a Strata profile file). Sessions live as long as this process (or until
    :meth:`delete`): ``sandbox_id`` finds one this provider opened, nothing else.
    """

    def __init__(self, sandbox: Optional["strata.Sandbox"] = None) -> None:
        self._given = sandbox
        self._sandboxes: Dict[Tuple[str, Optional[str]], strata.Sandbox] = {}
        self._open: Dict[str, StrataBackend] = {}
        self._lock = threading.Lock()

    @property
    def metadata(self) -> Any:
        """Deep Agents Code's ``SandboxProviderMetadata`` (working dir ``/workspace``, no
        reattaching across processes, no snapshots), or ``None`` without that package."""
        try:
            from deepagents_code.integrations.sandbox_provider import (  # type: ignore[import-not-found]
                SandboxProviderMetadata,
            )
        except ImportError:
            return None
        return SandboxProviderMetadata(
            name="strata",
            working_dir="/workspace",
            supports_sandbox_id=False,
            supports_snapshot_name=False,
            backend_module="strata",
        )

    def _sandbox(self, backend: str, profile: Optional[str]) -> "strata.Sandbox":
        if self._given is not None:
            return self._given
        key = (backend, profile)
        with self._lock:
            sandbox = self._sandboxes.get(key)
            if sandbox is None:
                sandbox = strata.Sandbox(backend, profile=profile)
                self._sandboxes[key] = sandbox
            return sandbox

    def get_or_create(
        self,
        *,
        sandbox_id: Optional[str] = None,
        backend: str = "auto",
        caps: Union["strata.Caps", Mapping[str, Any], None] = None,
        workdir: str = "/workspace",
        timeout: Optional[float] = None,
        max_transfer: Union[int, str, None] = None,
        profile: Optional[str] = None,
        **kwargs: Any,
    ) -> StrataBackend:
        """The backend of the open session ``sandbox_id``, or of a new session."""
        if kwargs:
            unknown = ", ".join(sorted(kwargs))
            raise TypeError(f"StrataSandboxProvider.get_or_create: unknown parameters {unknown}")
        if sandbox_id is not None:
            with self._lock:
                found = self._open.get(sandbox_id)
            if found is None or found.session.closed:
                raise StrataSandboxNotFoundError(
                    f"no open Strata session {sandbox_id!r} "
                    "(sessions do not outlive the process that opened them)"
                )
            return found
        session = self._sandbox(backend, profile).session(
            caps, workdir=workdir, max_transfer=max_transfer
        )
        made = StrataBackend(session, timeout=timeout, close_session=True)
        with self._lock:
            self._open[made.id] = made
        return made

    def delete(self, *, sandbox_id: str, **kwargs: Any) -> None:
        """Closes the session ``sandbox_id`` (its files are removed); unknown ids are
        ignored."""
        with self._lock:
            found = self._open.pop(sandbox_id, None)
        if found is not None:
            found.close()

    def close(self) -> None:
        """Closes every session this provider still has open and the sandboxes it built
        (not one given to it)."""
        with self._lock:
            backends = list(self._open.values())
            sandboxes = list(self._sandboxes.values())
            self._open.clear()
            self._sandboxes.clear()
        for backend in backends:
            backend.close()
        for sandbox in sandboxes:
            sandbox.close()

    async def aget_or_create(
        self, *, sandbox_id: Optional[str] = None, **kwargs: Any
    ) -> StrataBackend:
        """Async :meth:`get_or_create`."""
        return await asyncio.to_thread(lambda: self.get_or_create(sandbox_id=sandbox_id, **kwargs))

    async def adelete(self, *, sandbox_id: str, **kwargs: Any) -> None:
        """Async :meth:`delete`."""
        await asyncio.to_thread(lambda: self.delete(sandbox_id=sandbox_id, **kwargs))
