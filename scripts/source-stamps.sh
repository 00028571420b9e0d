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
# The work is done by scripts/source_stamps.py.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CARGO_TARGET_DIR:?source-stamps.sh needs CARGO_TARGET_DIR}"
exec python3 scripts/source_stamps.py "$@"
