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
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from agents import FunctionTool, RunContextWrapper, function_tool

import strata
from strata._agent import as_caps, describe_caps, format_result, tool_for

__all__ = ["code_tool", "command_tool", "report_failure"]


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
