"""A terminal through the official SDK: input, output, resize, kill."""

import time

from e2b import PtySize


def read_until(events, output: bytearray, wanted: bytes, seconds: float = 15) -> bool:
    deadline = time.time() + seconds
    for _, _, pty in events:
        if pty:
            output += pty
        if wanted in output or time.time() > deadline:
            break
    return wanted in output


def test_pty_input_resize_kill(sandbox):
    output = bytearray()
    term = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    events = iter(term)
    sandbox.pty.send_stdin(term.pid, b"stty size; echo marker-$((6*7))\n")
    assert read_until(events, output, b"marker-42"), output
    assert b"24 80" in output
    sandbox.pty.resize(term.pid, PtySize(rows=40, cols=100))
    sandbox.pty.send_stdin(term.pid, b"stty size\n")
    assert read_until(events, output, b"40 100"), output
    assert sandbox.pty.kill(term.pid)
    deadline = time.time() + 10
    while term.pid in [p.pid for p in sandbox.commands.list()] and time.time() < deadline:
        time.sleep(0.1)
    assert term.pid not in [p.pid for p in sandbox.commands.list()]
