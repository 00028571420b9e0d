"""Smoke runs of the official SDK against `strata serve --e2b` on the container backend
(the test image, with bash and python3, as the base template) and the microVM backend
(QEMU; TCG here, so a boot takes seconds): create, commands, files, a background process,
pause and resume, kill. The process backend is the rest of this suite."""

import os
import pathlib
import subprocess
import tempfile

from e2b import Sandbox

from conftest import KEY, strata_bin

ROOT = pathlib.Path(__file__).resolve().parents[2]


def built(script: str) -> None:
    done = subprocess.run([str(ROOT / "scripts" / script)], capture_output=True, text=True)
    assert done.returncode == 0, f"{script}: {done.stderr}"


def serve(*extra: str):
    snapshots = tempfile.mkdtemp(prefix="strata-e2b-backend-")
    process = subprocess.Popen(
        [strata_bin(), "serve", "--e2b", "127.0.0.1:0", "--api-key", KEY,
         "--snapshot-dir", snapshots, *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    assert url.startswith("http://"), f"strata serve printed {url!r}"
    return process, url


def smoke(url: str, expect_backend_root: str) -> None:
    config = {"api_key": KEY, "api_url": url, "sandbox_url": url}
    sb = Sandbox.create(timeout=120, **config)
    try:
        result = sb.commands.run("echo hi; pwd; python3 -c 'print(6*7)'; echo $0")
        assert result.stdout == "hi\n/home/user\n42\n/bin/bash\n", result
        sb.files.write("/home/user/a.txt", "hello")
        assert sb.files.read("/home/user/a.txt") == "hello"
        assert "a.txt" in [e.name for e in sb.files.list("/home/user")]
        handle = sb.commands.run("sleep 60", background=True)
        assert handle.pid in [p.pid for p in sb.commands.list()]
        handle.kill()
        sb.pause()
        sb.connect()
        marker = sb.commands.run(f"test -e {expect_backend_root} && echo yes").stdout
        assert marker == "yes\n"
    finally:
        assert sb.kill()
    assert not sb.is_running()


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    assert process.wait(timeout=60) == 0


def test_the_sdk_drives_the_container_backend():
    built("build-test-images.sh")
    images = pathlib.Path(os.environ.get("STRATA_TEST_IMAGES", ROOT / ".ci/cache/images"))
    profile = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    profile.write(f'[caps.container]\nimage = "{images / "python-oci"}"\n')
    profile.close()
    process, url = serve("--backend", "container", "--profile", profile.name)
    try:
        # The test image's own file: commands run in the image, not on the host.
        smoke(url, "/etc/hostname && grep -qx strata-test /etc/hostname")
    finally:
        stop(process)
        os.unlink(profile.name)


def test_an_image_without_the_container_backend_is_refused():
    profile = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    profile.write('[caps.container]\nimage = "/nonexistent"\n')
    profile.close()
    try:
        done = subprocess.run(
            [strata_bin(), "serve", "--e2b", "127.0.0.1:0", "--api-key", KEY,
             "--profile", profile.name],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 2
        assert "--backend container" in done.stderr
    finally:
        os.unlink(profile.name)


def test_the_sdk_drives_the_microvm_backend():
    # Builds the guest (and installs QEMU as root); fails loudly where it cannot.
    built("build-vm-guest.sh")
    process, url = serve("--backend", "microvm")
    try:
        # The guest's kernel is its own: the VM's root has the guest agent's tools disk.
        smoke(url, "/run/strata/tools")
    finally:
        stop(process)


def test_a_template_names_a_profile_and_its_image():
    built("build-test-images.sh")
    images = pathlib.Path(os.environ.get("STRATA_TEST_IMAGES", ROOT / ".ci/cache/images"))
    profile = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    profile.write(
        f'[caps.container]\nimage = "{images / "python-oci"}"\n[caps.env]\nFROM_TEMPLATE = "py"\n'
    )
    profile.close()
    process, url = serve("--template", f"py={profile.name}")
    config = {"api_key": KEY, "api_url": url, "sandbox_url": url}
    try:
        in_image = Sandbox.create("py", timeout=60, **config)
        on_host = Sandbox.create(timeout=60, **config)
        try:
            assert in_image.get_info().template_id == "py"
            hostname = "cat /etc/hostname; echo $FROM_TEMPLATE; pwd"
            assert in_image.commands.run(hostname).stdout == "strata-test\npy\n/home/user\n"
            assert on_host.commands.run("echo $FROM_TEMPLATE").stdout == "\n"
        finally:
            in_image.kill()
            on_host.kill()
        from e2b.exceptions import SandboxException
        import pytest

        with pytest.raises(SandboxException, match="not found"):
            Sandbox.create("no-such-template", **config)
    finally:
        stop(process)
        os.unlink(profile.name)


def test_a_bad_template_flag_is_refused_before_serving():
    for flag, needle in [("noequals", "NAME=PROFILE"), ("Bad=x.toml", "a name of"),
                         ("base=x.toml", "given twice")]:
        done = subprocess.run(
            [strata_bin(), "serve", "--e2b", "127.0.0.1:0", "--api-key", KEY,
             "--template", flag],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 2, (flag, done.stderr)
        assert needle in done.stderr, (flag, done.stderr)
