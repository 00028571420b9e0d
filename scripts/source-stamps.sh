#!/usr/bin/env bash
# Lets a fresh clone reuse the compilation in a shared cargo target dir, never its sources.
#
# Cargo decides that a workspace crate is stale when one of its source files is newer than
# its last build. A fresh clone's files are all new, so every workspace crate would be
# rebuilt, even when the shared target dir already holds a build of exactly these sources.
# This script keeps, next to that build, the content hash of every source file it was made
# from:
#
#   source-stamps.sh record   hashes the tree (tracked and untracked, not ignored) into a
#                             pending record; call it before building.
#   source-stamps.sh commit   after a build: keeps the pending record as the build's, if the
#                             tree still hashes the same (nothing was edited meanwhile).
#   source-stamps.sh restore  in a new clone: gives every file whose content matches the
#                             build's record an old mtime, so cargo reuses what was built
#                             from it. A file that differs keeps its new mtime and is rebuilt.
#
# The record is trusted only while the target dir holds no build newer than it: a build
# outside this script (a developer's `cargo build` after editing) makes it void, and the
# clone then rebuilds its workspace crates as cargo would anyway. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CARGO_TARGET_DIR:?source-stamps.sh needs CARGO_TARGET_DIR}"
record="$CARGO_TARGET_DIR/.strata-source-stamps"
pending="$record.pending"

hash_tree() {
  git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
    | xargs -0 -r sha256sum
}

case "${1:-}" in
  record)
    hash_tree >"$pending.tmp"
    mv "$pending.tmp" "$pending"
    ;;
  commit)
    [ -f "$pending" ] || exit 0
    hash_tree >"$pending.now"
    if cmp -s "$pending.now" "$pending"; then
      rm -f "$pending.now"
      mv "$pending" "$record"
      touch "$record"  # later than every build it covers
    else
      echo "note: sources changed during the build; the build is not recorded for reuse"
      rm -f "$pending" "$pending.now" "$record"
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
    # Older than any build: cargo takes a file older than its last build as built.
    old=946684800  # 2000-01-01
    matched=0 changed=0
    current=$(mktemp)
    trap 'rm -f "$current"' EXIT
    hash_tree >"$current"
    # Lines present in both (same hash, same path) are files the build was made from.
    while IFS= read -r -d '' f; do
      touch -h -d "@$old" -- "$f"
      matched=$((matched + 1))
    done < <(comm -12 <(sort "$record") <(sort "$current") | cut -c67- | tr '\n' '\0')
    changed=$(($(wc -l <"$current") - matched))
    echo "reuse: $matched files as built in $CARGO_TARGET_DIR, $changed new or changed"
    ;;
  *)
    echo "usage: $0 record|commit|restore" >&2
    exit 2
    ;;
esac
