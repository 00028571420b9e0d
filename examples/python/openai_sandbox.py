"""The OpenAI Agents SDK's sandbox agents on Strata sessions.

Run: python examples/python/openai_sandbox.py  (needs: pip install ./bindings/python
openai-agents). The model turns come from the SDK's ScriptedModel so the example runs
offline; set OPENAI_API_KEY to use a real model instead.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agents import RunConfig, Runner
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.testing import ScriptedModel, assistant_message, function_call

import strata
from strata.openai_agents import StrataSandboxClient


async def main() -> None:
    # The caps bound every command of every session the client opens; a model cannot
    # widen them.
    client = StrataSandboxClient(sandbox=strata.Sandbox(), caps=strata.Caps(timeout=30))
    if os.environ.get("OPENAI_API_KEY"):
        model = None  # the SDK's default model
    else:
        model = ScriptedModel(
            [
                [
                    function_call(
                        "exec_command",
                        {"cmd": "python3 -c 'print(6 * 7)' | tee answer.txt"},
                        call_id="call-1",
                    )
                ],
                [assistant_message("The answer is 42.")],
            ]
        )
    agent = SandboxAgent(
        name="coder", instructions="Use the shell to compute. Save answers.", model=model
    )
    session = await client.create()
    async with session:
        result = await Runner.run(
            agent, "compute 6*7", run_config=RunConfig(sandbox=SandboxRunConfig(session=session))
        )
        print("agent:", result.final_output)
        print("answer.txt:", (await session.read(Path("answer.txt"))).read().decode().strip())
    await client.delete(session)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
