"""LangChain Deep Agents on a Strata session: the agent's shell and files are sandboxed.

Run: python examples/python/deepagents_backend.py
(needs: pip install ./bindings/python deepagents). Without a model this drives the backend
the way an agent's tools do; set STRATA_EXAMPLE_MODEL (e.g. "openai:gpt-5.1", with its API
key in the environment) to let a real Deep Agent use it.
"""

from __future__ import annotations

import os

import strata
from strata.deepagents import StrataBackend


def main() -> None:
    with strata.Sandbox() as sb, sb.session(strata.Caps(timeout=30)) as session:
        backend = StrataBackend(session)
        print("backend id:", backend.id)
        up = backend.upload_files([("/workspace/app/main.py", b"print(sum(range(101)))\n")])
        print("upload error:", up[0].error)
        r = backend.execute("python3 app/main.py")
        print("execute:", r.output.strip(), "exit", r.exit_code)
        r = backend.execute("sleep 10", timeout=1)
        print("timed out call: exit", r.exit_code)
        down = backend.download_files(["/workspace/app/main.py", "/etc/passwd", "/workspace/nope"])
        print("downloads:", [(d.path, d.error) for d in down])
        listed = backend.ls("/workspace/app")
        print("ls:", [e["path"] for e in listed.entries or []])

        model = os.environ.get("STRATA_EXAMPLE_MODEL")
        if model:
            from deepagents import create_deep_agent

            agent = create_deep_agent(model=model, backend=backend)
            result = agent.invoke(
                {"messages": [{"role": "user", "content": "Run app/main.py and tell me the output."}]}
            )
            print("agent:", result["messages"][-1].content)


if __name__ == "__main__":
    main()
