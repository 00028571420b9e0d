"""Starts `strata serve --e2b` on a free loopback port for the official E2B SDK tests.

The binary: $STRATA_BIN, else target/release/strata in $CARGO_TARGET_DIR (or the
repository's target/). Two API keys: KEY (the SDK's, through the environment) and
OTHER_KEY (another client, for isolation tests).
"""

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

KEY = "strata-e2b-test-key-0001"
OTHER_KEY = "strata-e2b-test-key-0002"


def strata_bin() -> str:
    if os.environ.get("STRATA_BIN"):
        return os.environ["STRATA_BIN"]
    root = pathlib.Path(__file__).resolve().parents[2]
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    path = target / "release" / "strata"
    if not path.exists():
        pytest.fail(f"{path} is missing: build it first (cargo build --release -p sandbox-cli)")
    return str(path)


class Server:
    def __init__(self, process: subprocess.Popen, url: str, snapshots: pathlib.Path):
        self.process = process
        self.url = url
        self.snapshots = snapshots


@pytest.fixture(scope="session")
def server():
    keys = tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False)
    keys.write(f"{KEY}\n{OTHER_KEY}\n")
    keys.close()
    os.chmod(keys.name, 0o600)
    snapshots = tempfile.mkdtemp(prefix="strata-e2b-snapshots-")
    process = subprocess.Popen(
        [strata_bin(), "serve", "--e2b", "127.0.0.1:0", "--api-key-file", keys.name,
         "--max-sandboxes", "8", "--snapshot-dir", snapshots],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http://"):
        process.kill()
        pytest.fail(f"strata serve printed {url!r} instead of its URL")
    os.environ["E2B_API_URL"] = url
    os.environ["E2B_SANDBOX_URL"] = url
    os.environ["E2B_API_KEY"] = KEY
    yield Server(process, url, pathlib.Path(snapshots))
    process.terminate()
    assert process.wait(timeout=30) == 0
    os.unlink(keys.name)
    shutil.rmtree(snapshots)


@pytest.fixture
def sandbox(server):
    from e2b import Sandbox

    sb = Sandbox.create(timeout=120)
    yield sb
    sb.kill()
