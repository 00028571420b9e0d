#!/usr/bin/env python3
"""Per-call overhead of the Python binding, and a comparison with subprocess.run.

    bindings/python/.venv/bin/python bindings/python/bench/overhead.py [--runs N]

Three measurements, in one process:

1. Binding overhead alone: ``Sandbox._run_noop`` does everything ``Sandbox.run`` does in
   the binding (convert the tool and caps, check the log level, release and re-take the
   GIL, drain log records, build the RunResult) except running a sandbox. Timed over many
   calls, so it resolves fractions of a microsecond. Target: <= 2 us.
2. A trivial real run, ``sb.run(["/bin/true"], caps)``: wall time per call seen from
   Python, next to the run's own duration measured in Rust (``RunResult.duration``).
3. ``subprocess.run(["/bin/true"])`` for the same command, unsandboxed.

Reports medians (and p90 for real runs); no assertion, numbers only.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from typing import Callable, List

import strata


def per_call_us(fn: Callable[[], object], calls: int, repeats: int = 7) -> float:
    """Median over ``repeats`` of the mean time per call of ``calls`` calls, in us."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - start) / calls / 1000)
    return statistics.median(samples)


def timed_runs(fn: Callable[[], object], runs: int) -> List[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - start) / 1000)
    return out


def pct(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="real runs per variant")
    parser.add_argument("--calls", type=int, default=100_000, help="no-op calls per sample")
    args = parser.parse_args()

    sb = strata.Sandbox("process")
    caps = strata.Caps(timeout=10)
    argv = ["/bin/true"]
    tool = strata.Tool.command(argv)
    caps_dict = {"timeout": 10}

    def empty() -> None:
        pass

    # 1. binding overhead
    baseline = per_call_us(empty, args.calls)
    noop_tool = per_call_us(lambda: sb._run_noop(tool, caps), args.calls)
    noop_argv = per_call_us(lambda: sb._run_noop(argv, caps), args.calls)
    noop_dict = per_call_us(lambda: sb._run_noop(argv, caps_dict), args.calls)

    # 2./3. real runs, interleaved so both see the same machine state
    for _ in range(20):  # warm up: probes, page cache
        sb.run(argv, caps)
        subprocess.run(argv)
    py_wall: List[float] = []
    rust_duration: List[float] = []
    sub_wall: List[float] = []
    for _ in range(args.runs):
        start = time.perf_counter_ns()
        result = sb.run(argv, caps)
        py_wall.append((time.perf_counter_ns() - start) / 1000)
        rust_duration.append(result.duration * 1e6)
        sub_wall.extend(timed_runs(lambda: subprocess.run(argv), 1))
    assert result.ok

    overhead = noop_tool - baseline
    print(f"strata {strata.__version__}, {args.runs} real runs, {args.calls} no-op calls x 7\n")
    print("binding overhead per call (no sandbox run)        median")
    print(f"  empty Python lambda call (baseline)           {baseline:8.3f} us")
    print(f"  sb._run_noop(Tool, Caps)                      {noop_tool:8.3f} us")
    print(f"  sb._run_noop(argv list, Caps)                 {noop_argv:8.3f} us")
    print(f"  sb._run_noop(argv list, caps dict)            {noop_dict:8.3f} us")
    print(f"  => binding overhead beyond the call itself    {overhead:8.3f} us  (target <= 2 us)")
    print()
    p50_py, p50_rust, p50_sub = (pct(v, 0.5) for v in (py_wall, rust_duration, sub_wall))
    p90_py, p90_rust, p90_sub = (pct(v, 0.9) for v in (py_wall, rust_duration, sub_wall))
    print("trivial run: /bin/true                               p50          p90")
    print(f"  sb.run(argv, caps), wall seen from Python    {p50_py:9.1f} us {p90_py:9.1f} us")
    print(f"  RunResult.duration (measured in Rust)        {p50_rust:9.1f} us {p90_rust:9.1f} us")
    print(f"  subprocess.run(argv), unsandboxed            {p50_sub:9.1f} us {p90_sub:9.1f} us")
    print()
    print("ratios (p50)")
    print(f"  binding overhead / sandboxed run             {overhead / p50_py * 100:9.4f} %")
    print(f"  sandboxed run / subprocess.run               {p50_py / p50_sub:9.2f} x  (target <= 2.5x)")
    print("  (default Sandbox(): steady state, the adaptive warm pool serves every run after the first)")


if __name__ == "__main__":
    main()
