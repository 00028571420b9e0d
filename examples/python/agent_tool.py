#!/usr/bin/env python3
"""An agent-style tool: run model-written Python in a sandbox with a read-only data dir.

No model and no network are needed: the "model" below is a list of programs a model might
write (an honest one, and a few that try things they should not). Each runs through the
tool function an agent framework would call, and the example prints what came back and
the receipt of what the sandbox enforced.

    pip install ./bindings/python
    python examples/python/agent_tool.py
"""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path
from typing import List, Tuple

import strata


def run_python(sandbox: strata.Sandbox, caps: strata.Caps, code: str) -> strata.RunResult:
    """The tool the agent calls: model-written code in, a RunResult out. Caps are fixed by
    the developer; the model only supplies code. A failing program is a result, not an
    exception."""
    return sandbox.run(strata.Tool.script("python", code), caps)


def make_data_dir(root: Path) -> Path:
    data = root / "data"
    data.mkdir()
    (data / "sales.csv").write_text("region,amount\nnorth,120\nsouth,80\nnorth,145\neast,200\n")
    return data


# What a model might write when asked "which region sold most?" (and some mischief).
MODEL_WRITTEN: List[Tuple[str, str]] = [
    (
        "answer the question",
        """
        import csv, collections
        totals = collections.Counter()
        for row in csv.DictReader(open('/data/sales.csv')):
            totals[row['region']] += int(row['amount'])
        region, amount = totals.most_common(1)[0]
        print(f'{region} sold most: {amount}')
        """,
    ),
    (
        "overwrite the data",
        """
        try:
            open('/data/sales.csv', 'a').write('west,999\\n')
            print('appended')
        except OSError as e:
            print('refused:', e.strerror)
        """,
    ),
    (
        "read a host secret",
        """
        import os
        for path in ('/etc/shadow', os.path.expanduser('~/.ssh/id_rsa'), '/root'):
            print(path, 'visible' if os.path.exists(path) else 'not visible')
        print('env:', sorted(os.environ))
        """,
    ),
    (
        "phone home",
        """
        import socket
        try:
            socket.create_connection(('93.184.216.34', 80), timeout=2)
            print('connected')
        except OSError as e:
            print('no network:', e.strerror or e)
        """,
    ),
    ("loop forever", "while True:\n    pass\n"),
]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, strata.Sandbox() as sandbox:
        data = make_data_dir(Path(tmp))
        caps = strata.Caps(read_only=[(data, "/data")], timeout=3, memory="256M")
        first = None
        for title, code in MODEL_WRITTEN:
            result = run_python(sandbox, caps, textwrap.dedent(code))
            first = first or result
            print(f"== model code: {title}")
            if result.timed_out:
                print(f"   timed out after {caps.timeout:g} s; the sandbox was killed")
            else:
                print(f"   exit code {result.exit_code} in {result.duration * 1000:.1f} ms")
            for line in (result.stdout + result.stderr).splitlines()[-6:]:
                print(f"   | {line}")
        assert (data / "sales.csv").read_text().count("\n") == 5, "the data dir is read-only"
        assert first is not None
        print("\n== receipt of the first run")
        print(first.receipt)


if __name__ == "__main__":
    main()
