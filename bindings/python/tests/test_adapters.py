"""The LangChain and OpenAI Agents SDK adapters, with the real packages (no model calls:
the tools are invoked directly)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import strata

langchain_core = pytest.importorskip("langchain_core", reason="langchain-core is a test dependency")
agents = pytest.importorskip("agents", reason="openai-agents is a test dependency")

from agents.tool_context import ToolContext  # noqa: E402
from langchain_core.messages import ToolMessage  # noqa: E402
from langchain_core.tools import BaseTool, ToolException  # noqa: E402

from strata.langchain import StrataCodeTool, StrataCommandTool  # noqa: E402
from strata.openai_agents import code_tool, command_tool  # noqa: E402


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "numbers.txt").write_text("1\n2\n3\n")
    return data


def test_langchain_code_tool_sync_and_async(sb: strata.Sandbox, data_dir: Path) -> None:
    tool = StrataCodeTool(sandbox=sb, caps={"read_only": [(data_dir, "/data")]})
    assert isinstance(tool, BaseTool)
    assert tool.name == "run_code"
    assert "/data (read-only)" in tool.description and "Network: none" in tool.description
    code = "print(sum(int(x) for x in open('/data/numbers.txt')))"
    content = tool.invoke({"code": code})
    assert content == "[exit code 0]\nstdout:\n6\n"
    message = tool.invoke(
        {"type": "tool_call", "id": "call-1", "name": tool.name, "args": {"code": code}}
    )
    assert isinstance(message, ToolMessage)
    assert message.artifact["exit_code"] == 0
    assert message.artifact["receipt"]["backend"] == "process"

    import asyncio

    content = asyncio.run(tool.ainvoke({"code": "import sys; sys.exit('boom')"}))
    assert content.startswith("[exit code 1]") and "boom" in content


def test_langchain_refusals_are_tool_exceptions(sb: strata.Sandbox) -> None:
    tool = StrataCommandTool(sandbox=sb)
    assert tool.invoke({"argv": ["/bin/echo", "hi"]}) == "[exit code 0]\nstdout:\nhi\n"
    with pytest.raises(ToolException, match="refused"):
        tool.invoke({"argv": []})
    handled = StrataCommandTool(sandbox=sb, handle_tool_error=True)
    assert "/no/such" in handled.invoke({"argv": ["/no/such"]})
    timed = StrataCodeTool(sandbox=sb, language="sh", caps=strata.Caps(timeout=0.3))
    assert timed.invoke({"code": "sleep 30"}).startswith("[timed out")
    # Invalid configuration fails when the tool is built (pydantic wraps the ValueError).
    with pytest.raises(ValueError, match="unknown script language"):
        StrataCodeTool(sandbox=sb, language="cobol")
    with pytest.raises(ValueError, match="unknown field `unknown`"):
        StrataCodeTool(sandbox=sb, caps={"unknown": 1})


@pytest.mark.asyncio
async def test_openai_agents_code_tool(sb: strata.Sandbox, data_dir: Path) -> None:
    tool = code_tool(sb, {"read_only": [(data_dir, "/data")]})
    assert isinstance(tool, agents.FunctionTool)
    assert tool.name == "run_code"
    assert tool.params_json_schema["required"] == ["code"]
    assert "/data (read-only)" in tool.description
    args = json.dumps({"code": "print(open('/data/numbers.txt').read().split())"})
    ctx = ToolContext(context=None, tool_name=tool.name, tool_call_id="call-1", tool_arguments=args)
    out = await tool.on_invoke_tool(ctx, args)
    assert out == "[exit code 0]\nstdout:\n['1', '2', '3']\n"


@pytest.mark.asyncio
async def test_openai_agents_command_tool_and_errors(sb: strata.Sandbox) -> None:
    tool = command_tool(sb, strata.Caps(timeout=5))
    assert tool.params_json_schema["properties"]["argv"]["type"] == "array"
    args = json.dumps({"argv": ["/bin/echo", "from", "agent"]})
    ctx = ToolContext(context=None, tool_name=tool.name, tool_call_id="c", tool_arguments=args)
    assert await tool.on_invoke_tool(ctx, args) == "[exit code 0]\nstdout:\nfrom agent\n"
    bad = json.dumps({"argv": ["/no/such/program"]})
    ctx = ToolContext(context=None, tool_name=tool.name, tool_call_id="d", tool_arguments=bad)
    message = await tool.on_invoke_tool(ctx, bad)
    assert message.startswith("The sandbox refused the run (invalid_request): ")
    assert "/no/such/program" in message
    js = code_tool(sb, language="sh", name="run_sh")
    assert js.name == "run_sh"
