"""A session: a sandbox whose files live across calls (sync and asyncio).

Run: python examples/python/sessions.py   (after: pip install ./bindings/python)
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import strata

PY = "/usr/bin/python3"


def sync_session(sb: strata.Sandbox, project: Path, out: Path) -> None:
    # Caps as for any run: no host files, no network, limits on everything.
    with sb.session(strata.Caps(timeout=20, memory="256M")) as s:
        print(f"session {s.id[:4]}... workdir {s.workdir}")
        copied = s.upload(project, "project")  # a whole directory, checked first
        print(f"uploaded {copied['files']} files, {copied['bytes']} bytes")
        # Each call is one sandbox run; its processes end with it, its files stay.
        r = s.run([PY, "project/stats.py", "project/data.csv"])
        print("call 1:", r.stdout.strip())
        r = s.run(["/bin/sh", "-c", "ls report; wc -l < report/summary.txt"])
        print("call 2 sees call 1's files:", " ".join(r.stdout.split()))
        # A per-call timeout; 0 would mean none.
        r = s.run(["sleep", "5"], timeout=1)
        print("call 3 timed out:", r.timed_out)
        s.download("report", out / "report")  # never overwrites; no symlinks followed
        print("downloaded:", (out / "report" / "summary.txt").read_text().strip())
    print("closed; the session's directory is gone:", s.closed)


async def async_session(sb: strata.Sandbox) -> None:
    async with sb.asession() as s:
        await s.write_file("hello.py", "print('hello from an async session')")
        r = await s.run([PY, "hello.py"])
        print("async:", r.stdout.strip())


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        (project / "data.csv").write_text("region,sales\nnorth,120\nsouth,80\nnorth,145\n")
        (project / "stats.py").write_text(
            "import csv, os, sys\n"
            "rows = list(csv.DictReader(open(sys.argv[1])))\n"
            "total = sum(int(r['sales']) for r in rows)\n"
            "os.makedirs('report', exist_ok=True)\n"
            "open('report/summary.txt', 'w').write(f'rows {len(rows)}\\ntotal {total}\\n')\n"
            "print('total', total)\n"
        )
        with strata.Sandbox() as sb:
            sync_session(sb, project, Path(tmp))
            asyncio.run(async_session(sb))


if __name__ == "__main__":
    main()
