"""Rust tracing events reach Python logging (logger "strata")."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest

import strata


def _strata_records(caplog: pytest.LogCaptureFixture) -> list:
    return [r for r in caplog.records if r.name == "strata"]


def test_run_events_are_logged_before_run_returns(sb: strata.Sandbox, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="strata")
    sb.run(["/bin/true"])
    finished = [r for r in _strata_records(caplog) if "run finished" in r.getMessage()]
    assert len(finished) == 1
    record = finished[0]
    assert record.levelno == logging.INFO
    assert record.rust_target.startswith("strata")  # type: ignore[attr-defined]
    fields = record.rust_fields  # type: ignore[attr-defined]
    assert fields["status"] == "exit code 0"
    assert fields["backend"] == "process" and fields["tool"] == "/bin/true"
    assert "strata.run{backend=process tool=/bin/true}: run finished" in record.getMessage()


def test_refused_runs_log_a_warning(sb: strata.Sandbox, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="strata")
    with pytest.raises(strata.InvalidRequestError):
        sb.run(["/no/such/program"])
    warnings = [r for r in _strata_records(caplog) if r.levelno == logging.WARNING]
    assert warnings and "run refused or failed" in warnings[-1].getMessage()
    assert warnings[-1].rust_fields["kind"] == "invalid_request"  # type: ignore[attr-defined]
    assert not [r for r in _strata_records(caplog) if r.levelno < logging.WARNING], (
        "events below the logger's level are not forwarded"
    )


def test_events_from_run_threads_are_logged(sb: strata.Sandbox, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="strata")

    async def main() -> None:
        await asyncio.gather(*(sb.arun(["/bin/true"]) for _ in range(5)))

    asyncio.run(main())
    finished = [r for r in _strata_records(caplog) if "run finished" in r.getMessage()]
    assert len(finished) == 5


def test_level_changes_take_effect_on_the_next_run(sb: strata.Sandbox, caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("strata")
    caplog.set_level(logging.WARNING, logger="strata")
    sb.run(["/bin/true"])
    assert not [r for r in _strata_records(caplog) if "run finished" in r.getMessage()]
    caplog.handler.setLevel(logging.DEBUG)
    logger.setLevel(logging.DEBUG)  # plain logging API: no call into strata in between
    sb.run(["/bin/true"])
    assert [r for r in _strata_records(caplog) if "run finished" in r.getMessage()]


def test_a_script_without_logging_config_prints_nothing_extra() -> None:
    code = (
        "import strata\n"
        "try:\n"
        "    strata.Sandbox('process').run(['/no/such/program'])\n"
        "except strata.InvalidRequestError:\n"
        "    print('refused')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout == "refused\n"
    assert proc.stderr == "", "the library must not print through logging's last resort"
