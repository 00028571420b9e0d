"""The policy layer from Python: tiers, approvers (callables), expiring elevations, risk
routing and the audit log, on real process-backend runs."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping

import pytest

import strata


def decisions(log: Path) -> List[str]:
    out = []
    for line in log.read_text().splitlines():
        event = json.loads(line)["event"]
        if event["kind"] == "policy":
            out.append(f"{event['subject']}:{event['decision']}")
    return out


def test_low_tier_refuses_a_write_naming_tier_and_capability(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    log = tmp_path / "audit.jsonl"
    with strata.Sandbox("process", tier="low", audit=log, warm_pool=0) as sb:
        with pytest.raises(strata.DeniedError) as err:
            sb.run(["/bin/sh", "-c", f"echo x > {ws}/planted"], {"read_write": [ws]})
        assert "tier low" in str(err.value) and "write:" in str(err.value)
        assert not (ws / "planted").exists()
        result = sb.run(["/bin/ls", str(ws)], {"read_only": [ws]})
        assert result.ok
        assert result.receipt.policy == {"tier": "low"}
    assert decisions(log) == ["elevation:requested", "elevation:refused"]
    assert strata.verify_audit(log)["records"] == 4


def test_approver_grant_expires_between_two_runs(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    log = tmp_path / "audit.jsonl"
    asked: List[Mapping[str, Any]] = []

    def approver(request: Mapping[str, Any]) -> Any:
        asked.append(request)
        return {"ttl": 0.3, "runs": 10} if len(asked) == 1 else False

    with strata.Sandbox("process", tier="low", approver=approver, audit=log, warm_pool=0) as sb:
        first = sb.run(["/bin/sh", "-c", f"echo 1 > {ws}/first"], {"read_write": [ws]})
        assert first.ok and (ws / "first").exists()
        policy = first.receipt.policy
        assert policy is not None and policy["elevations"][0]["capabilities"] == [f"write:{ws}"]
        time.sleep(0.4)
        with pytest.raises(strata.DeniedError, match="the approver refused"):
            sb.run(["/bin/sh", "-c", f"echo 2 > {ws}/second"], {"read_write": [ws]})
        assert not (ws / "second").exists()
    assert asked[0]["tier"] == "low" and asked[0]["needs"][0]["capability"] == f"write:{ws}"
    assert decisions(log) == [
        "elevation:requested",
        "elevation:granted",
        "elevation:used",
        "elevation:expired",
        "elevation:requested",
        "elevation:refused",
    ]


def test_raising_approver_refuses(tmp_path: Path) -> None:
    def approver(request: Mapping[str, Any]) -> bool:
        raise RuntimeError("approver crashed")

    with strata.Sandbox("process", tier="low", approver=approver, warm_pool=0) as sb:
        with pytest.raises(strata.DeniedError, match="approver crashed"):
            sb.run(["/bin/true"], {"net": "host"})


def test_custom_tier_and_per_run_tier() -> None:
    reviewers: Dict[str, Any] = dict(strata.tier_preset("medium", home="/nonexistent"))
    reviewers["name"] = "reviewers"
    reviewers["programs"] = {"only": ["uname"]}
    with strata.Sandbox("process", tiers=[reviewers], tier="reviewers", warm_pool=0) as sb:
        assert sb.run(["uname"]).ok
        with pytest.raises(strata.DeniedError, match="program:id"):
            sb.run(["/usr/bin/id"])
        with pytest.raises(strata.DeniedError, match="net:host"):
            sb.run(["uname"], {"net": "host"}, tier="low")
        with pytest.raises(strata.InvalidRequestError, match="unknown tier"):
            sb.run(["uname"], tier="root")
    with pytest.raises(strata.InvalidRequestError):
        strata.Sandbox(tiers=[{"name": "broken"}])


def test_untrusted_risk_never_falls_to_a_weaker_backend_silently() -> None:
    with strata.Sandbox(route_backends=["process"], warm_pool=0) as sb:
        with pytest.raises(strata.UnenforceableError, match="risk untrusted"):
            sb.run(["/bin/true"], risk="untrusted")
        with pytest.raises(strata.InvalidRequestError, match="unknown risk"):
            sb.run(["/bin/true"], risk="reckless")
    with strata.Sandbox(route_backends=["process"], allow_weaker=True, warm_pool=0) as sb:
        result = sb.run(["/bin/true"], risk="untrusted")
        route = (result.receipt.policy or {})["route"]
        assert route["backend"] == "process" and "allowed by the caller" in route["reason"]
        result = asyncio.run(sb.arun(["/bin/true"], risk="files"))
        assert (result.receipt.policy or {})["route"]["risk"] == "files"


def test_tampered_audit_log_is_named(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    with strata.Sandbox("process", audit=log, warm_pool=0) as sb:
        sb.run(["/bin/true"])
        sb.run(["/bin/false"])
    head = strata.verify_audit(log)["head"]
    log.write_text(log.read_text().replace("/bin/false", "/bin/fals3"))
    with pytest.raises(strata.InvalidRequestError, match="line 2"):
        strata.verify_audit(log)
    with pytest.raises(strata.InvalidRequestError):
        strata.Sandbox(audit=log)
    assert len(head) == 64


def test_profile_gives_backend_tier_caps_and_risk(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "x").write_text("from the profile\n")
    profile = tmp_path / "agent.toml"
    profile.write_text(
        'backend = "process"\ntier = "low"\nrisk = "files"\n'
        f'[caps]\nmounts = [{{ host = "{data}", guest = "{data}", access = "ro" }}]\n'
        "limits = { timeout_ms = 5000 }\n"
    )
    with strata.Sandbox(profile=profile, warm_pool=0) as sb:
        assert sb.backend == "process"
        result = sb.run(["cat", str(data / "x")])
        assert result.stdout == "from the profile\n"
        policy = result.receipt.policy or {}
        assert policy["tier"] == "low" and policy["route"]["risk"] == "files"
        # Explicit caps replace the profile's (the file is not granted then).
        assert not sb.run(["cat", str(data / "x")], {}).ok
    profile.write_text('[caps]\nlimits = { timeout_ms = "soon" }\n')
    with pytest.raises(strata.InvalidRequestError, match="caps/limits/timeout_ms"):
        strata.Sandbox(profile=profile)
