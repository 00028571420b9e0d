"""`strata mcp` from the official MCP Python SDK: a model's tools, sandboxed.

Run: python examples/python/mcp_client.py [path/to/strata]
(needs: pip install mcp; the `strata` binary from `cargo build --release -p sandbox-cli`).
Any MCP client (Claude Desktop, Cursor, an agent framework) is configured the same way:
command `strata`, args `["mcp", "--profile", "agent.toml"]`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

from mcp import Client, StdioServerParameters

PROFILE = """
backend = "process"
[caps]
limits = { timeout_ms = 10000, memory = "256M" }
[session]
workdir = "/workspace"
max_open = 4
"""


async def main(strata_bin: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "agent.toml"
        profile.write_text(PROFILE)
        server = StdioServerParameters(command=strata_bin, args=["mcp", "--profile", str(profile)])
        async with Client(server) as client:
            tools = await client.list_tools()
            for tool in tools.tools:
                hints = tool.annotations
                print(f"tool {tool.name}: read-only={hints.read_only_hint if hints else None}")
            ran = await client.call_tool("run", {"code": "print(6 * 7)", "language": "python"})
            print("run:", json.loads(ran.content[0].text)["stdout"].strip())
            opened = await client.call_tool("session_open", {})
            sid = json.loads(opened.content[0].text)["session_id"]
            await client.call_tool(
                "session_write_file", {"session_id": sid, "path": "x.txt", "content": "persisted"}
            )
            again = await client.call_tool(
                "session_run", {"session_id": sid, "argv": ["cat", "x.txt"]}
            )
            print("session_run:", json.loads(again.content[0].text)["stdout"])
            failed = await client.call_tool("run", {"argv": ["cat", "/etc/shadow"]})
            print("a failing run is an isError result:", failed.is_error)
            await client.call_tool("session_close", {"session_id": sid})


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "strata"))
