"""Source stamps: let a fresh clone reuse the compilation in a shared cargo target dir.

See scripts/source-stamps.sh for what each mode does and why it is safe.
Usage: source_stamps.py record|commit|restore   (needs CARGO_TARGET_DIR; run from the repo root)
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

TARGET = Path(os.environ["CARGO_TARGET_DIR"])
RECORD = TARGET / ".strata-source-stamps"
PENDING = TARGET / ".strata-source-stamps.pending"


def stamp_tree() -> dict:
    """path -> (sha256, mtime_ns) of every regular file git tracks or does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    rows = {}
    for raw in sorted(set(listed.split(b"\0"))):
        if not raw or b"\n" in raw or os.path.islink(raw) or not os.path.isfile(raw):
            continue
        with open(raw, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        rows[raw.decode("utf-8", "surrogateescape")] = (digest, os.lstat(raw).st_mtime_ns)
    return rows


def save(rows: dict, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
        for name in sorted(rows):
            digest, mtime = rows[name]
            f.write(f"{digest} {mtime} {name}\n")
    tmp.replace(path)


def load(path: Path) -> dict:
    rows = {}
    for line in open(path, encoding="utf-8", errors="surrogateescape"):
        digest, mtime, name = line.rstrip("\n").split(" ", 2)
        sec, dot, nsec = mtime.partition(".")  # "s.ns" in records of the shell version
        rows[name] = (digest, int(sec) * 10**9 + int(nsec) if dot else int(sec))
    return rows


def record() -> None:
    save(stamp_tree(), PENDING)


def commit() -> None:
    if not PENDING.exists():
        return
    before, after = load(PENDING), stamp_tree()
    PENDING.unlink()
    if before.keys() != after.keys() or any(before[n][0] != after[n][0] for n in before):
        print("note: sources changed during the build; the build is not recorded for reuse")
        RECORD.unlink(missing_ok=True)
        return
    # A file rewritten with the same bytes meanwhile (npm and package-lock.json) keeps its
    # later mtime: later is never less stale. Written now, so later than every build.
    save({n: (after[n][0], max(before[n][1], after[n][1])) for n in after}, RECORD)


def restore() -> None:
    if not RECORD.exists():
        print(f"reuse: no recorded build in {TARGET}")
        return
    record_time = RECORD.stat().st_mtime_ns
    fingerprints = TARGET / "release" / ".fingerprint"
    if fingerprints.is_dir() and any(
        os.lstat(os.path.join(top, name)).st_mtime_ns > record_time
        for top, dirs, files in os.walk(fingerprints)
        for name in dirs + files
    ):
        print(f"reuse: {TARGET} was built after its record; workspace crates rebuild")
        RECORD.unlink()
        return
    try:
        recorded = load(RECORD)
    except ValueError:
        print(f"reuse: {RECORD} is unreadable; workspace crates rebuild")
        RECORD.unlink()
        return
    current = stamp_tree()
    matched = 0
    for name, (digest, _) in current.items():
        was = recorded.get(name)
        if was and was[0] == digest:
            path = name.encode("utf-8", "surrogateescape")
            os.utime(path, ns=(was[1], was[1]), follow_symlinks=False)
            matched += 1
    print(f"reuse: {matched} files as built in {TARGET}, {len(current) - matched} new or changed")


if __name__ == "__main__":
    modes = {"record": record, "commit": commit, "restore": restore}
    if len(sys.argv) != 2 or sys.argv[1] not in modes:
        sys.exit("usage: source-stamps.sh record|commit|restore")
    modes[sys.argv[1]]()
