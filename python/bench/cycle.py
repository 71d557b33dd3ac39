"""The Python library's cycle against the Go client's, in one run.

A cycle is what cmd/intentbench's cycle workload measures: a fresh intent,
Acquire with register (EXECUTE), then Complete, with the same 300-byte
params (canonical JSON) and result, the same random letters in every
intent of a run. Python runs it through session.run, as a worker would:
the thread session and the asyncio one at one worker, and the asyncio one
in --tasks concurrent tasks of this process, each task with a session of
its own as each intentbench worker has. The Go figure is intentbench's
(`intentbench --intentd-addr … --workloads cycle --levels 64 --rounds 1`)
against the same intentd, measured right before or right after the Python
one (the order alternates by round), so that both see the same load on the
machine. Every measurement starts with a warm-up, as intentbench's do
(a third of --duration, at most a second), on a client and sessions
already opened.

    cd python && INTENTD_BIN=/tmp/intentd python bench/cycle.py [--duration 3] [--rounds 7] [--pin 0:1]

With --pin, intentd runs on the first CPU list and both clients on the
second, so that neither client's CPU comes out of intentd's, as an agent
host on other cores than intentd's would run.

It prints, per round and as medians: cycles/s, median and mean latency
and client CPU per cycle of each Python measurement and Go's rate;
intentd's CPU per cycle; how many cycles intentd was working on at a time
(its mean handling time of Acquire and Complete, from its metrics, times
the rate); and how long the client's event-loop thread ran and how long
it waited for a CPU while it had work (Linux schedstat). The last line is
RESULT with the two ratios issue 28's targets name, each the median of
the rounds' ratios — the median cycle of the asyncio session at one worker
against the thread session's, and the asyncio tasks' cycles/s against
intentbench's — and the load average
(docs/PERFORMANCE.md, "The Python library").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import intentd  # noqa: E402
import intentd.aio  # noqa: E402
from intent.v1 import intent_pb2  # noqa: E402
from tests.live import REPO, Intentd  # noqa: E402

PAYLOAD = 300


def letters(n: int, seed: int) -> str:
    """n random letters and digits, as intentbench's payloads (--payload-text random)."""
    r = random.Random(seed)
    return "".join(r.choice(string.ascii_letters + string.digits) for _ in range(n))


# intentbench's payloads: params whose canonical JSON, {"note":"…"}, is
# PAYLOAD bytes, and a result of PAYLOAD bytes, {"r":"…"}.
PARAMS = {"note": letters(PAYLOAD - len('{"note":""}'), 1)}
RESULT = intent_pb2.Result(payload=('{"r":"' + letters(PAYLOAD - len('{"r":""}'), 2) + '"}').encode())
RUN = os.urandom(4).hex()


class Counter:
    """Fresh keys for this run."""

    def __init__(self) -> None:
        self.n = 0

    def key(self) -> str:
        self.n += 1
        return f"pybench-{RUN}-{self.n}"


KEYS = Counter()


def task() -> intentd.Task:
    """One cycle's task, built as a worker builds it."""
    key = KEYS.key()
    return intentd.Task(key=key, execute=lambda att: RESULT, register=intentd.Client.register_request(key, PARAMS))


class Figures(NamedTuple):
    rate: float
    """cycles/s"""
    p50: float
    """median latency of a cycle, ms (nan for Go: see intentbench's own output)"""
    mean: float
    """mean latency of a cycle, ms (nan for Go)"""
    cpu: float
    """the client's CPU per cycle, µs (nan for Go: intentbench does not say its own)"""
    server_cpu: float
    """intentd's CPU per cycle, µs"""
    in_flight: float
    """cycles intentd worked on at a time: its mean handling time of Acquire
    and Complete, times the rate"""
    busy: float
    """seconds per second the client's event-loop (or calling) thread ran
    on a CPU (nan where schedstat is not there)"""
    waited: float
    """seconds per second it was runnable and waiting for a CPU: busy +
    waited near 1 is a loop thread with no time to spare"""


class Server:
    """The intentd under test: its address, its CPU time and its metrics."""

    def __init__(self) -> None:
        # Rate limits off, as intentbench runs its own; the metrics on a port of its own.
        self.proc = Intentd("--rate-per-principal", "0", "--rate-per-tenant", "0", "--metrics-listen", "127.0.0.1:0")
        self.address = self.proc.address
        self.metrics = ""
        deadline = time.monotonic() + 10
        while not self.metrics and time.monotonic() < deadline:
            for line in list(self.proc.logs):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("msg") == "metrics serving":
                    self.metrics = f"http://{rec['addr']}/metrics"
            time.sleep(0.05)

    def cpu(self) -> float:
        """intentd's CPU seconds so far (Linux; nan elsewhere)."""
        try:
            with open(f"/proc/{self.proc.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def counters(self) -> Tuple[float, float, float]:
        """Acquire and Complete handling seconds and calls so far, and the
        EXECUTE outcomes (cycles), from intentd's metrics."""
        if not self.metrics:
            return float("nan"), float("nan"), float("nan")
        text = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        seconds = calls = cycles = 0.0
        for line in text.splitlines():
            if line.startswith("grpc_server_handling_seconds_") and ('grpc_method="Acquire"' in line or 'grpc_method="Complete"' in line):
                if line.startswith("grpc_server_handling_seconds_sum{"):
                    seconds += float(line.rsplit(" ", 1)[1])
                elif line.startswith("grpc_server_handling_seconds_count{"):
                    calls += float(line.rsplit(" ", 1)[1])
            elif line.startswith('intentd_acquire_outcomes_total{outcome="EXECUTE"}'):
                cycles = float(line.rsplit(" ", 1)[1])
        return seconds, calls, cycles

    def stop(self) -> None:
        self.proc.stop()


def schedstat() -> Tuple[float, float]:
    """Seconds this thread has run on a CPU, and spent runnable waiting for
    one (Linux schedstat; nan elsewhere)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            ran, waited = f.read().split()[:2]
        return int(ran) / 1e9, int(waited) / 1e9
    except (OSError, ValueError):
        return float("nan"), float("nan")


class Snapshot(NamedTuple):
    """What a measurement compares before and after."""

    counters: Tuple[float, float, float]
    sched: Tuple[float, float]
    server_cpu: float
    cpu: float
    at: float


def snapshot(server: Server) -> Snapshot:
    return Snapshot(server.counters(), schedstat(), server.cpu(), time.process_time(), time.monotonic())


def figures(a: Snapshot, b: Snapshot, lats: List[float]) -> Figures:
    """The Figures of the cycles whose latencies (seconds) are lats, run between a and b."""
    elapsed, n = b.at - a.at, len(lats)
    rate = n / elapsed
    calls = b.counters[1] - a.counters[1]
    per_cycle = 2 * (b.counters[0] - a.counters[0]) / calls if calls > 0 else float("nan")
    return Figures(rate, 1000 * statistics.median(lats), 1000 * statistics.fmean(lats), 1e6 * (b.cpu - a.cpu) / n, 1e6 * (b.server_cpu - a.server_cpu) / n,
                   rate * per_cycle, (b.sched[0] - a.sched[0]) / elapsed, (b.sched[1] - a.sched[1]) / elapsed)


def warm_up(seconds: float) -> float:
    """intentbench's warm-up: a third of a round, at most a second."""
    return min(seconds / 3, 1.0)


def thread_measure(server: Server, seconds: float) -> Figures:
    """The thread session at one worker."""
    with intentd.Client(server.address) as client, client.open_session("pybench-sync", ttl=60) as session:

        def cycles(seconds: float) -> List[float]:
            lats: List[float] = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                t = task()
                t0 = time.perf_counter()
                out = session.run(t)
                lats.append(time.perf_counter() - t0)
                assert out.executed, out
            return lats

        cycles(warm_up(seconds))
        a = snapshot(server)
        lats = cycles(seconds)
        return figures(a, snapshot(server), lats)


async def async_measure(server: Server, seconds: float, tasks: int) -> Figures:
    """The asyncio session in tasks concurrent tasks of this process, each
    with its own session (as intentbench's workers)."""
    async with intentd.aio.AsyncClient(server.address) as client:
        sessions = [await client.open_session(f"pybench-aio-{i}", ttl=60) for i in range(tasks)]

        async def cycles(seconds: float) -> List[float]:
            lats: List[float] = []
            end = time.monotonic() + seconds

            async def worker(w: int) -> None:
                while time.monotonic() < end:
                    t = task()
                    t0 = time.perf_counter()
                    out = await sessions[w].run(t)
                    lats.append(time.perf_counter() - t0)
                    assert out.executed, out

            await asyncio.gather(*(worker(w) for w in range(tasks)))
            return lats

        await cycles(warm_up(seconds))
        a = snapshot(server)
        lats = await cycles(seconds)
        b = snapshot(server)
        for s in sessions:
            await s.close()
    return figures(a, b, lats)


def go_measure(server: Server, bench: str, seconds: float, tasks: int) -> Figures:
    """One round of intentbench's cycle at C=tasks against the same intentd:
    its rate; intentd's CPU per cycle and cycles in flight over the whole
    intentbench run (its warm-up included)."""
    s0, c0 = server.counters(), server.cpu()
    out = subprocess.run(
        [bench, "--intentd-addr", server.address, "--workloads", "cycle", "--levels", str(tasks),
         "--rounds", "1", "--duration", f"{seconds}s", "--payload", str(PAYLOAD)],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout
    s1, c1 = server.counters(), server.cpu()
    rate = float("nan")
    for line in out.splitlines():
        m = re.match(rf"^C={tasks}\s+([\d,.]+)", line)
        if m:
            rate = float(m.group(1).replace(",", ""))
            break
    cycles = s1[2] - s0[2]
    per_cycle = 2 * (s1[0] - s0[0]) / (s1[1] - s0[1]) if s1[1] > s0[1] else float("nan")
    return Figures(rate, float("nan"), float("nan"), float("nan"), 1e6 * (c1 - c0) / cycles if cycles else float("nan"), rate * per_cycle,
                   float("nan"), float("nan"))


def ratios(thread1: Sequence[Figures], async1: Sequence[Figures], asyncn: Sequence[Figures], go: Sequence[Figures]) -> Tuple[List[float], List[float]]:
    """Per round: the latency asyncio adds at one worker (its median cycle
    ÷ the thread session's − 1: intentbench reports percentiles too, and a
    median is what a cycle takes, where a mean also counts the moments
    other processes held both cores), and asyncio's rate in many tasks ÷
    Go's at as many workers."""
    added = [a.p50 / t.p50 - 1 for a, t in zip(async1, thread1)]
    share = [p.rate / g.rate for p, g in zip(asyncn, go) if g.rate == g.rate and g.rate > 0]
    return added, share


def result_line(added: Sequence[float], share: Sequence[float], load: float) -> str:
    """The last line: the medians of the rounds' ratios, the targets, and the load average."""
    a = f"{statistics.median(added):+.1%}" if added else "n/a"
    s = f"{statistics.median(share):.2f}" if share else "n/a"
    return f"RESULT async_latency_added={a} async64_vs_go64={s} load_avg={load:.1f} (targets: at most +10%, at least 0.80; medians of the rounds' ratios)"


def row(name: str, f: Figures) -> str:
    def num(x: float, fmt: str) -> str:
        return format(x, fmt) if x == x else "–"
    return (f"{name:22}{num(f.rate, '10.0f')}{num(f.p50, '9.2f'):>9}{num(f.mean, '9.2f'):>9}{num(f.cpu, '12.0f'):>12}{num(f.server_cpu, '14.0f'):>14}"
            f"{num(f.in_flight, '11.1f'):>11}{num(f.busy, '7.2f'):>7}{num(f.waited, '8.2f'):>8}")


HEADER = f"{'':22}{'cycles/s':>10}{'p50 ms':>9}{'mean ms':>9}{'client µs':>12}{'intentd µs':>14}{'in flight':>11}{'busy':>7}{'waited':>8}"


def parse_pin(ap: argparse.ArgumentParser, pin: str) -> Tuple[set, set]:
    """--pin's two CPU lists, or two empty sets when it is not given."""
    if not pin:
        return set(), set()
    try:
        server, client = pin.split(":")
        cpus = tuple({int(c) for c in part.split(",")} for part in (server, client))
    except ValueError:
        ap.error(f"--pin: want SERVER:CLIENT CPU lists such as 0:1, got {pin!r}")
    if not hasattr(os, "sched_setaffinity"):
        ap.error("--pin: this system cannot pin processes to CPUs")
    return cpus


def pin_process(pid: int, cpus: set) -> None:
    """Pins every thread pid has; threads it starts later inherit it."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of each measurement, after its warm-up")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    ap.add_argument("--tasks", type=int, default=64, help="concurrent asyncio tasks, and intentbench's level")
    ap.add_argument("--pin", metavar="SERVER:CLIENT", default="",
                    help="CPU lists (as 0 or 0,1) for intentd and for the clients (this process and intentbench), "
                         "so that neither client's CPU comes out of intentd's: e.g. 0:1 (Linux)")
    args = ap.parse_args()
    server_cpus, client_cpus = parse_pin(ap, args.pin)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)  # before any thread: grpc's and intentbench inherit it
    bench = os.path.join(tempfile.mkdtemp(prefix="pybench-"), "intentbench")
    subprocess.run(["go", "build", "-o", bench, "./cmd/intentbench"], cwd=REPO, check=True)
    server = Server()
    if server_cpus:
        pin_process(server.proc.proc.pid, server_cpus)
    many = f"asyncio, {args.tasks} tasks"
    names = ["thread, 1 worker", "asyncio, 1 worker", many, f"go intentbench C={args.tasks}"]
    rows: Dict[str, List[Figures]] = {n: [] for n in names}
    loads: List[float] = []

    def one_worker(kind: str) -> Figures:
        if kind == names[0]:
            return thread_measure(server, args.duration)
        return asyncio.run(async_measure(server, args.duration, 1))

    def many_workers(kind: str) -> Figures:
        if kind == many:
            return asyncio.run(async_measure(server, args.duration, args.tasks))
        return go_measure(server, bench, args.duration, args.tasks)

    try:
        for r in range(args.rounds):
            # Each pair runs back to back, its order alternating by round.
            flip = r % 2 == 1
            for pair, fn in (((names[0], names[1]), one_worker), ((many, names[3]), many_workers)):
                for name in (reversed(pair) if flip else pair):
                    rows[name].append(fn(name))
                    print(f"round {r + 1}: {row(name, rows[name][-1])}", flush=True)
            loads.append(os.getloadavg()[0])
            print(f"round {r + 1}: load average {loads[-1]:.1f}", flush=True)
    finally:
        server.stop()
    print(f"\ncycle (Acquire with register + Complete, {PAYLOAD} B payloads), median of {args.rounds} rounds of {args.duration}s; "
          f"load average {min(loads):.1f}–{max(loads):.1f}" + (f"; intentd on CPUs {sorted(server_cpus)}, clients on {sorted(client_cpus)}" if args.pin else ""))
    print("(client µs: this process's CPU per cycle; intentd µs: intentd's; in flight: cycles intentd worked on at a time;")
    print(" busy, waited: seconds per second the client's loop thread ran, and was runnable but had no CPU)")
    print(HEADER)
    for name, fs in rows.items():
        print(row(name, Figures(*(statistics.median(f[i] for f in fs) for i in range(len(Figures._fields))))))
    added, share = ratios(rows[names[0]], rows[names[1]], rows[many], rows[names[3]])
    print("\nper round: async latency added " + ", ".join(f"{x:+.1%}" for x in added)
          + f"; async {args.tasks} ÷ go {args.tasks} " + ", ".join(f"{x:.2f}" for x in share))
    print(result_line(added, share, statistics.median(loads)))


if __name__ == "__main__":
    main()
