"""Signed messages between agents from Python: delegation within trust levels, and the
attacks a verifier stops (replay, tampering, staleness, cross-agent delivery, raising a
delegate's tier), each recorded in the audit log."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Tuple

import pytest

import strata


def agents() -> Tuple[strata.AgentDirectory, str, str, str]:
    planner, coder, reviewer = (strata.generate_agent_key() for _ in range(3))
    directory = strata.AgentDirectory()
    directory.add("planner", "medium", key=planner)
    directory.add("coder", "low", key=coder)
    directory.add("reviewer", "low", key=reviewer)
    return directory, planner, coder, reviewer


@pytest.mark.parametrize("scheme", ["ed25519", "hmac-sha256"])
def test_signed_delegation_is_accepted_once(scheme: str, tmp_path: Path) -> None:
    directory, *_ = agents()
    log = tmp_path / "audit.jsonl"
    with strata.Sandbox("process", audit=log, warm_pool=0) as sb:
        verifier = directory.verifier("coder", audit=sb)
        signed = directory.sign("planner", "coder", "delegate", {"task": "run tests"}, tier="low", scheme=scheme)
        message = verifier.verify(signed)
        assert message["from"] == "planner" and message["scheme"] == scheme
        assert json.loads(message["body"]) == {"task": "run tests"}
        assert message["delegation"]["tier"] == "low"
        with pytest.raises(strata.DeniedError, match="replayed"):
            verifier.verify(signed)
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert [e["decision"] for e in events] == ["accepted", "refused"]
    assert strata.verify_audit(log)["records"] == 2


def test_tampered_message_is_refused() -> None:
    directory, *_ = agents()
    verifier = directory.verifier("coder")
    signed = json.loads(directory.sign("planner", "coder", "task", "ls"))
    for field, value in [("body", "rm -rf /"), ("from", "reviewer"), ("timestamp_ms", 1)]:
        forged = json.loads(json.dumps(signed))
        forged["message"][field] = value
        with pytest.raises(strata.DeniedError, match="signature"):
            verifier.verify(forged)
    assert verifier.verify(signed)["body"] == "ls"


def test_message_for_another_agent_is_refused() -> None:
    directory, *_ = agents()
    signed = directory.sign("planner", "coder", "task", "ls")
    with pytest.raises(strata.DeniedError, match="not to this agent"):
        directory.verifier("reviewer").verify(signed)


def test_stale_message_is_refused() -> None:
    directory, *_ = agents()
    verifier = directory.verifier("coder", window=0.05)
    signed = directory.sign("planner", "coder", "task", "ls")
    time.sleep(0.2)
    with pytest.raises(strata.DeniedError, match="stale"):
        verifier.verify(signed)


def test_delegation_never_goes_up_or_raises_the_delegates_tier() -> None:
    directory, *_ = agents()
    up = directory.sign("coder", "planner", "delegate", "deploy", tier="low")
    with pytest.raises(strata.DeniedError, match="not permitted"):
        directory.verifier("planner").verify(up)
    raised = directory.sign("planner", "coder", "delegate", "deploy", tier="medium")
    with pytest.raises(strata.DeniedError, match="not permitted"):
        directory.verifier("coder").verify(raised)


def test_public_keys_suffice_to_verify_ed25519() -> None:
    planner_key = strata.generate_agent_key()
    sender = strata.AgentDirectory()
    sender.add("planner", "medium", key=planner_key)
    sender.add("coder", "low", public_key=strata.agent_public_key(strata.generate_agent_key()))
    receiver = strata.AgentDirectory()
    receiver.add("planner", "medium", public_key=strata.agent_public_key(planner_key))
    receiver.add("coder", "low", key=strata.generate_agent_key())
    signed = sender.sign("planner", "coder", "result", "done")
    assert receiver.verifier("coder").verify(signed)["kind"] == "result"
    with pytest.raises(strata.InvalidRequestError):
        sender.sign("planner", "coder", "delegate", "x")
    with pytest.raises(strata.InvalidRequestError, match="unknown tier"):
        sender.add("x", "root")
