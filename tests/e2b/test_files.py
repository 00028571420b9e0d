"""Files through the official SDK: read/write text and bytes, list, info, dirs, watch."""

import time

import httpx
import pytest
from e2b import FileType, Sandbox
from e2b.exceptions import NotFoundException


def test_write_read_text_and_bytes(sandbox):
    info = sandbox.files.write("notes/a.txt", "héllo")
    assert info.path == "/home/user/notes/a.txt"
    assert sandbox.files.read("notes/a.txt") == "héllo"
    data = bytes(range(256)) * 64
    sandbox.files.write("/tmp/blob.bin", data)
    assert sandbox.files.read("/tmp/blob.bin", format="bytes") == data
    assert sandbox.commands.run("wc -c < /tmp/blob.bin").stdout.strip() == str(len(data))


def test_gzip_both_ways(sandbox):
    sandbox.files.write("/tmp/z.txt", "zipped " * 1000, gzip=True)
    assert sandbox.files.read("/tmp/z.txt", gzip=True) == "zipped " * 1000


def test_write_many(sandbox):
    written = sandbox.files.write_files(
        [{"path": "/tmp/m/one", "data": "1"}, {"path": "/tmp/m/two", "data": b"2"}]
    )
    assert sorted(w.path for w in written) == ["/tmp/m/one", "/tmp/m/two"]
    assert sandbox.commands.run("cat /tmp/m/one /tmp/m/two").stdout == "12"


def test_list_exists_info(sandbox):
    sandbox.files.write("/tmp/l/sub/deep.txt", "x")
    top = sandbox.files.list("/tmp/l")
    assert [(e.name, e.type) for e in top] == [("sub", FileType.DIR)]
    deep = sandbox.files.list("/tmp/l", depth=2)
    assert sorted(e.path for e in deep) == ["/tmp/l/sub", "/tmp/l/sub/deep.txt"]
    assert sandbox.files.exists("/tmp/l/sub/deep.txt")
    assert not sandbox.files.exists("/tmp/l/nope")
    info = sandbox.files.get_info("/tmp/l/sub/deep.txt")
    assert (info.size, info.type, info.permissions) == (1, FileType.FILE, "-rw-r--r--")
    with pytest.raises(NotFoundException):
        sandbox.files.get_info("/tmp/l/nope")
    with pytest.raises(NotFoundException):
        sandbox.files.read("/tmp/l/nope")


def test_make_dir_rename_remove(sandbox):
    assert sandbox.files.make_dir("/tmp/d/e")
    assert not sandbox.files.make_dir("/tmp/d/e")  # ALREADY_EXISTS, read as False
    sandbox.files.write("/tmp/d/e/f.txt", "f")
    moved = sandbox.files.rename("/tmp/d/e/f.txt", "/tmp/d/g.txt")
    assert moved.path == "/tmp/d/g.txt"
    assert sandbox.files.read("/tmp/d/g.txt") == "f"
    sandbox.files.remove("/tmp/d")
    assert not sandbox.files.exists("/tmp/d")
    # Across the sandbox's directory trees (its home and /tmp).
    sandbox.files.write("home.txt", "h")
    assert sandbox.files.rename("home.txt", "/tmp/home.txt").path == "/tmp/home.txt"
    assert sandbox.files.read("/tmp/home.txt") == "h"
    assert not sandbox.files.exists("home.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.rename("/tmp/d", "/tmp/x")


def test_watch_dir_sees_changes(sandbox):
    sandbox.files.make_dir("/tmp/w")
    watch = sandbox.files.watch_dir("/tmp/w")
    sandbox.files.write("/tmp/w/new.txt", "1")
    sandbox.commands.run("rm /tmp/w/new.txt")
    events = []
    deadline = time.time() + 10
    while time.time() < deadline and not any(e.type.name == "REMOVE" for e in events):
        events += watch.get_new_events()
        time.sleep(0.1)
    watch.stop()
    assert {e.name for e in events} == {"new.txt"}
    kinds = [e.type.name for e in events]
    assert "CREATE" in kinds and "REMOVE" in kinds


def test_signed_urls_of_a_secure_sandbox(server):
    sb = Sandbox.create(secure=True)
    try:
        sb.files.write("/tmp/signed.txt", "signed")
        url = sb.download_url("/tmp/signed.txt", use_signature_expiration=60)
        assert "signature=" in url
        assert httpx.get(url).text == "signed"
        upload = sb.upload_url("/tmp/up.txt", use_signature_expiration=60)
        assert httpx.post(upload, files={"file": ("up.txt", b"up")}).status_code == 200
        assert sb.files.read("/tmp/up.txt") == "up"
        forged = url.replace("signed.txt", "other.txt")
        assert httpx.get(forged).status_code == 401
    finally:
        sb.kill()
