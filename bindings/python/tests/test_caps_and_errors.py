"""Caps conversion, bad input (the right exception, and nothing runs), and the exception
hierarchy."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict

import pytest

import strata
from conftest import PY


def test_defaults_are_deny_by_default() -> None:
    caps = strata.Caps()
    table = {
        "mounts": [],
        "env": {},
        "net": "none",
        "timeout": 30.0,
        "cpu_time": 30.0,
        "memory": 512 << 20,
        "processes": 128,
        "output": 1 << 20,
        "file_size": 64 << 20,
        "open_files": 1024,
        "disk": 64 << 20,
        "address_space": None,
        "egress_bytes": 1 << 30,
        "egress_connections": 1024,
        "stdin": b"",
        "workdir": None,
        "system": "runtime",
        "protect_host_executed": True,
    }
    for name, expected in table.items():
        assert getattr(caps, name) == expected, name
    assert repr(caps) == "Caps()"
    assert caps == strata.Caps(None) == strata.Caps({})


def test_keyword_dict_and_schema_forms_agree(tmp_path: Path) -> None:
    kwargs: Dict[str, Any] = dict(
        read_only=[str(tmp_path)],
        read_write=[(tmp_path / "out", "/out")],
        env={"A": "1"},
        net=["example.com:443"],
        timeout=2.5,
        cpu_time=1,
        memory="256M",
        processes=16,
        output=4096,
        file_size="1M",
        open_files=64,
        disk="16M",
        address_space="2G",
        stdin="in",
        workdir="/out",
        system="runtime",
    )
    caps = strata.Caps(**kwargs)
    assert strata.Caps(kwargs) == caps
    assert strata.Caps(caps.to_dict()) == caps, "to_dict() is accepted back"
    assert strata.Caps.from_json(caps.to_json()) == caps
    assert eval(repr(caps), {"Caps": strata.Caps}) == caps
    assert caps.mounts == [
        {"host": str(tmp_path), "guest": str(tmp_path), "access": "ro"},
        {"host": str(tmp_path / "out"), "guest": "/out", "access": "rw"},
    ]
    assert caps.net == "allow:example.com:443"
    assert (caps.timeout, caps.cpu_time, caps.memory) == (2.5, 1.0, 256 << 20)
    assert (caps.processes, caps.output, caps.file_size) == (16, 4096, 1 << 20)
    assert (caps.open_files, caps.disk, caps.address_space) == (64, 16 << 20, 2 << 30)
    assert (caps.stdin, caps.workdir) == (b"in", "/out")
    schema = strata.Caps({"mounts": [{"host": "/srv"}], "limits": {"timeout_ms": 1500}})
    assert schema.mounts == [{"host": "/srv", "guest": "/srv", "access": "ro"}]
    assert schema.timeout == 1.5
    assert strata.Caps(mounts=[("/a", "/b", "rw")]).mounts == [
        {"host": "/a", "guest": "/b", "access": "rw"}
    ]
    assert strata.Caps(read_only="/single").mounts[0]["host"] == "/single"
    assert strata.Caps(read_only=Path("/p")).mounts[0]["host"] == "/p"
    assert strata.Caps(net="host").net == "host"
    assert strata.Caps(net={"allow": ["a.com"]}).net == "allow:a.com"


def test_every_limit_field_and_container_shorthands() -> None:
    caps = strata.Caps(cpus=0.5, image="/images/busybox.tar", runtime="native")
    assert caps.to_dict()["limits"]["cpus"] == 0.5
    assert caps.to_dict()["container"] == {"image": "/images/busybox.tar", "runtime": "native"}
    schema = strata.Caps({"container": {"image": "x"}, "limits": {"cpus": 2}})
    assert schema.to_dict()["container"]["image"] == "x"
    with pytest.raises(strata.InvalidRequestError, match="runtime"):
        strata.Caps(image="x", runtime="lxc")


def test_egress_budgets_round_trip() -> None:
    caps = strata.Caps(egress_bytes="100M", egress_connections=8)
    assert (caps.egress_bytes, caps.egress_connections) == (100 << 20, 8)
    limits = caps.to_dict()["limits"]
    assert (limits["egress_bytes"], limits["egress_connections"]) == (100 << 20, 8)
    assert strata.Caps(caps.to_dict()) == caps
    assert strata.Caps.from_json(caps.to_json()) == caps
    assert eval(repr(caps), {"Caps": strata.Caps}) == caps
    assert "egress_bytes" in repr(caps) and "egress_connections" in repr(caps)
    schema = strata.Caps(limits={"egress_bytes": 4096, "egress_connections": 2})
    assert (schema.egress_bytes, schema.egress_connections) == (4096, 2)
    derived = strata.Caps(caps, egress_connections=16)
    assert (derived.egress_bytes, derived.egress_connections) == (100 << 20, 16)
    assert caps.egress_connections == 8, "the base is not changed"
    for bad in [{"egress_bytes": "lots"}, {"egress_connections": -1}, {"egress_connections": "8"}]:
        with pytest.raises(strata.InvalidRequestError, match="egress_"):
            strata.Caps(**bad)


def test_base_caps_are_extended_not_mutated() -> None:
    base = strata.Caps(read_only=["/a"], env={"A": "1"}, timeout=5)
    more = strata.Caps(base, read_only=["/b"], env={"B": "2"}, memory="64M")
    assert [m["host"] for m in more.mounts] == ["/a", "/b"]
    assert more.env == {"A": "1", "B": "2"}
    assert (more.timeout, more.memory) == (5.0, 64 << 20)
    assert [m["host"] for m in base.mounts] == ["/a"] and base.env == {"A": "1"}
    limits = strata.Caps(base, limits={"processes": 4})
    assert (limits.timeout, limits.processes) == (5.0, 4), "limits merge into the base's"


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"mount": ["/x"]}, ["unknown field `mount`"]),
        ({"timeout_s": 3}, ["unknown field `timeout_s`"]),
        ({"limits": {"memroy": "1G"}}, ["unknown field `memroy`"]),
        ({"mounts": [{"host": "/x", "acess": "rw"}]}, ["unknown field `acess`"]),
        ({"timeout": -1}, ["non-negative", "-1"]),
        ({"timeout": math.nan}, ["non-negative"]),
        ({"timeout": 0}, ["timeout", "too small"]),
        ({"timeout": "5"}, ["number of seconds"]),
        ({"cpu_time": -0.5}, ["non-negative"]),
        ({"limits": {"timeout_ms": -1}}, ["non-negative"]),
        ({"memory": "lots"}, ["invalid size"]),
        ({"memory": -1}, ["memory", "negative"]),
        ({"memory": "10K"}, ["memory", "too small"]),
        ({"processes": -3}, ["processes"]),
        ({"env": {"A": 1}}, ["env"]),
        ({"env": {"A=B": "1"}}, ["environment variable"]),
        ({"read_only": ["relative/path"]}, ["must be absolute"]),
        ({"read_only": [("/x", "/proc/x")]}, ["/proc"]),
        ({"read_write": [("/a", "/same"), ("/b", "/same")]}, ["same guest path"]),
        ({"net": "everything"}, ["network policy"]),
        ({"net": ["bad host:99999"]}, ["network rule"]),
        ({"system": "all"}, ["system"]),
        ({"stdin": 5}, ["stdin"]),
        ({"workdir": "rel"}, ["workdir"]),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else "",
)
def test_invalid_caps_raise_invalid_request(bad: Dict[str, Any], words: list) -> None:
    with pytest.raises(strata.InvalidRequestError) as info:
        strata.Caps(bad)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.code == "invalid_request"
    for word in words:
        assert word in str(err), str(err)
    with pytest.raises(strata.InvalidRequestError):
        strata.Caps(**bad)


def test_from_json_rejects_unknown_keys() -> None:
    with pytest.raises(strata.InvalidRequestError, match="unknown field `net_allow`"):
        strata.Caps.from_json('{"net_allow": true}')
    with pytest.raises(strata.InvalidRequestError, match="non-negative"):
        strata.Caps.from_json('{"limits": {"timeout_ms": -5}}')


def _marker_caps(out: Path, **extra: Any) -> Dict[str, Any]:
    return {"read_write": [(out, "/out")], **extra}


MARK = [PY, "-c", "open('/out/ran', 'w').write('yes')"]


def test_bad_input_runs_nothing(sb: strata.Sandbox, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert sb.run(MARK, _marker_caps(out)).ok and (out / "ran").exists()
    (out / "ran").unlink()
    cases = [
        _marker_caps(out, unknown_key=1),
        _marker_caps(out, timeout=-3),
        _marker_caps(out, limits={"timeout_ms": -3}),
        _marker_caps(out, read_only=["/nonexistent/strata-test-path"]),
    ]
    for caps in cases:
        with pytest.raises(strata.InvalidRequestError):
            sb.run(MARK, caps)
        assert not (out / "ran").exists(), f"{caps} ran the tool"
    with pytest.raises(strata.InvalidRequestError, match="nonexistent"):
        sb.run(MARK, _marker_caps(out, read_only=["/nonexistent/strata-test-path"]))


def test_bad_tools(sb: strata.Sandbox) -> None:
    with pytest.raises(strata.InvalidRequestError, match="empty"):
        sb.run([])
    with pytest.raises(strata.InvalidRequestError, match="empty"):
        strata.Tool.command([])
    with pytest.raises(TypeError, match="never a shell string"):
        sb.run("echo hi")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sb.run(["/bin/echo", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        sb.run(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sb.run(["/bin/true"], caps=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(strata.InvalidRequestError, match="unknown script language"):
        strata.Tool.script("cobol", "x")
    with pytest.raises(strata.InvalidRequestError, match="NUL"):
        strata.Tool.script("python", "print(1)\0")
    with pytest.raises(strata.InvalidRequestError) as info:
        sb.run(["/no/such/program"])
    assert "/no/such/program" in str(info.value)


def test_bad_backends() -> None:
    with pytest.raises(strata.InvalidRequestError, match="unknown backend"):
        strata.Sandbox("kvm")
    unavailable = [b for b in strata.doctor().backends if not b["available"]]
    if not unavailable:
        pytest.skip("SKIPPED LOUDLY: every backend is available on this host")
    name = unavailable[0]["backend"]
    with pytest.raises(strata.BackendUnavailableError) as info:
        strata.Sandbox(name).run(["/bin/true"])
    assert isinstance(info.value, RuntimeError)
    assert info.value.code == "backend_unavailable"
    assert name in str(info.value)


def test_wasm_module_that_does_not_exist_runs_nothing(sb: strata.Sandbox) -> None:
    with pytest.raises(strata.SandboxError):
        sb.run(strata.Tool.wasm("/nonexistent/module.wasm"))


def test_exception_hierarchy_and_codes() -> None:
    table = [
        (strata.SandboxError, (Exception,), "internal"),
        (strata.InvalidRequestError, (strata.SandboxError, ValueError), "invalid_request"),
        (strata.DeniedError, (strata.SandboxError, PermissionError), "denied"),
        (strata.BackendUnavailableError, (strata.SandboxError, RuntimeError), "backend_unavailable"),
        (strata.UnenforceableError, (strata.SandboxError, RuntimeError), "unenforceable"),
        (strata.LimitExceededError, (strata.SandboxError,), "limit_exceeded"),
        (strata.SandboxTimeoutError, (strata.LimitExceededError, TimeoutError), "limit_exceeded"),
        (strata.ToolFailedError, (strata.SandboxError,), "tool_failed"),
        (strata.CancelledError, (strata.SandboxError,), "cancelled"),
        (strata.SetupFailedError, (strata.SandboxError, OSError), "setup_failed"),
        (strata.InternalError, (strata.SandboxError, RuntimeError), "internal"),
    ]
    for cls, bases, code in table:
        assert cls.__bases__ == bases, cls
        assert cls.code == code, cls
        assert cls.__module__ == "strata"
        assert cls.__doc__
        err = cls("message")
        assert str(err) == "message" and err.result is None
