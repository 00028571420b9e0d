"""Typed use of the public API, checked with `mypy --strict` (never imported by pytest)."""

from __future__ import annotations

import asyncio
from typing import Dict, List, Optional

import strata


def sync_use(sb: strata.Sandbox) -> str:
    caps = strata.Caps(read_only=["/data"], env={"A": "1"}, timeout=5, memory="64M")
    more: strata.Caps = strata.Caps(
        caps, net="none", limits={"processes": 8}, egress_bytes="10M", egress_connections=4
    )
    result: strata.RunResult = sb.run(["echo", "hi"], more, on_stdout=print)
    code: Optional[int] = result.exit_code
    if result.timed_out or result.limit is not None or code != 0:
        return result.status
    receipt: strata.Receipt = result.check().receipt
    enforced: List[Dict[str, str]] = receipt.enforced
    return f"{result.stdout}{len(enforced)}{result.duration:.3f}{receipt.has('fs', 'landlock')}"


def egress_use(receipt: strata.Receipt) -> int:
    network = receipt.network
    if network is None:
        return 0
    refused = [d for d in network["decisions"] if not d["allowed"]]
    budget: List[Optional[str]] = [d.get("limit") for d in refused if d.get("refusal") == "budget"]
    sent: List[str] = [name for d in network["decisions"] for name in d.get("secrets", [])]
    return network["bytes"] + network["connections"] + len(budget) + len(sent)


def secrets_use() -> List[str]:
    caps = strata.Caps(
        net="allow:api.example.com:443",
        secrets=[{"env": "API_TOKEN", "value": "v", "hosts": ["api.example.com"]}],
    )
    return [s["env"] + ",".join(s["hosts"]) for s in caps.secrets]


async def async_use(sb: strata.Sandbox) -> bytes:
    result = await sb.arun(strata.Tool.script("python", "print(1)"), {"timeout": 2})
    return result.stdout_bytes


def errors(sb: strata.Sandbox) -> str:
    try:
        sb.run(strata.Tool.command(["true"]))
    except strata.SandboxTimeoutError as e:
        return e.code
    except strata.InvalidRequestError as e:
        return str(e)
    return ""


def main() -> None:
    with strata.Sandbox("process", strict=True) as sb:
        sync_use(sb)
        asyncio.run(async_use(sb))
        errors(sb)
    print(strata.doctor())
