"""The unmodified E2B quickstart (examples/e2b/quickstart.py) against the server."""

import os
import pathlib
import subprocess
import sys


def test_quickstart_runs_unmodified(server):
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "e2b" / "quickstart.py"
    run = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=120,
        env=dict(os.environ),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "hello from the sandbox"
    assert "hello.py" in run.stdout
