"""The Python library's cycle against the Go figures, in one run.

A cycle is what cmd/intentbench's cycle workload measures: a fresh intent,
Acquire with register (EXECUTE), then Complete, with 300-byte params and
result. Python runs it through session.run (the thread session, and the
asyncio one); the Go figures are intentbench's, against the same intentd,
one intentbench round after each round of Python's
(`intentbench --intentd-addr … --workloads cycle --levels 1,64 --rounds 1`),
so that both see the same load on the machine.

    cd python && INTENTD_BIN=/tmp/intentd python bench/cycle.py [--duration 3] [--rounds 3]

It prints, per round and as medians: cycles/s and mean latency of the thread
and asyncio sessions at one worker, of asyncio at 64 concurrent tasks in one
process, and Go's at C=1 and C=64; then the two ratios the targets name
(docs/PERFORMANCE.md, "The Python library").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import intentd  # noqa: E402
import intentd.aio  # noqa: E402
from intent.v1 import intent_pb2  # noqa: E402
from tests.live import REPO, Intentd  # noqa: E402

PAYLOAD = 300


def text(n: int) -> str:
    """n random letters and digits (hex: as ids and tokens, they hardly compress)."""
    return os.urandom((n + 1) // 2).hex()[:n]


def task(i: str) -> intentd.Task:
    key = f"pybench-{i}-{text(12)}"
    reg = intentd.Client.register_request(key, {"p": text(PAYLOAD)})
    result = intent_pb2.Result(payload=text(PAYLOAD).encode())
    return intentd.Task(key=key, execute=lambda att: result, register=reg)


Round = Tuple[float, float, float]
"""cycles/s, mean ms per cycle, and this process's CPU µs per cycle."""


def sync_round(address: str, seconds: float) -> Round:
    """The thread session at one worker."""
    with intentd.Client(address) as client, client.open_session("pybench-sync", ttl=60) as s:
        cpu = time.process_time()
        n, lat, end = 0, 0.0, time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            out = s.run(task("s"))
            lat += time.perf_counter() - t0
            assert out.executed, out
            n += 1
        cpu = time.process_time() - cpu
    return n / seconds, 1000 * lat / n, 1e6 * cpu / n


async def async_round(address: str, seconds: float, workers: int) -> Round:
    """The asyncio session with workers concurrent tasks in this process,
    on one session."""
    async with intentd.aio.AsyncClient(address) as client:
        async with await client.open_session("pybench-aio", ttl=60) as s:
            counts: List[int] = [0] * workers
            lats: List[float] = [0.0] * workers
            end = time.monotonic() + seconds
            cpu = time.process_time()

            async def worker(w: int) -> None:
                while time.monotonic() < end:
                    t0 = time.perf_counter()
                    out = await s.run(task(f"a{w}"))
                    lats[w] += time.perf_counter() - t0
                    assert out.executed, out
                    counts[w] += 1

            await asyncio.gather(*(worker(w) for w in range(workers)))
            cpu = time.process_time() - cpu
    n = sum(counts)
    return n / seconds, 1000 * sum(lats) / n, 1e6 * cpu / n


def go_round(bench: str, address: str, seconds: float) -> Dict[int, float]:
    """One round of intentbench's cycle (cycles/s at C=1 and C=64) against
    the same intentd."""
    out = subprocess.run(
        [bench, "--intentd-addr", address, "--workloads", "cycle", "--levels", "1,64",
         "--rounds", "1", "--duration", f"{seconds}s", "--payload", str(PAYLOAD)],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout
    figures = {}
    for line in out.splitlines():
        m = re.match(r"^C=(\d+)\s+([\d,]+)", line)
        if m and line.split()[0] in ("C=1", "C=64") and int(m.group(1)) not in figures:
            figures[int(m.group(1))] = float(m.group(2).replace(",", ""))
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per round of each measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    args = ap.parse_args()
    bench = os.path.join(tempfile.mkdtemp(prefix="pybench-"), "intentbench")
    subprocess.run(["go", "build", "-o", bench, "./cmd/intentbench"], cwd=REPO, check=True)
    server = Intentd("--rate-per-principal", "0", "--rate-per-tenant", "0")  # as intentbench runs it
    go_rounds: List[Dict[int, float]] = []
    try:
        rows: Dict[str, List[Round]] = {"thread, 1 worker": [], "asyncio, 1 worker": [], "asyncio, 64 tasks": []}
        runs: Dict[str, Callable[[], Round]] = {
            "thread, 1 worker": lambda: sync_round(server.address, args.duration),
            "asyncio, 1 worker": lambda: asyncio.run(async_round(server.address, args.duration, 1)),
            "asyncio, 64 tasks": lambda: asyncio.run(async_round(server.address, args.duration, 64)),
        }
        for r in range(args.rounds):
            for name, fn in runs.items():
                rows[name].append(fn())
                rate, ms, cpu = rows[name][-1]
                print(f"round {r + 1}: {name:18} {rate:8.0f} cycles/s  {ms:6.2f} ms  {cpu:6.0f} CPU µs/cycle", flush=True)
            go_rounds.append(go_round(bench, server.address, args.duration))
            print(f"round {r + 1}: go intentbench      C=1 {go_rounds[-1].get(1, 0):.0f}, C=64 {go_rounds[-1].get(64, 0):.0f} cycles/s", flush=True)
    finally:
        server.stop()
    go = {c: statistics.median(g[c] for g in go_rounds) for c in (1, 64)}
    med = {name: tuple(statistics.median(x[i] for x in v) for i in range(3)) for name, v in rows.items()}
    print(f"\ncycle (Acquire with register + Complete, {PAYLOAD} B payloads), median of {args.rounds} rounds of {args.duration}s")
    print(f"{'':24}{'cycles/s':>10}{'mean ms':>10}{'client CPU µs/cycle':>22}")
    for name, (rate, ms, cpu) in med.items():
        print(f"python {name:17}{rate:10.0f}{ms:10.2f}{cpu:22.0f}")
    print(f"go intentbench C=1      {go.get(1, float('nan')):10.0f}")
    print(f"go intentbench C=64     {go.get(64, float('nan')):10.0f}")
    # Ratios per round (each round's Python and Go ran under the same load),
    # then their median: steadier than a ratio of medians on a busy machine.
    added = [a[1] / t[1] - 1 for a, t in zip(rows["asyncio, 1 worker"], rows["thread, 1 worker"])]
    share = [p[0] / g[64] for p, g in zip(rows["asyncio, 64 tasks"], go_rounds) if g.get(64)]
    print("\nper round: async latency added " + ", ".join(f"{x:+.1%}" for x in added)
          + "; async 64 ÷ go 64 " + ", ".join(f"{x:.2f}" for x in share))
    print(f"RESULT async_latency_added={statistics.median(added):+.1%} async64_vs_go64={statistics.median(share):.2f} "
          f"(targets: at most +10%, at least 0.80; medians of the rounds' ratios)")

if __name__ == "__main__":
    main()
