"""Helpers shared by the framework adapters: how a run is shown to a model."""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

from strata._strata import Caps, RunResult, Tool

#: Languages a code tool accepts: a script language, or ``"command"`` for an argv.
LANGUAGES = ("python", "javascript", "sh")


def tool_for(language: str, code: str) -> Tool:
    """The Tool running ``code`` in ``language`` (``"python"``, ``"javascript"``, ``"sh"``)."""
    return Tool.script(language, code)


def as_caps(caps: Union[Caps, Dict[str, Any], None]) -> Caps:
    """``caps`` as a Caps object (validated once, when the adapter is built)."""
    if isinstance(caps, Caps):
        return caps
    return Caps(caps)


def describe_caps(caps: Caps) -> str:
    """One line telling a model what a sandboxed run may touch."""
    mounts = caps.mounts
    if mounts:
        files = ", ".join(
            f"{m['guest']} ({'read-only' if m['access'] == 'ro' else 'read-write'})" for m in mounts
        )
    else:
        files = "none besides a private scratch /tmp"
    net = "none" if caps.net == "none" else caps.net
    return f"Files: {files}. Network: {net}. Time limit: {caps.timeout:g} s."


def format_result(result: RunResult, max_chars: Optional[int] = 20_000) -> str:
    """The result as text for a model: status line, stdout and stderr (each cut to
    ``max_chars`` characters, default 20000; ``None`` keeps everything)."""

    def cut(text: str) -> str:
        if max_chars is not None and len(text) > max_chars:
            return text[:max_chars] + f"\n[... {len(text) - max_chars} more characters]"
        return text

    if result.timed_out:
        status = "timed out (killed by the time limit)"
    elif result.limit is not None:
        status = f"killed by the {result.limit} limit"
    elif result.exit_code is not None:
        status = f"exit code {result.exit_code}"
    else:
        status = result.status
    parts = [f"[{status}]"]
    if result.stdout:
        parts.append("stdout:\n" + cut(result.stdout))
        if result.stdout_truncated:
            parts.append("[stdout was cut at the output limit]")
    if result.stderr:
        parts.append("stderr:\n" + cut(result.stderr))
        if result.stderr_truncated:
            parts.append("[stderr was cut at the output limit]")
    if not result.stdout and not result.stderr:
        parts.append("(no output)")
    return "\n".join(parts)
