"""The type stubs against the committed JSON Schema (``schema/*.schema.json``, generated from
the Rust core): ``Caps(...)`` declares exactly the Python keywords of the table of names the
caps schema carries (``x-strata-names``), every enum of the schemas is a ``Literal`` alias of
the stub with exactly its values, and ``Receipt`` has exactly the receipt's fields. Also the
runtime side: every spelling of the table is accepted, and an unknown key names the closest
valid one."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

import pytest

import strata

ROOT = Path(__file__).resolve().parents[3]
SCHEMA_DIR = ROOT / "schema"
STUB = Path(__file__).resolve().parents[1] / "python" / "strata" / "_strata.pyi"

#: Enums of the schemas the Python API does not expose, with why. An enum added to the core
#: must be declared in the stub (``_Name = Literal[...]``) or listed here.
NOT_EXPOSED = {
    "TrapKind": "RunResult has no trap property (only to_dict() carries it)",
}


def load(name: str) -> Dict[str, Any]:
    return json.loads((SCHEMA_DIR / name).read_text())


def string_enums(schema: Dict[str, Any]) -> Dict[str, Set[str]]:
    """The definitions of ``schema`` that are enums of strings, with their values."""
    out: Dict[str, Set[str]] = {}
    for name, definition in schema.get("$defs", {}).items():
        if "enum" in definition and all(isinstance(v, str) for v in definition["enum"]):
            out[name] = set(definition["enum"])
        elif "oneOf" in definition and all(
            isinstance(option.get("const"), str) for option in definition["oneOf"]
        ):
            out[name] = {option["const"] for option in definition["oneOf"]}
    return out


def _class(tree: ast.Module, name: str) -> Optional[ast.ClassDef]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _method(cls: Optional[ast.ClassDef], name: str) -> Optional[ast.FunctionDef]:
    for node in cls.body if cls else []:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def properties(tree: ast.Module, cls: str) -> Set[str]:
    """The ``@property`` names of class ``cls`` in the stub."""
    found = _class(tree, cls)
    return {
        node.name
        for node in (found.body if found else [])
        if isinstance(node, ast.FunctionDef)
        and any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
    }


def keywords(tree: ast.Module, cls: str) -> List[str]:
    """The keyword parameters of ``cls.__new__`` in the stub (after ``*``, or all but
    ``cls`` and positional-only ones)."""
    new = _method(_class(tree, cls), "__new__")
    if new is None:
        return []
    return [a.arg for a in new.args.args[1:] + new.args.kwonlyargs]


def literal_aliases(tree: ast.Module) -> Dict[str, Set[str]]:
    """Module-level ``_Name = Literal["a", "b"]`` aliases of the stub, with their values."""
    out: Dict[str, Set[str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target, value = node.targets[0], node.value
        if not (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Subscript)
            and isinstance(value.value, ast.Name)
            and value.value.id == "Literal"
        ):
            continue
        items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
        out[target.id] = {i.value for i in items if isinstance(i, ast.Constant)}
    return out


def stub_problems(stub: str, caps: Dict[str, Any], output: Dict[str, Any]) -> List[str]:
    """Every difference between the stub and the schemas (empty when they agree)."""
    tree = ast.parse(stub)
    problems: List[str] = []
    table = caps["x-strata-names"]

    def compare(what: str, declared: Set[str], expected: Set[str]) -> None:
        if declared - expected:
            problems.append(f"{what}: not in the schema: {sorted(declared - expected)}")
        if expected - declared:
            problems.append(f"{what}: missing: {sorted(expected - declared)}")

    python_names = {row["python"] for row in table["caps"] if row["python"]}
    compare("Caps(...) keywords", set(keywords(tree, "Caps")), python_names)
    compare("Caps properties", properties(tree, "Caps") - python_names, set())
    sandbox = set(keywords(tree, "Sandbox"))
    for row in table["options"]:
        if row["python"] and row["python"] not in sandbox:
            problems.append(f"Sandbox(...) keywords: missing: {row['python']}")
    compare(
        "Receipt properties",
        properties(tree, "Receipt"),
        set(output["$defs"]["Receipt"]["properties"]),
    )
    literals = literal_aliases(tree)
    enums = {**string_enums(caps), **string_enums(output)}
    for name, values in sorted(enums.items()):
        if name in NOT_EXPOSED:
            continue
        if f"_{name}" not in literals:
            problems.append(f"_{name} = Literal[...] is not declared (values {sorted(values)})")
        else:
            compare(f"_{name} values", literals[f"_{name}"], values)
    return problems


@pytest.fixture(scope="module")
def schemas() -> Dict[str, Dict[str, Any]]:
    return {"caps": load("caps.schema.json"), "output": load("run-output.schema.json")}


def test_stub_declares_exactly_the_schema_keywords_and_enums(schemas: Dict[str, Any]) -> None:
    problems = stub_problems(STUB.read_text(), schemas["caps"], schemas["output"])
    assert problems == [], (
        "bindings/python/python/strata/_strata.pyi disagrees with schema/ "
        "(regenerated from sandbox-core):\n" + "\n".join(problems)
    )


def test_a_stub_that_drifted_is_caught(schemas: Dict[str, Any]) -> None:
    stub = STUB.read_text()
    broken = (
        stub.replace('"fuel", "open_files"', '"fuel"')
        .replace("        output: _Size = ...,\n", "        max_output: _Size = ...,\n")
        .replace('_Strictness = Literal["strict", "best_effort"]', '_Strictness = Literal["strict", "best-effort"]')
        .replace("    def identity(self)", "    def identity_(self)")
        .replace('"connect_failed", "budget"]', '"connect_failed"]')
    )
    assert broken != stub
    problems = "\n".join(stub_problems(broken, schemas["caps"], schemas["output"]))
    for expected in [
        "_LimitKind values: missing: ['open_files']",
        "Caps(...) keywords: not in the schema: ['max_output']",
        "Caps(...) keywords: missing: ['output']",
        "_Strictness values: not in the schema: ['best-effort']",
        "_Strictness values: missing: ['best_effort']",
        "Receipt properties: missing: ['identity']",
        "_EgressRefusal values: missing: ['budget']",
    ]:
        assert expected in problems, problems
    without = "\n".join(line for line in stub.splitlines() if not line.startswith("_IdentitySource"))
    assert "_IdentitySource = Literal[...] is not declared" in "\n".join(
        stub_problems(without, schemas["caps"], schemas["output"])
    )


def test_the_schema_enums_include_what_the_drift_was_about(schemas: Dict[str, Any]) -> None:
    enums = string_enums(schemas["output"])
    assert "open_files" in enums["LimitKind"]
    assert {"egress_bytes", "egress_connections"} <= enums["LimitKind"]
    assert "proxy" in enums["Mechanism"]
    assert enums["EgressRefusal"] == {
        "policy", "bad_request", "unresolvable", "connect_failed", "budget"
    }
    assert enums["Strictness"] == {"strict", "best_effort"}
    rows = {row["json"]: row for row in schemas["caps"]["x-strata-names"]["caps"]}
    assert rows["limits.output"]["python"] == "output"
    assert rows["limits.output"]["node"] == "output"
    assert rows["limits.output"]["cli"][0] == "--output"


def test_every_python_spelling_of_the_table_is_accepted(schemas: Dict[str, Any]) -> None:
    samples: Dict[str, Any] = {
        "read_only": ["/a"],
        "read_write": ["/b"],
        "mounts": [{"host": "/c"}],
        "protect_host_executed": False,
        "system": "none",
        "env": {"A": "1"},
        "net": "host",
        "stdin": "in",
        "workdir": "/w",
        "limits": {"processes": 9},
        "timeout": 2,
        "timeout_ms": 2000,
        "cpu_time": 3,
        "cpu_time_ms": 3000,
        "memory": "64M",
        "processes": 7,
        "output": "4K",
        "file_size": "1M",
        "open_files": 64,
        "disk": "16M",
        "address_space": "2G",
        "cpus": 0.5,
        "egress_bytes": "10M",
        "egress_connections": 9,
        "container": {"image": "/i"},
        "image": "/i",
        "runtime": "docker",
        "workspace": "/ws",
        "agent": "a1",
        "secrets": [{"env": "T", "value": "v", "hosts": ["api.example.com"]}],
    }
    table = schemas["caps"]["x-strata-names"]["caps"]
    spellings = {row["python"] for row in table if row["python"]} | {
        alias["name"] for row in table for alias in row["aliases"] if alias["dialect"] == "python"
    }
    assert spellings == set(samples), "a sample for every spelling"
    for key, value in samples.items():
        extra: Dict[str, Any] = {"image": "/i"} if key in ("runtime", "workspace") else {}
        if key == "secrets":
            extra = {"net": "allow:api.example.com"}
        caps = strata.Caps({key: value, **extra})
        assert caps != strata.Caps(), key
    assert strata.Caps(timeout_ms=1500).timeout == strata.Caps(timeout=1.5).timeout == 1.5
    assert strata.Caps(cpu_time_ms=500) == strata.Caps(cpu_time=0.5)
    assert strata.Caps(image="/i", workspace="/ws").to_dict()["container"]["workspace"] == "/ws"
    assert strata.Caps(cpus=0.25).cpus == 0.25


def test_legacy_value_spellings_are_read(schemas: Dict[str, Any]) -> None:
    values = schemas["caps"]["x-strata-names"]["values"]
    assert {"schema": "Access", "value": "rw", "alias": "read_write"} in values
    caps = strata.Caps(mounts=[{"host": "/a", "access": "read_write"}])
    assert caps.mounts[0]["access"] == "rw"
    caps = strata.Caps(image="/i", runtime="gvisor")
    assert caps.to_dict()["container"]["runtime"] == "runsc"


@pytest.mark.parametrize(
    "key, suggestion",
    [
        ("memroy", "memory"),
        ("timeoutMs", "timeout"),
        ("readOnly", "read_only"),
        ("maxOutput", "output"),
        ("egress_byte", "egress_bytes"),
        ("egressConnections", "egress_connections"),
        ("egress_connection", "egress_connections"),
    ],
)
def test_an_unknown_keyword_names_the_closest_valid_one(key: str, suggestion: str) -> None:
    with pytest.raises(strata.InvalidRequestError) as info:
        strata.Caps(**{key: 1})
    message = str(info.value)
    assert f"unknown field `{key}`, did you mean `{suggestion}`?" in message, message
