"""Commands through the official SDK: foreground, background, stdin, signals, env, cwd."""

import time

import pytest
from e2b.exceptions import TimeoutException
from e2b.sandbox.commands.command_handle import CommandExitException


def test_foreground_output_and_exit_code(sandbox):
    result = sandbox.commands.run("echo out; echo err >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 0)
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo bad >&2; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stderr == "bad\n"


def test_streams_reach_the_callbacks(sandbox):
    seen = []
    sandbox.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=seen.append)
    assert "".join(seen) == "1\n2\n3\n"


def test_env_and_cwd_are_per_command(sandbox):
    result = sandbox.commands.run("echo $ONLY_HERE; pwd", envs={"ONLY_HERE": "x"}, cwd="/tmp")
    assert result.stdout == "x\n/tmp\n"
    later = sandbox.commands.run("echo \"[$ONLY_HERE]\"; pwd")
    assert later.stdout == "[]\n/home/user\n"


def test_users_user_and_root(sandbox):
    assert sandbox.commands.run("echo $HOME", user="user").stdout == "/home/user\n"
    assert sandbox.commands.run("true", user="root").exit_code == 0


def test_background_list_kill(sandbox):
    handle = sandbox.commands.run("sleep 60", background=True)
    assert handle.pid in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(handle.pid)
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]
    assert not sandbox.commands.kill(handle.pid)  # gone: NOT_FOUND, read as False


def test_stdin_send_and_close(sandbox):
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "hello\n")
    handle.close_stdin()
    result = handle.wait()
    assert result.stdout == "hello\n"


def test_connect_follows_a_running_command(sandbox):
    handle = sandbox.commands.run("sleep 1; echo late", background=True)
    handle.disconnect()
    again = sandbox.commands.connect(handle.pid)
    assert again.wait().stdout.endswith("late\n")


def test_timeout_kills_the_command(sandbox):
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    # The stream's deadline is the process's: the supervisor kills it then.
    deadline = time.time() + 10
    while sandbox.commands.list() and time.time() < deadline:
        time.sleep(0.1)
    assert sandbox.commands.list() == []


def test_a_missing_program_fails_with_its_code(sandbox):
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("no-such-program-here")
    assert failed.value.exit_code == 127
