#!/usr/bin/env bash
# Lets a fresh clone reuse the compilation in a shared cargo target dir, never its sources.
#
# Cargo decides that a workspace crate is stale when one of its source files is newer than
# its last build. A fresh clone's files are all new, so every workspace crate would be
# rebuilt, even when the shared target dir already holds a build of exactly these sources.
# This script keeps, next to that build, each source file's content hash and mtime as the
# build saw them:
#
#   source-stamps.sh record   hashes the tree (tracked and untracked, not ignored) into a
#                             pending record; call it before building.
#   source-stamps.sh commit   after the builds: keeps the pending record as the target
#                             dir's, if every file still has the same content (nothing was
#                             edited meanwhile), with the later of each file's two mtimes.
#   source-stamps.sh restore  in a new clone: gives every file whose content matches the
#                             record the mtime it had there, so cargo judges each artifact
#                             exactly as it did in that tree (what was built from this
#                             content is reused; what was stale there is stale here). A file
#                             that differs keeps its new mtime and its crate is rebuilt.
#
# The record is trusted only while the target dir holds no build newer than it: a build
# outside this script (a developer's `cargo build` after editing) makes it void, and the
# clone then rebuilds its workspace crates as cargo would anyway. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CARGO_TARGET_DIR:?source-stamps.sh needs CARGO_TARGET_DIR}"
record="$CARGO_TARGET_DIR/.strata-source-stamps"
pending="$record.pending"

# One line per file: sha256, mtime (s.ns), path. NUL-separated paths in, sorted lines out.
stamp_tree() {
  git ls-files -z --cached --others --exclude-standard | python3 -c '
import hashlib, os, sys
for raw in sorted(sys.stdin.buffer.read().split(b"\0")):
    if not raw or b"\n" in raw:
        continue
    try:
        st = os.lstat(raw)
    except FileNotFoundError:
        continue
    if not os.path.isfile(raw) or os.path.islink(raw):
        continue
    with open(raw, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    print(digest, f"{st.st_mtime_ns // 10**9}.{st.st_mtime_ns % 10**9:09d}", raw.decode("utf-8", "surrogateescape"))
'
}

case "${1:-}" in
  record)
    stamp_tree >"$pending.tmp"
    mv "$pending.tmp" "$pending"
    ;;
  commit)
    [ -f "$pending" ] || exit 0
    stamp_tree >"$pending.now"
    # Same files, same contents: keep the later mtime of each (a file rewritten with the
    # same bytes meanwhile, as npm does to package-lock.json; later is never less stale).
    if python3 - "$pending" "$pending.now" >"$pending.merged" <<'PY'
import sys
def load(path):
    rows = {}
    for line in open(path, encoding="utf-8", errors="surrogateescape"):
        digest, mtime, name = line.rstrip("\n").split(" ", 2)
        rows[name] = (digest, mtime)
    return rows
before, after = load(sys.argv[1]), load(sys.argv[2])
if before.keys() != after.keys() or any(before[n][0] != after[n][0] for n in before):
    sys.exit(1)
for name in sorted(after):
    later = max(before[name][1], after[name][1], key=lambda m: tuple(map(int, m.split("."))))
    print(after[name][0], later, name)
PY
    then
      rm -f "$pending.now" "$pending"
      mv "$pending.merged" "$record"  # written now: later than every build it covers
    else
      echo "note: sources changed during the build; the build is not recorded for reuse"
      rm -f "$pending" "$pending.now" "$pending.merged" "$record"
    fi
    ;;
  restore)
    [ -f "$record" ] || { echo "reuse: no recorded build in $CARGO_TARGET_DIR"; exit 0; }
    fingerprints="$CARGO_TARGET_DIR/release/.fingerprint"
    if [ -d "$fingerprints" ] && [ -n "$(find "$fingerprints" -newer "$record" -print -quit)" ]; then
      echo "reuse: $CARGO_TARGET_DIR was built after its record; workspace crates rebuild"
      rm -f "$record"
      exit 0
    fi
    current=$(mktemp)
    trap 'rm -f "$current"' EXIT
    stamp_tree >"$current"
    python3 - "$record" "$current" <<'PY'
import os, sys
def load(path):
    out = {}
    for line in open(path, encoding="utf-8", errors="surrogateescape"):
        digest, mtime, name = line.rstrip("\n").split(" ", 2)
        out[name] = (digest, mtime)
    return out
recorded, current = load(sys.argv[1]), load(sys.argv[2])
matched = 0
for name, (digest, _) in current.items():
    was = recorded.get(name)
    if was and was[0] == digest:
        sec, nsec = was[1].split(".")
        ns = int(sec) * 10**9 + int(nsec)
        os.utime(name.encode("utf-8", "surrogateescape"), ns=(ns, ns), follow_symlinks=False)
        matched += 1
print(f"reuse: {matched} files as built in {os.environ['CARGO_TARGET_DIR']}, "
      f"{len(current) - matched} new or changed")
PY
    ;;
  *)
    echo "usage: $0 record|commit|restore" >&2
    exit 2
    ;;
esac
