"""Concurrency from threads and asyncio, the GIL released during runs, and cancellation
that leaves nothing behind."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import strata
from conftest import PY, assert_nothing_left

N = 100


def test_100_concurrent_runs_from_threads(sb: strata.Sandbox) -> None:
    caps = strata.Caps(timeout=120)

    def one(i: int) -> strata.RunResult:
        return sb.run(["/bin/echo", str(i)], caps)

    with ThreadPoolExecutor(max_workers=N) as pool:
        results = list(pool.map(one, range(N)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(N)]
    assert all(r.ok for r in results)


@pytest.mark.asyncio
async def test_100_concurrent_runs_from_asyncio(sb: strata.Sandbox) -> None:
    caps = strata.Caps(timeout=120)
    results = await asyncio.gather(*(sb.arun(["/bin/echo", str(i)], caps) for i in range(N)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(N)]


def test_the_gil_is_released_while_a_run_executes(sb: strata.Sandbox, tmp_path: Path) -> None:
    # The tool waits for a file that only this process's main thread creates, while another
    # thread is inside run(). If run() held the GIL, the main thread could not create it
    # and the tool would end by its timeout instead of succeeding.
    code = """
import os, sys, time
print('waiting', flush=True)
while not os.path.exists('/shared/go'):
    time.sleep(0.01)
"""
    started = threading.Event()
    results: list = []
    caps = strata.Caps(read_write=[(tmp_path, "/shared")], timeout=60)
    thread = threading.Thread(
        target=lambda: results.append(sb.run([PY, "-c", code], caps, on_stdout=lambda _: started.set()))
    )
    thread.start()
    assert started.wait(60)
    (tmp_path / "go").write_text("")
    thread.join(90)
    assert results and results[0].ok and not results[0].timed_out


@pytest.mark.asyncio
async def test_arun_streams_on_the_loop_thread_before_returning(sb: strata.Sandbox) -> None:
    loop_thread = threading.get_ident()
    seen: list = []
    result = await sb.arun(
        [PY, "-c", "print('a', flush=True); print('b')"],
        on_stdout=lambda chunk: seen.append((threading.get_ident(), chunk)),
    )
    assert "".join(chunk for _, chunk in seen) == result.stdout == "a\nb\n"
    assert {ident for ident, _ in seen} == {loop_thread}


@pytest.mark.asyncio
async def test_arun_errors_are_the_same_exceptions(sb: strata.Sandbox) -> None:
    with pytest.raises(strata.InvalidRequestError):
        await sb.arun(["/bin/true"], {"bogus": 1})
    with pytest.raises(strata.InvalidRequestError):
        await sb.arun(["/no/such/program"])
    result = await sb.arun(["/bin/false"])
    assert result.exit_code == 1


@pytest.mark.asyncio
async def test_cancelling_the_task_kills_the_run(sb: strata.Sandbox, marker: str) -> None:
    ready = asyncio.Event()
    task = asyncio.create_task(
        sb.arun(
            ["/bin/sh", "-c", f"echo ready; exec /bin/sleep 1000.{marker}"],
            on_stdout=lambda _: ready.set(),
        )
    )
    await asyncio.wait_for(ready.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_nothing_left(marker)


@pytest.mark.asyncio
async def test_wait_for_timeout_kills_the_run(sb: strata.Sandbox, marker: str) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(sb.arun(["/bin/sleep", f"1000.{marker}"]), 0.5)
    assert_nothing_left(marker)


@pytest.mark.asyncio
async def test_raising_async_callback_kills_the_run(sb: strata.Sandbox, marker: str) -> None:
    def on_stdout(chunk: str) -> None:
        raise KeyError(chunk)

    with pytest.raises(KeyError):
        await sb.arun(["/bin/sh", "-c", f"echo ready; exec /bin/sleep 1000.{marker}"], on_stdout=on_stdout)
    assert_nothing_left(marker)


@pytest.mark.asyncio
async def test_async_context_manager_cancels_runs_in_flight(marker: str) -> None:
    async with strata.Sandbox(backend="process") as sb:
        task = asyncio.create_task(sb.arun(["/bin/sleep", f"1000.{marker}"]))
        await asyncio.sleep(0.2)
    with pytest.raises(strata.CancelledError):
        await task
    assert_nothing_left(marker)


def test_concurrent_cancellations_leave_nothing_behind(sb: strata.Sandbox, marker: str) -> None:
    async def main() -> None:
        tasks = [
            asyncio.create_task(sb.arun(["/bin/sleep", f"1000.{marker}"])) for _ in range(20)
        ]
        await asyncio.sleep(0.5)
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes)

    asyncio.run(main())
    assert_nothing_left(marker)
