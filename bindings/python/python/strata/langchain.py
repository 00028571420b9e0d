"""LangChain tools that run model-written code or commands in a Strata sandbox.

Requires ``langchain-core`` (``pip install strata-sandbox[langchain]``)::

    from strata.langchain import StrataCodeTool
    tool = StrataCodeTool(caps=strata.Caps(read_only=["/data"]), language="python")
    tool.invoke({"code": "print(sum(range(10)))"})       # or: await tool.ainvoke(...)

The caps are fixed when the tool is built: the developer decides what the model's code may
touch, the model only supplies code. The tool returns a text summary (status, stdout,
stderr) as content and ``RunResult.to_dict()`` as the artifact (``response_format`` is
``"content_and_artifact"``). A refused run raises ``ToolException`` with the sandbox's
message (set ``handle_tool_error=True`` to hand it to the model instead). ``_arun`` awaits
``Sandbox.arun``, so cancelling the agent's task kills the sandboxed run.
"""

from __future__ import annotations

from typing import Any, Callable, List, Literal, Optional, Type

from langchain_core.tools import BaseTool, ToolException
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

import strata
from strata._agent import as_caps, describe_caps, format_result, tool_for

__all__ = ["CodeInput", "CommandInput", "StrataCodeTool", "StrataCommandTool"]


class CodeInput(BaseModel):
    """Arguments of :class:`StrataCodeTool`."""

    code: str = Field(description="The complete program to run; print what you need to see.")


class CommandInput(BaseModel):
    """Arguments of :class:`StrataCommandTool`."""

    argv: List[str] = Field(
        description='The program and its arguments, e.g. ["ls", "-l", "/data"] (no shell).'
    )


class _StrataTool(BaseTool):
    """Common part: the sandbox, the caps and how results are returned."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    sandbox: Optional[Any] = Field(default=None, exclude=True)
    """The :class:`strata.Sandbox` to run in. Default: ``strata.Sandbox()``."""

    caps: Any = None
    """What a run may touch: a :class:`strata.Caps` or a dict. Default: ``Caps()``."""

    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"

    max_output_chars: Optional[int] = 20_000
    """Characters of stdout and of stderr shown to the model. Default 20000."""

    _sandbox: Any = PrivateAttr(default=None)
    _caps: Any = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        self._caps = as_caps(self.caps)
        self._sandbox = self.sandbox if self.sandbox is not None else strata.Sandbox()

    def _result(self, result: strata.RunResult) -> Any:
        content = format_result(result, self.max_output_chars)
        if self.response_format == "content_and_artifact":
            return content, result.to_dict()
        return content

    def _execute(self, make_tool: Callable[[], strata.Tool]) -> Any:
        try:
            return self._result(self._sandbox.run(make_tool(), self._caps))
        except strata.SandboxError as e:
            raise ToolException(f"the sandbox refused or failed the run: {e}") from e

    async def _aexecute(self, make_tool: Callable[[], strata.Tool]) -> Any:
        try:
            return self._result(await self._sandbox.arun(make_tool(), self._caps))
        except strata.SandboxError as e:
            raise ToolException(f"the sandbox refused or failed the run: {e}") from e


class StrataCodeTool(_StrataTool):
    """Runs model-written code (``language``: ``"python"`` by default, ``"javascript"`` or
    ``"sh"``) in a sandbox with the given caps."""

    name: str = "run_code"
    description: str = ""
    args_schema: Type[BaseModel] = CodeInput
    language: str = "python"

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        tool_for(self.language, "")  # validates the language now, not at the first call
        if not self.description:
            self.description = (
                f"Runs a {self.language} program in an isolated sandbox and returns its "
                f"exit status, stdout and stderr. {describe_caps(self._caps)}"
            )

    def _run(self, code: str, **_: Any) -> Any:
        return self._execute(lambda: tool_for(self.language, code))

    async def _arun(self, code: str, **_: Any) -> Any:
        return await self._aexecute(lambda: tool_for(self.language, code))


class StrataCommandTool(_StrataTool):
    """Runs a model-chosen command (an argv, never a shell string) in a sandbox with the
    given caps."""

    name: str = "run_command"
    description: str = ""
    args_schema: Type[BaseModel] = CommandInput

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        if not self.description:
            self.description = (
                "Runs a program with arguments (no shell) in an isolated sandbox and returns "
                f"its exit status, stdout and stderr. {describe_caps(self._caps)}"
            )

    def _run(self, argv: List[str], **_: Any) -> Any:
        return self._execute(lambda: strata.Tool.command(argv))

    async def _arun(self, argv: List[str], **_: Any) -> Any:
        return await self._aexecute(lambda: strata.Tool.command(argv))


