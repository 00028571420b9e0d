"""Type stubs of the native module ``strata._strata`` (re-exported by ``strata``)."""

import os
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypedDict,
    Union,
)

from typing_extensions import NotRequired, Self, disjoint_base, final

__all__ = [
    "__version__",
    "SandboxError",
    "InvalidRequestError",
    "DeniedError",
    "BackendUnavailableError",
    "UnenforceableError",
    "LimitExceededError",
    "SandboxTimeoutError",
    "ToolFailedError",
    "CancelledError",
    "SetupFailedError",
    "InternalError",
    "Tool",
    "Caps",
    "RunResult",
    "Receipt",
    "DoctorReport",
    "Sandbox",
    "RunHandle",
    "packaged_helper",
    "tier_preset",
    "verify_audit",
    "snapshots",
    "remove_snapshot",
    "AgentDirectory",
    "MessageVerifier",
    "generate_agent_key",
    "agent_public_key",
    "Workspace",
    "Session",
    "LiveSandbox",
    "caps_for_call",
]

__version__: str

_Path = Union[str, "os.PathLike[str]"]
_MountEntry = Union[_Path, Tuple[_Path, _Path]]
_Mounts = Union[_Path, Sequence[_MountEntry], Mapping[_Path, _Path], None]
_Size = Union[int, str]
_ToolLike = Union["Tool", Sequence[Union[str, "os.PathLike[str]"]]]
_CapsLike = Union["Caps", Mapping[str, Any], None]
_Callback = Callable[[Any], object]
_Risk = Literal["compute", "files", "build", "untrusted"]

# The enums of the schema (schema/*.schema.json), value for value; tests/test_schema.py
# checks them, and the keywords of Caps, against the committed schema.
_Access = Literal["ro", "rw"]
_SystemDirs = Literal["runtime", "none"]
_ContainerRuntime = Literal["native", "docker", "podman", "runsc"]
_BackendKind = Literal["process", "wasm", "container", "microvm", "cluster"]
_Strictness = Literal["strict", "best_effort"]
_LimitKind = Literal[
    "wall", "cpu", "memory", "pids", "output", "disk", "file_size", "fuel", "open_files",
    "egress_bytes", "egress_connections",
]
_Capability = Literal[
    "fs",
    "net",
    "env",
    "processes",
    "ipc",
    "uts",
    "syscalls",
    "privileges",
    "fds",
    "memory",
    "cpu",
    "wall",
    "pids",
    "output",
    "disk",
    "file_size",
    "open_files",
    "lifetime",
]
_IdentitySource = Literal["agent", "fresh", "embedder"]
_Mechanism = Literal[
    "namespace",
    "landlock",
    "seccomp",
    "mounts",
    "sysctl",
    "privileges",
    "environment",
    "descriptors",
    "supervisor",
    "cgroup",
    "rlimit",
    "host",
    "tmpfs",
    "image",
    "runtime",
    "wasm",
    "proxy",
    "vm",
    "cluster",
]
_EgressRefusal = Literal["policy", "bad_request", "unresolvable", "connect_failed", "budget"]

class _Secret(TypedDict):
    """A secret for ``Caps(secrets=[...])``: the tool's variable ``env`` holds a per-run
    placeholder; the egress proxy sends ``value`` in its place, in request headers to
    ``hosts`` only (names or ``*.domain`` wildcards). Needs a network allowlist."""

    env: str
    value: str
    hosts: List[str]

class _SecretInfo(TypedDict):
    """A secret as ``Caps.secrets`` gives it back: never the value."""

    env: str
    hosts: List[str]

class _EgressDecision(TypedDict):
    """One allow or deny decision of the egress enforcement (``Receipt.network``)."""

    host: str
    port: int
    allowed: bool
    addr: NotRequired[str]
    rule: NotRequired[str]
    refusal: NotRequired[_EgressRefusal]
    limit: NotRequired[_LimitKind]
    reason: NotRequired[str]
    secrets: NotRequired[List[str]]

class _NetworkReceipt(TypedDict):
    """What the egress enforcement of a run under a network allowlist decided."""

    enforcer: str
    rules: List[str]
    connections: int
    bytes: int
    decisions: List[_EgressDecision]
    dropped: int

class SandboxError(Exception):
    """Base class of every Strata error; ``code`` is the stable error code."""

    code: str
    result: Optional["RunResult"]
    limit: Optional[_LimitKind]

class InvalidRequestError(SandboxError, ValueError):
    """Malformed request (bad caps, empty argv, missing mount source). Nothing ran."""

class DeniedError(SandboxError, PermissionError):
    """A policy refused the request. Nothing ran."""

class BackendUnavailableError(SandboxError, RuntimeError):
    """The backend cannot run on this host or is not built in. Nothing ran."""

class UnenforceableError(SandboxError, RuntimeError):
    """A guarantee the caps need cannot be enforced here (strict). Nothing ran."""

class LimitExceededError(SandboxError):
    """``RunResult.check()``: a limit ended the run (``limit`` names it)."""

class SandboxTimeoutError(LimitExceededError, TimeoutError):
    """``RunResult.check()``: the wall-clock timeout ended the run."""

class ToolFailedError(SandboxError):
    """``RunResult.check()``: the tool exited non-zero or was killed by a signal."""

class CancelledError(SandboxError):
    """The run was cancelled (``Sandbox.close()`` or a raising callback) and killed."""

class SetupFailedError(SandboxError, OSError):
    """Building the sandbox failed. Nothing of the tool ran."""

class InternalError(SandboxError, RuntimeError):
    """A bug or an unexpected host failure."""

@final
class Tool:
    """What to run: a command (argv), a script, or a WebAssembly module."""

    @staticmethod
    def command(argv: Sequence[Union[str, "os.PathLike[str]"]]) -> "Tool": ...
    @staticmethod
    def script(language: str, source: str) -> "Tool": ...
    @staticmethod
    def wasm(module: _Path, args: Optional[Sequence[str]] = None) -> "Tool": ...
    @property
    def kind(self) -> Literal["command", "script", "wasm"]: ...
    @property
    def argv(self) -> Optional[List[str]]: ...
    @property
    def language(self) -> Optional[str]: ...
    @property
    def source(self) -> Optional[str]: ...
    @property
    def module(self) -> Optional[str]: ...
    @property
    def args(self) -> Optional[List[str]]: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Caps:
    """Capabilities of a run: deny by default, every grant explicit. Immutable."""

    def __new__(
        cls,
        base: _CapsLike = None,
        /,
        *,
        read_only: _Mounts = ...,
        read_write: _Mounts = ...,
        mounts: Optional[Sequence[Union[Mapping[str, Any], Tuple[Any, ...]]]] = ...,
        protect_host_executed: bool = ...,
        env: Optional[Mapping[str, str]] = ...,
        net: Union[str, Sequence[Union[str, Mapping[str, Any]]], Mapping[str, Any], None] = ...,
        timeout: float = ...,
        cpu_time: float = ...,
        memory: _Size = ...,
        processes: int = ...,
        output: _Size = ...,
        file_size: _Size = ...,
        open_files: int = ...,
        disk: _Size = ...,
        address_space: Optional[_Size] = ...,
        stdin: Union[str, bytes, bytearray, None] = ...,
        workdir: Optional[_Path] = ...,
        agent: Optional[str] = ...,
        secrets: Optional[Sequence[_Secret]] = ...,
        system: _SystemDirs = ...,
        cpus: float = ...,
        egress_bytes: _Size = ...,
        egress_connections: int = ...,
        image: str = ...,
        runtime: _ContainerRuntime = ...,
        workspace: Optional[_Path] = ...,
        container: Optional[Mapping[str, Any]] = ...,
        limits: Optional[Mapping[str, Any]] = ...,
    ) -> "Caps": ...
    @staticmethod
    def from_json(text: str) -> "Caps": ...
    def to_dict(self) -> Dict[str, Any]: ...
    def to_json(self) -> str: ...
    @property
    def mounts(self) -> List[Dict[str, Any]]: ...
    @property
    def protect_host_executed(self) -> bool: ...
    @property
    def env(self) -> Dict[str, str]: ...
    @property
    def net(self) -> str: ...
    @property
    def timeout(self) -> float: ...
    @property
    def cpu_time(self) -> float: ...
    @property
    def memory(self) -> int: ...
    @property
    def output(self) -> int: ...
    @property
    def file_size(self) -> int: ...
    @property
    def disk(self) -> int: ...
    @property
    def address_space(self) -> Optional[int]: ...
    @property
    def processes(self) -> int: ...
    @property
    def open_files(self) -> int: ...
    @property
    def cpus(self) -> float: ...
    @property
    def egress_bytes(self) -> int: ...
    @property
    def egress_connections(self) -> int: ...
    @property
    def stdin(self) -> bytes: ...
    @property
    def agent(self) -> Optional[str]: ...
    @property
    def secrets(self) -> List[_SecretInfo]: ...
    @property
    def workdir(self) -> Optional[str]: ...
    @property
    def system(self) -> _SystemDirs: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Receipt:
    """What a run enforced, per capability and mechanism, and what it saw denied."""

    @property
    def backend(self) -> _BackendKind: ...
    @property
    def layers(self) -> List[_BackendKind]: ...
    @property
    def strictness(self) -> _Strictness: ...
    @property
    def enforced(self) -> List[Dict[str, str]]: ...
    def has_kind(self, capability: str, kind: _Mechanism) -> bool: ...
    @property
    def gaps(self) -> List[Dict[str, str]]: ...
    @property
    def denials(self) -> List[Dict[str, str]]: ...
    @property
    def container(self) -> Optional[Dict[str, str]]: ...
    @property
    def identity(self) -> Optional[Dict[str, Any]]: ...
    @property
    def network(self) -> Optional[_NetworkReceipt]: ...
    @property
    def policy(self) -> Optional[Dict[str, Any]]: ...
    def has(self, capability: str, mechanism: str) -> bool: ...
    def to_dict(self) -> Dict[str, Any]: ...

@final
class RunResult:
    """The result of a run that happened; a non-zero exit is data, not an exception."""

    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...
    @property
    def stdout_bytes(self) -> bytes: ...
    @property
    def stderr_bytes(self) -> bytes: ...
    @property
    def stdout_truncated(self) -> bool: ...
    @property
    def stderr_truncated(self) -> bool: ...
    @property
    def exit_code(self) -> Optional[int]: ...
    @property
    def signal(self) -> Optional[int]: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def limit(self) -> Optional[_LimitKind]: ...
    @property
    def ok(self) -> bool: ...
    @property
    def status(self) -> str: ...
    @property
    def duration(self) -> float: ...
    @property
    def usage(self) -> Dict[str, int]: ...
    @property
    def backend(self) -> _BackendKind: ...
    @property
    def receipt(self) -> Receipt: ...
    def check(self) -> "RunResult": ...
    def to_dict(self) -> Dict[str, Any]: ...

@final
class DoctorReport:
    """Which backends and guarantees this host supports, and why not."""

    @property
    def backends(self) -> List[Dict[str, Any]]: ...
    def available(self, backend: str) -> bool: ...
    def to_dict(self) -> Dict[str, Any]: ...

@final
class RunHandle:
    """A run started by ``Sandbox._start`` (what ``Sandbox.arun`` awaits)."""

    def cancel(self) -> None: ...
    @property
    def cancelled(self) -> bool: ...

@disjoint_base
class Sandbox:
    """Runs tools in sandboxes; thread-safe, the GIL is released during runs."""

    def __new__(
        cls,
        backend: str = "auto",
        *,
        strict: Optional[bool] = None,
        helper: Optional[_Path] = None,
        warm_pool: Optional[int] = None,
        tier: Optional[str] = None,
        tiers: Optional[Sequence[Mapping[str, Any]]] = None,
        approver: Optional[Callable[[Dict[str, Any]], Union[bool, Mapping[str, Any], None]]] = None,
        audit: Optional[_Path] = None,
        route_backends: Optional[Sequence[str]] = None,
        allow_weaker: bool = False,
        profile: Optional[_Path] = None,
    ) -> Self: ...
    def run(
        self,
        tool: _ToolLike,
        caps: _CapsLike = None,
        *,
        on_stdout: Optional[_Callback] = None,
        on_stderr: Optional[_Callback] = None,
        text: bool = True,
        tier: Optional[str] = None,
        risk: Optional[_Risk] = None,
    ) -> RunResult: ...
    def _run_noop(
        self,
        tool: _ToolLike,
        caps: _CapsLike = None,
        *,
        on_stdout: Optional[_Callback] = None,
        on_stderr: Optional[_Callback] = None,
        text: bool = True,
    ) -> RunResult: ...
    def _start(
        self,
        tool: _ToolLike,
        caps: _CapsLike,
        done: Callable[[Optional[RunResult], Optional[BaseException]], object],
        *,
        on_stdout: Optional[_Callback] = None,
        on_stderr: Optional[_Callback] = None,
        text: bool = True,
        tier: Optional[str] = None,
        risk: Optional[str] = None,
    ) -> RunHandle: ...
    def run_in_workspace(
        self,
        workspace: Workspace,
        tool: _ToolLike,
        caps: _CapsLike = None,
        *,
        at: Optional[_Path] = None,
        tier: Optional[str] = None,
        risk: Optional[_Risk] = None,
        on_stdout: Optional[_Callback] = None,
        on_stderr: Optional[_Callback] = None,
        text: bool = True,
    ) -> RunResult: ...
    def session(
        self,
        caps: _CapsLike = None,
        *,
        workdir: Optional[_Path] = None,
        max_transfer: Union[int, str, None] = None,
    ) -> Session: ...
    def start(
        self,
        caps: _CapsLike = None,
        *,
        ttl: Optional[float] = None,
        idle_ttl: Optional[float] = None,
        idle_pause: Optional[float] = None,
        name: Optional[str] = None,
        publish: Sequence[int] = ...,
        supervisor: Optional[_Path] = None,
        state_dir: Optional[_Path] = None,
    ) -> LiveSandbox: ...
    def start_from(
        self,
        snapshot: str,
        *,
        ttl: Optional[float] = None,
        idle_ttl: Optional[float] = None,
        name: Optional[str] = None,
        publish: Sequence[int] = ...,
        supervisor: Optional[_Path] = None,
        state_dir: Optional[_Path] = None,
        snapshot_dir: Optional[_Path] = None,
    ) -> LiveSandbox: ...
    def revoke_elevations(self) -> None: ...
    def doctor(self) -> DoctorReport: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def backend(self) -> str: ...
    @property
    def strict(self) -> bool: ...
    @property
    def helper(self) -> Optional[str]: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> bool: ...

class _Transfer(TypedDict):
    files: int
    dirs: int
    bytes: int

class _FileEntry(TypedDict):
    path: str
    name: str
    kind: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int

class _LiveExit(TypedDict):
    pid: int
    exit_code: Optional[int]
    signal: Optional[int]
    timed_out: bool
    stdout: bytes
    stderr: bytes

class _LiveProcess(TypedDict):
    pid: int
    argv: List[str]
    state: Literal["running", "exited"]
    exit_code: Optional[int]
    signal: Optional[int]
    timed_out: bool

class _LiveEntry(TypedDict):
    name: str
    kind: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int

class _PublishedPort(TypedDict):
    host_ip: str
    host_port: int
    guest_port: int

class _SnapshotInfo(TypedDict):
    id: str
    name: str
    backend: str
    source: str
    created_at: int
    carries: List[str]
    not_carried: List[str]
    files: int
    bytes: int

def snapshots(*, snapshot_dir: Optional[_Path] = None) -> List[_SnapshotInfo]: ...
def remove_snapshot(name: str, *, snapshot_dir: Optional[_Path] = None) -> None: ...
@final
class LiveSandbox:
    """A sandbox that stays up for a task (``Sandbox.start``)."""

    @staticmethod
    def attach(id: str) -> LiveSandbox: ...
    def snapshot(
        self, name: Optional[str] = None, *, snapshot_dir: Optional[_Path] = None
    ) -> _SnapshotInfo: ...
    def fork(
        self,
        count: int = 1,
        *,
        ttl: Optional[float] = None,
        idle_ttl: Optional[float] = None,
        snapshot_dir: Optional[_Path] = None,
    ) -> List[LiveSandbox]: ...
    @property
    def id(self) -> str: ...
    @property
    def stopped(self) -> bool: ...
    def info(self) -> Dict[str, Any]: ...
    def exec(
        self,
        argv: _ToolLike,
        *,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Optional[bytes] = None,
    ) -> _LiveExit: ...
    def spawn(
        self,
        argv: _ToolLike,
        *,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: bool = False,
        tty: Optional[Tuple[int, int]] = None,
    ) -> int: ...
    def ps(self) -> List[_LiveProcess]: ...
    def logs(self, pid: int, *, follow: bool = False) -> bytes: ...
    def _follow(
        self, pid: int, on_chunk: Callable[[str, bytes], object]
    ) -> Optional[_LiveExit]: ...
    def wait(self, pid: int) -> _LiveExit: ...
    def kill(self, pid: int, signal: int = 15) -> None: ...
    def write_stdin(self, pid: int, data: bytes) -> None: ...
    def close_stdin(self, pid: int) -> None: ...
    def resize(self, pid: int, rows: int, cols: int) -> None: ...
    def pause(self) -> Literal["freezer", "signals", "vm"]: ...
    def resume(self) -> None: ...
    def publish(
        self,
        guest_port: int,
        *,
        host_port: Optional[int] = None,
        host_ip: Optional[str] = None,
    ) -> _PublishedPort: ...
    def read_file(self, path: str) -> bytes: ...
    def write_file(self, path: str, data: bytes) -> None: ...
    def list_dir(self, path: str) -> List[_LiveEntry]: ...
    def stat(self, path: str) -> _LiveEntry: ...
    def mkdir(self, path: str, *, parents: bool = False) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def remove(self, path: str) -> None: ...
    def upload(self, host_path: _Path, path: str) -> _Transfer: ...
    def download(self, path: str, host_path: _Path) -> _Transfer: ...
    def stop(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> bool: ...

@final
class Session:
    """A sandbox whose files live across calls (``Sandbox.session``)."""

    def run(
        self,
        tool: _ToolLike,
        *,
        timeout: Optional[float] = None,
        on_stdout: Optional[_Callback] = None,
        on_stderr: Optional[_Callback] = None,
        text: bool = True,
        tier: Optional[str] = None,
        risk: Optional[_Risk] = None,
    ) -> RunResult: ...
    def _start(
        self,
        tool: _ToolLike,
        done: Callable[[Optional[RunResult], Optional[BaseException]], object],
        *,
        timeout: Optional[float] = None,
        on_stdout: Optional[_Callback] = None,
        on_stderr: Optional[_Callback] = None,
        text: bool = True,
        tier: Optional[str] = None,
        risk: Optional[str] = None,
    ) -> RunHandle: ...
    def write_file(self, path: str, data: Union[bytes, str]) -> None: ...
    def read_file(self, path: str) -> bytes: ...
    def upload(self, host_path: _Path, path: str) -> _Transfer: ...
    def download(self, path: str, host_path: _Path) -> _Transfer: ...
    def list_files(self, path: str = ".") -> List[_FileEntry]: ...
    def remove(self, path: str) -> None: ...
    def close(self) -> None: ...
    @property
    def id(self) -> str: ...
    @property
    def workdir(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> bool: ...

def packaged_helper(package_dir: _Path) -> Optional[str]: ...
def tier_preset(name: str, home: Optional[_Path] = None) -> Dict[str, Any]: ...
def verify_audit(path: _Path, head: Optional[str] = None) -> Dict[str, Any]: ...
def generate_agent_key() -> str: ...
def agent_public_key(key: str) -> str: ...

@final
class AgentDirectory:
    """The agents one party knows: names, tiers, keys, and whom each may message."""

    def __new__(cls) -> Self: ...
    def define_tier(self, name: str, rank: int) -> None: ...
    def add(
        self,
        name: str,
        tier: str,
        *,
        key: Optional[str] = None,
        public_key: Optional[str] = None,
        may_message: Optional[Sequence[str]] = None,
    ) -> None: ...
    def sign(
        self,
        sender: str,
        to: str,
        kind: str,
        body: Any,
        *,
        tier: Optional[str] = None,
        scheme: Literal["ed25519", "hmac-sha256"] = "ed25519",
    ) -> str: ...
    def verifier(
        self, me: str, *, window: float = 30.0, audit: Optional[Sandbox] = None
    ) -> MessageVerifier: ...

@final
class MessageVerifier:
    """Checks messages addressed to one agent (signature, window, replay, trust rules)."""

    def verify(self, signed: Union[str, Mapping[str, Any]]) -> Dict[str, Any]: ...

@final
class Workspace:
    """A transactional copy of a host directory: runs write to the copy, commit applies."""

    def __new__(cls, source: _Path, *, limit: Optional[_Size] = None) -> Self: ...
    @property
    def source(self) -> str: ...
    @property
    def path(self) -> str: ...
    def diff(self) -> Dict[str, Any]: ...
    def commit(
        self,
        paths: Optional[Sequence[_Path]] = None,
        *,
        accept: Optional[Sequence[_Path]] = None,
        all_or_nothing: bool = False,
        sandbox: Optional[Sandbox] = None,
    ) -> Dict[str, Any]: ...
    def discard(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> bool: ...

def caps_for_call(
    schema: Mapping[str, Any],
    arguments: Any,
    base: _CapsLike = None,
    *,
    tier: Optional[str] = None,
    program: Optional[str] = None,
) -> Tuple[Caps, List[Dict[str, Any]]]: ...
