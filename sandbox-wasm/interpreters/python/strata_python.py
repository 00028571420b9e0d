"""Strata's Python runner: a wasi:cli/command that behaves like `python3 -c CODE [ARGS]`.

The interpreter state is snapshotted at build time, so at run time we refresh what the
snapshot froze (arguments, environment) from wasi:cli/environment before running the code.
"""

import os
import sys
import traceback

import wit_world
from wit_world import exports
from wit_world.imports import environment, exit as wasi_exit

# This CPython build has no `socket` module. Importing the WASI socket bindings here bundles
# them into the component, so code run with a network grant can use wasi:sockets directly:
# `from wit_world.imports import instance_network, network, tcp_create_socket`.
from wit_world.imports import (  # noqa: F401
    instance_network,
    ip_name_lookup,
    network,
    tcp,
    tcp_create_socket,
    udp,
    udp_create_socket,
)


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def _main(argv):
    os.environ.clear()
    for key, value in environment.get_environment():
        os.environ[key] = value
    cwd = environment.initial_cwd()
    if cwd:
        try:
            os.chdir(cwd)
        except OSError:
            pass
    if len(argv) >= 3 and argv[1] == "-c":
        source, filename, sys.argv = argv[2], "<string>", ["-c"] + argv[3:]
    elif len(argv) >= 2 and argv[1] not in ("-", ""):
        with open(argv[1], "rb") as f:
            source = f.read()
        filename, sys.argv = argv[1], argv[1:]
    else:
        source, filename, sys.argv = sys.stdin.read(), "<stdin>", ["-"] + argv[2:]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": filename}
    code = compile(source, filename, "exec")
    exec(code, namespace)


class Run(exports.Run):
    def run(self) -> None:
        status = 0
        try:
            _main(environment.get_arguments())
        except SystemExit as e:
            if e.code is None:
                status = 0
            elif isinstance(e.code, int):
                status = e.code & 0xFF
            else:
                print(e.code, file=sys.stderr)
                status = 1
        except BaseException:
            traceback.print_exc()
            status = 1
        _flush()
        if status != 0:
            wasi_exit.exit_with_code(status)
