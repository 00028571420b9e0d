"""PEP 517 build backend of strata-sandbox: maturin, plus the helper binary.

maturin builds only the native module (a cdylib). The process backend also needs the
``strata-helper`` executable, and live sandboxes their supervisor ``strata-live``, so
before maturin builds a wheel this backend runs ``cargo build --release --workspace --bin
NAME`` for each and copies the binaries to ``python/strata/_bin/``, from where the wheel
ships them, executable bit included.

``--workspace`` resolves features exactly as CI's ``cargo build --release --workspace``
does, and the release profile and the workspace target directory are the same, so after
CI's build this step compiles nothing (``-p strata`` alone would resolve a different
feature set and rebuild wasmtime).

Every other hook is maturin's own.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import maturin
from maturin import *  # noqa: F401,F403  (re-export every hook maturin provides)

_PROJECT = Path(__file__).resolve().parent.parent
_BIN_DIR = _PROJECT / "python" / "strata" / "_bin"
# (cargo package, binary) pairs shipped inside the wheel.
_BINARIES = [("strata", "strata-helper"), ("sandbox-live", "strata-live")]


def _cargo() -> str:
    return os.environ.get("CARGO", "cargo")


def _target_dir() -> Path:
    out = subprocess.run(
        [_cargo(), "metadata", "--format-version", "1", "--no-deps"],
        cwd=_PROJECT,
        check=True,
        stdout=subprocess.PIPE,
    ).stdout
    return Path(json.loads(out)["target_directory"])


def _bundle_binaries() -> None:
    for package, binary in _BINARIES:
        print(f"strata: building {binary} of {package} (cargo build --release)", file=sys.stderr)
        subprocess.run(
            [_cargo(), "build", "--release", "--workspace", "--bin", binary],
            cwd=_PROJECT,
            check=True,
            stdout=sys.stderr,
        )
        built = _target_dir() / "release" / binary
        _BIN_DIR.mkdir(parents=True, exist_ok=True)
        dest = _BIN_DIR / binary
        tmp = dest.with_name(f".{binary}.tmp")
        shutil.copyfile(built, tmp)
        mode = stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
        os.chmod(tmp, mode)
        os.replace(tmp, dest)


def build_wheel(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    _bundle_binaries()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    _bundle_binaries()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
