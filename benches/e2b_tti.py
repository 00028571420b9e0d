"""Time to interactive: `Sandbox.create()` to the first command's result, and one command's
round trip, through the official E2B SDK against `strata serve --e2b` (mode `e2b`, needs
E2B_API_URL/E2B_SANDBOX_URL/E2B_API_KEY) or through Strata's own Python API (mode
`strata`). Prints one JSON line of medians and p90s in milliseconds; benches/e2b_tti.sh
runs both in one run and prints their ratio."""

import argparse
import json
import statistics
import time


def quantiles(samples):
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p90_ms": round(ordered[int(len(ordered) * 0.9) - 1] * 1000, 2),
    }


def e2b(runs, calls):
    from e2b import Sandbox

    tti, round_trips = [], []
    for _ in range(runs):
        start = time.perf_counter()
        sb = Sandbox.create()
        assert sb.commands.run("echo ready").stdout == "ready\n"
        tti.append(time.perf_counter() - start)
        sb.kill()
    sb = Sandbox.create()
    for _ in range(calls):
        start = time.perf_counter()
        sb.commands.run("true")
        round_trips.append(time.perf_counter() - start)
    sb.kill()
    return tti, round_trips


def strata(runs, calls):
    import strata as st

    sandbox = st.Sandbox()
    tti, round_trips = [], []
    for _ in range(runs):
        start = time.perf_counter()
        live = sandbox.start()
        assert live.exec(["/bin/bash", "-l", "-c", "echo ready"])["stdout"] == b"ready\n"
        tti.append(time.perf_counter() - start)
        live.stop()
    live = sandbox.start()
    for _ in range(calls):
        start = time.perf_counter()
        live.exec(["/bin/bash", "-l", "-c", "true"])
        round_trips.append(time.perf_counter() - start)
    live.stop()
    return tti, round_trips


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["e2b", "strata"])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    tti, round_trips = (e2b if args.mode == "e2b" else strata)(args.runs, args.calls)
    print(json.dumps({
        "mode": args.mode,
        "create_to_first_result": quantiles(tti),
        "command_round_trip": quantiles(round_trips),
    }))


if __name__ == "__main__":
    main()
