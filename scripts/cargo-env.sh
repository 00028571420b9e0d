# Sourced (not run) by scripts/test.sh and the benchmark scripts: the one cargo setup every
# build of theirs shares, so each reuses the others' artifacts.
#
# - CARGO_TARGET_DIR: the target dir shared by every clone on the machine
#   ($STRATA_TARGET_DIR, default ~/.cache/strata/target), or the clone's own target/ when
#   that cannot be made.
# - Clippy (warnings as errors) as the compiler of the workspace's own crates: what
#   `cargo clippy -- -D warnings` checks in a separate pass, done during the build itself
#   (its driver is rustc plus the lints; dependencies are compiled by rustc). The wrapper is
#   part of each workspace crate's build hash, so every build that shares artifacts sets it.
#
# Expects `root` (the repository) to be set; exits 1 without clippy-driver.
strata_target="${STRATA_TARGET_DIR:-$HOME/.cache/strata/target}"
if mkdir -p "$strata_target" 2>/dev/null && [ -w "$strata_target" ]; then
  export CARGO_TARGET_DIR="$strata_target"
else
  echo "note: $strata_target is not writable; building in $root/target"
  export CARGO_TARGET_DIR="$root/target"
fi
export CARGO_TERM_COLOR=never
clippy_driver="$(dirname "$(rustup which cargo 2>/dev/null || command -v cargo)")/clippy-driver"
if [ ! -x "$clippy_driver" ]; then
  echo "clippy-driver is missing next to cargo: rustup component add clippy" >&2
  exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
# cargo-clippy's encoding of `-- -D warnings` for its driver.
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
