"""Strata: run AI-agent tools (model-written code and commands) in sandboxes.

>>> import strata
>>> sb = strata.Sandbox()                       # backend="auto", strict=True
>>> caps = strata.Caps(read_only=["/data"], timeout=10, memory="256M")
>>> result = sb.run(["python3", "-c", "print(open('/data/x').read())"], caps)
>>> result.exit_code, result.stdout, result.receipt

Caps deny by default: no host files but the read-only system directories programs need,
no network, an empty environment, and a limit on everything. A run whose caps this host
cannot enforce is refused before anything executes (``strict=True``). A non-zero exit is
data (``result.ok``, ``result.exit_code``); ``result.check()`` raises on failure.

This package is a thin layer over the Rust library: every decision about what a sandbox
allows is made there. Rust ``tracing`` events are logged to the ``"strata"`` logger.
Framework adapters live in :mod:`strata.langchain` and :mod:`strata.openai_agents`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from pathlib import Path
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from strata import _strata
from strata._strata import (
    AgentDirectory,
    BackendUnavailableError,
    CancelledError,
    Caps,
    DeniedError,
    DoctorReport,
    InternalError,
    InvalidRequestError,
    LimitExceededError,
    LiveSandbox,
    MessageVerifier,
    Receipt,
    RunHandle,
    RunResult,
    SandboxError,
    SandboxTimeoutError,
    Session,
    SetupFailedError,
    Tool,
    ToolFailedError,
    UnenforceableError,
    Workspace,
    __version__,
    agent_public_key,
    caps_for_call,
    generate_agent_key,
    remove_snapshot,
    snapshots,
    tier_preset,
    verify_audit,
)

__all__ = [
    "AgentDirectory",
    "BackendUnavailableError",
    "CancelledError",
    "Caps",
    "DeniedError",
    "DoctorReport",
    "InternalError",
    "InvalidRequestError",
    "LimitExceededError",
    "LiveSandbox",
    "AsyncLiveSandbox",
    "MessageVerifier",
    "Receipt",
    "RunHandle",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxTimeoutError",
    "AsyncSession",
    "Session",
    "SetupFailedError",
    "Tool",
    "ToolFailedError",
    "UnenforceableError",
    "Workspace",
    "__version__",
    "agent_public_key",
    "bundled_helper",
    "caps_for_call",
    "doctor",
    "follow",
    "generate_agent_key",
    "remove_snapshot",
    "snapshots",
    "tier_preset",
    "verify_audit",
]

#: An approver: gets an elevation request dict (``agent``, ``tier``, ``tool``, ``needs``:
#: ``[{"capability", "detail"}]``; ``argv``, the whole command line, or ``script``:
#: ``{"language", "source", "bytes", "sha256"}``; ``caps``, the run's caps as the tier
#: checked them, without ``stdin``; ``stdin_bytes``), returns ``True`` (grant one run within
#: 10 minutes), a dict ``{"ttl": seconds, "runs": n}`` (grant), or ``False``/``None``
#: (refuse). The request comes from the agent: escape it before showing it on a terminal.
Approver = Callable[[Mapping[str, Any]], Union[bool, Mapping[str, Any], None]]

#: A tool argument: an argv list or a :class:`Tool`.
ToolLike = Union[Tool, Sequence[str]]
#: A caps argument: :class:`Caps`, a dict of Caps keywords, or ``None`` for ``Caps()``.
CapsLike = Union[Caps, Mapping[str, Any], None]
#: A streaming callback: receives ``str`` chunks (``bytes`` with ``text=False``).
OutputCallback = Callable[[Any], object]

_BUNDLED_HELPER = Path(__file__).resolve().parent / "_bin" / "strata-helper"
_BUNDLED_SUPERVISOR = Path(__file__).resolve().parent / "_bin" / "strata-live"

# A library does not configure logging: without this, Python's last-resort handler would
# print the Rust side's warnings (e.g. "run refused or failed") to stderr.
logging.getLogger("strata").addHandler(logging.NullHandler())


def bundled_helper() -> Optional[Path]:
    """The ``strata-helper`` binary shipped inside this package, or ``None`` if absent."""
    return _BUNDLED_HELPER if _BUNDLED_HELPER.is_file() else None


def _default_supervisor() -> Optional[str]:
    # $STRATA_LIVE, then the copy inside the wheel; None lets the library search.
    explicit = os.environ.get("STRATA_LIVE")
    if explicit:
        return explicit
    return str(_BUNDLED_SUPERVISOR) if _BUNDLED_SUPERVISOR.is_file() else None


def follow(live: LiveSandbox, pid: int) -> Iterator[Tuple[str, bytes]]:
    """Yields ``(stream, data)`` for process ``pid`` of a :class:`LiveSandbox`:
    ``stream`` is ``"stdout"`` or ``"stderr"``; first the output kept so far, then what it
    writes, until it exits. Stopping the iteration early leaves the process running."""
    chunks: "queue.Queue[Any]" = queue.Queue()
    done = object()

    def reader() -> None:
        try:
            live._follow(pid, lambda stream, data: chunks.put((stream, data)))
            chunks.put(done)
        except BaseException as error:  # handed to the consumer, raised there
            chunks.put(error)

    threading.Thread(target=reader, name="strata-follow", daemon=True).start()
    while True:
        item = chunks.get()
        if item is done:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


class AsyncLiveSandbox:
    """A :class:`LiveSandbox` for asyncio (``Sandbox.astart``): the same methods as
    coroutines, each on its own thread; ``stream(pid)`` is an async generator of output
    chunks. ``async with`` stops the sandbox."""

    def __init__(self, live: LiveSandbox) -> None:
        self.live = live

    @property
    def id(self) -> str:
        """The sandbox's id."""
        return self.live.id

    async def exec(self, argv: ToolLike, **options: Any) -> Dict[str, Any]:
        """:meth:`LiveSandbox.exec`, awaitable."""
        return dict(await asyncio.to_thread(lambda: self.live.exec(argv, **options)))

    async def spawn(self, argv: ToolLike, **options: Any) -> int:
        """:meth:`LiveSandbox.spawn`, awaitable."""
        return await asyncio.to_thread(lambda: self.live.spawn(argv, **options))

    async def wait(self, pid: int) -> Dict[str, Any]:
        """:meth:`LiveSandbox.wait`, awaitable."""
        return dict(await asyncio.to_thread(self.live.wait, pid))

    async def stream(self, pid: int) -> AsyncIterator[Tuple[str, bytes]]:
        """Like :func:`follow`, as an async generator."""
        loop = asyncio.get_running_loop()
        chunks: "asyncio.Queue[Any]" = asyncio.Queue()
        done = object()

        def reader() -> None:
            try:
                self.live._follow(
                    pid,
                    lambda stream, data: loop.call_soon_threadsafe(
                        chunks.put_nowait, (stream, data)
                    ),
                )
                loop.call_soon_threadsafe(chunks.put_nowait, done)
            except BaseException as error:
                loop.call_soon_threadsafe(chunks.put_nowait, error)

        threading.Thread(target=reader, name="strata-follow", daemon=True).start()
        while True:
            item = await chunks.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def __getattr__(self, name: str) -> Any:
        # Every other method (ps, logs, kill, pause, resume, publish, the files, stop):
        # the same call on a thread.
        method = getattr(self.live, name)
        if not callable(method):
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call

    async def __aenter__(self) -> "AsyncLiveSandbox":
        return self

    async def __aexit__(self, *exc: object) -> bool:
        await asyncio.to_thread(self.live.stop)
        return False


def _default_helper() -> str:
    # $STRATA_HELPER, then the copy inside the wheel (the rule lives in Rust); when neither
    # is there, the wheel's path anyway, so the error names where the helper was expected.
    return _strata.packaged_helper(str(_BUNDLED_HELPER.parent)) or str(_BUNDLED_HELPER)


#: What ``_await_run`` starts: ``start(done, on_stdout, on_stderr)`` returns a handle.
_Starter = Callable[
    [
        Callable[[Optional[RunResult], Optional[BaseException]], None],
        Optional[Callable[[Any], None]],
        Optional[Callable[[Any], None]],
    ],
    RunHandle,
]


async def _await_run(
    start: _Starter,
    on_stdout: Optional[OutputCallback],
    on_stderr: Optional[OutputCallback],
) -> RunResult:
    """Starts a run on its own thread and awaits it: callbacks on the loop's thread, in
    order; cancelling the awaiting task kills the run and waits until it is gone."""
    loop = asyncio.get_running_loop()
    future: "asyncio.Future[RunResult]" = loop.create_future()
    failure: List[BaseException] = []
    handle: Optional[RunHandle] = None

    def settle(result: Optional[RunResult], error: Optional[BaseException]) -> None:
        if future.done():
            return
        if failure:
            future.set_exception(failure[0])
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def done(result: Optional[RunResult], error: Optional[BaseException]) -> None:
        # Called on the run's thread.
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed; nobody awaits this run any more
            pass

    def on_loop(callback: Optional[OutputCallback]) -> Optional[Callable[[Any], None]]:
        if callback is None:
            return None
        if not callable(callback):
            raise TypeError("streaming callbacks must be callable")

        def call(chunk: Any) -> None:
            if failure:
                return
            try:
                callback(chunk)
            except BaseException as exc:  # propagate like the sync path: kill the run
                failure.append(exc)
                if handle is not None:
                    handle.cancel()

        def forward(chunk: Any) -> None:
            try:
                loop.call_soon_threadsafe(call, chunk)
            except RuntimeError:
                pass

        return forward

    handle = start(done, on_loop(on_stdout), on_loop(on_stderr))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        handle.cancel()
        try:
            # Propagate only once the sandbox and everything it started are gone.
            await asyncio.shield(future)
        except (Exception, asyncio.CancelledError):
            pass
        raise


class AsyncSession:
    """A :class:`Session` for asyncio (``Sandbox.asession``): the same methods as
    coroutines. File copies run on the default executor; ``run`` on its own thread, and
    cancelling the awaiting task kills the call. ``async with`` closes the session."""

    def __init__(self, session: Session) -> None:
        self.session = session

    @property
    def id(self) -> str:
        """The session's id."""
        return self.session.id

    @property
    def workdir(self) -> str:
        """The guest path of the session's directory."""
        return self.session.workdir

    @property
    def closed(self) -> bool:
        """Whether the session is closed."""
        return self.session.closed

    async def run(
        self,
        tool: ToolLike,
        *,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        text: bool = True,
        tier: Optional[str] = None,
        risk: Optional[str] = None,
    ) -> RunResult:
        """:meth:`Session.run`, awaitable."""
        return await _await_run(
            lambda done, out, err: self.session._start(
                tool,
                done,
                timeout=timeout,
                on_stdout=out,
                on_stderr=err,
                text=text,
                tier=tier,
                risk=risk,
            ),
            on_stdout,
            on_stderr,
        )

    async def write_file(self, path: str, data: Union[bytes, str]) -> None:
        """:meth:`Session.write_file`, awaitable."""
        await asyncio.to_thread(self.session.write_file, path, data)

    async def read_file(self, path: str) -> bytes:
        """:meth:`Session.read_file`, awaitable."""
        return await asyncio.to_thread(self.session.read_file, path)

    async def upload(self, host_path: Union[str, "os.PathLike[str]"], path: str) -> Any:
        """:meth:`Session.upload`, awaitable."""
        return await asyncio.to_thread(self.session.upload, host_path, path)

    async def download(self, path: str, host_path: Union[str, "os.PathLike[str]"]) -> Any:
        """:meth:`Session.download`, awaitable."""
        return await asyncio.to_thread(self.session.download, path, host_path)

    async def list_files(self, path: str = ".") -> List[Any]:
        """:meth:`Session.list_files`, awaitable."""
        return await asyncio.to_thread(self.session.list_files, path)

    async def remove(self, path: str) -> None:
        """:meth:`Session.remove`, awaitable."""
        await asyncio.to_thread(self.session.remove, path)

    async def close(self) -> None:
        """:meth:`Session.close`, awaitable."""
        await asyncio.to_thread(self.session.close)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> bool:
        await self.close()
        return False

    def __repr__(self) -> str:
        return f"Async{self.session!r}"


class Sandbox(_strata.Sandbox):
    """Runs tools in sandboxes; see :class:`strata._strata.Sandbox` for ``run``.

    ``Sandbox(backend="auto", *, strict=True, helper=None, warm_pool=None)``: ``backend`` is
    ``"auto"`` (default), ``"process"``, ``"wasm"``, ``"container"`` or ``"microvm"``;
    ``strict=True`` (default) refuses runs whose caps cannot be fully enforced here;
    ``helper`` defaults to ``$STRATA_HELPER`` or the ``strata-helper`` binary shipped in
    the wheel; ``warm_pool`` keeps that many process sandboxes pre-built per caps shape
    already run (default ``None``: sized by recent demand, at most 4 per shape and 8 in
    all, killed after 30 s unused; ``0`` turns pre-building off).

    Policy (all off by default): ``tier`` checks every run against a trust tier (``"low"``,
    ``"medium"``, ``"high"`` or one of ``tiers``, dicts shaped like
    :func:`tier_preset`'s); a request beyond it raises :class:`DeniedError` unless
    ``approver`` (see :data:`Approver`) grants it. ``audit`` appends every run, refusal and
    policy decision to a hash-chained JSON-lines log (:func:`verify_audit` checks it).
    ``route_backends`` and ``allow_weaker`` bound the risk router (``run(..., risk=...)``).
    ``profile`` reads a TOML (or ``.json``) profile: its backend, strictness, tier and tiers
    (explicit arguments win: a backend other than ``"auto"``, ``strict``, ``tier``), and
    the caps and risk of runs that give none.

    Thread-safe: runs release the GIL. ``with Sandbox() as sb:`` (or ``async with``) kills
    runs still in flight on exit. ``await sb.arun(...)`` runs without blocking the event
    loop; cancelling the awaiting task kills the sandboxed run.
    """

    def __new__(
        cls,
        backend: str = "auto",
        *,
        strict: Optional[bool] = None,
        helper: Union[str, "os.PathLike[str]", None] = None,
        warm_pool: Optional[int] = None,
        tier: Optional[str] = None,
        tiers: Optional[Sequence[Mapping[str, Any]]] = None,
        approver: Optional[Approver] = None,
        audit: Union[str, "os.PathLike[str]", None] = None,
        route_backends: Optional[Sequence[str]] = None,
        allow_weaker: bool = False,
        profile: Union[str, "os.PathLike[str]", None] = None,
    ) -> "Sandbox":
        return super().__new__(
            cls,
            backend,
            strict=strict,
            helper=helper if helper is not None else _default_helper(),
            warm_pool=warm_pool,
            tier=tier,
            tiers=tiers,
            approver=approver,
            audit=audit,
            route_backends=route_backends,
            allow_weaker=allow_weaker,
            profile=profile,
        )

    async def arun(
        self,
        tool: ToolLike,
        caps: CapsLike = None,
        *,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        text: bool = True,
        tier: Optional[str] = None,
        risk: Optional[str] = None,
    ) -> RunResult:
        """Like :meth:`run`, awaitable: the run executes on its own thread.

        Streaming callbacks are called on the event loop's thread, in order, before the
        result is returned. Cancelling the awaiting task kills the sandbox and everything
        it started, waits until they are gone, and raises ``asyncio.CancelledError``.
        """
        return await _await_run(
            lambda done, out, err: self._start(
                tool,
                caps,
                done,
                on_stdout=out,
                on_stderr=err,
                text=text,
                tier=tier,
                risk=risk,
            ),
            on_stdout,
            on_stderr,
        )

    def start(
        self,
        caps: CapsLike = None,
        *,
        ttl: Optional[float] = None,
        idle_ttl: Optional[float] = None,
        idle_pause: Optional[float] = None,
        name: Optional[str] = None,
        publish: Sequence[int] = (),
        supervisor: Union[str, "os.PathLike[str]", None] = None,
        state_dir: Union[str, "os.PathLike[str]", None] = None,
    ) -> LiveSandbox:
        """Starts a :class:`LiveSandbox`: one sandbox that stays up for a task (process
        backend), owned by the returned handle (``with sb.start() as live:``).
        ``supervisor`` defaults to ``$STRATA_LIVE`` or the ``strata-live`` binary shipped in
        the wheel; ``publish`` lists TCP ports inside to publish on host loopback;
        ``idle_pause`` (seconds) freezes it while idle, until the next request that needs it
        running."""
        return super().start(
            caps,
            ttl=ttl,
            idle_ttl=idle_ttl,
            idle_pause=idle_pause,
            name=name,
            publish=list(publish),
            supervisor=supervisor if supervisor is not None else _default_supervisor(),
            state_dir=state_dir,
        )

    def start_from(
        self,
        snapshot: str,
        *,
        ttl: Optional[float] = None,
        idle_ttl: Optional[float] = None,
        name: Optional[str] = None,
        publish: Sequence[int] = (),
        supervisor: Union[str, "os.PathLike[str]", None] = None,
        state_dir: Union[str, "os.PathLike[str]", None] = None,
        snapshot_dir: Union[str, "os.PathLike[str]", None] = None,
    ) -> LiveSandbox:
        """Starts a :class:`LiveSandbox` from the snapshot ``snapshot``
        (:meth:`LiveSandbox.snapshot`): verified first (its seal, owner and every file;
        an altered or another user's snapshot raises :class:`DeniedError`), its caps
        admitted under this sandbox's tier, on the snapshot's backend, with its files
        copied in. ``snapshot_dir`` defaults to ``$STRATA_SNAPSHOT_DIR`` or
        ``~/.local/share/strata/snapshots``."""
        return super().start_from(
            snapshot,
            ttl=ttl,
            idle_ttl=idle_ttl,
            name=name,
            publish=list(publish),
            supervisor=supervisor if supervisor is not None else _default_supervisor(),
            state_dir=state_dir,
            snapshot_dir=snapshot_dir,
        )

    async def astart(self, caps: CapsLike = None, **options: Any) -> "AsyncLiveSandbox":
        """Like :meth:`start`, for asyncio: ``async with await sb.astart() as live:``."""
        return AsyncLiveSandbox(await asyncio.to_thread(lambda: self.start(caps, **options)))

    def asession(
        self,
        caps: CapsLike = None,
        *,
        workdir: Union[str, "os.PathLike[str]", None] = None,
        max_transfer: Union[int, str, None] = None,
    ) -> "AsyncSession":
        """Like :meth:`session`, for asyncio: every method of the returned
        :class:`AsyncSession` is a coroutine. Use it as ``async with sb.asession() as s:``."""
        return AsyncSession(self.session(caps, workdir=workdir, max_transfer=max_transfer))

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: object) -> bool:
        self.close()
        return False


def doctor(helper: Union[str, "os.PathLike[str]", None] = None) -> DoctorReport:
    """Which backends and guarantees this host supports, and why not (``strata doctor``),
    as a :class:`Sandbox` with ``helper`` (default: as for ``Sandbox``) would use them."""
    return Sandbox(helper=helper).doctor()
