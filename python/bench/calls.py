"""What a call costs the Python client, and what the library adds per cycle.

bench/cycle.py measures the whole cycle; this takes the client's share
apart, in this process's CPU time, which other load on the machine moves
far less than it moves throughput:

- per call: DeriveKey (intentd answers it from memory and writes nothing)
  sent by --tasks concurrent asyncio tasks on one grpc.aio channel, or as
  many threads on one grpc channel, in interleaved rounds: grpc.aio with
  intentd.aio's channel options (gRPC's own retries off), with gRPC's
  retries on (grpc's default), with the metadata passed as a tuple (as
  intentd.aio passed a token before) and as a grpc.aio.Metadata built once
  (as it does now), the sync stack in threads, and grpc.aio on uvloop when
  uvloop is installed;
- per cycle: what intentd.aio's and the thread session's run add beyond the
  calls themselves, with a stub that answers Acquire and Complete at once.

    cd python && INTENTD_BIN=/tmp/intentd python bench/calls.py [--duration 2] [--rounds 5]

(docs/PERFORMANCE.md, "The Python library").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc  # noqa: E402
import grpc.aio  # noqa: E402

import intentd  # noqa: E402
import intentd.aio  # noqa: E402
from intent.v1 import intent_pb2, intent_pb2_grpc  # noqa: E402
from tests.live import Intentd  # noqa: E402

try:
    import uvloop  # type: ignore[import-not-found]
except ImportError:
    uvloop = None

REQUEST = intent_pb2.DeriveKeyRequest(action="bench.call")
REQUEST.identity.update({"order_id": "ORD-1"})
METADATA = (("traceparent", "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"),)


def aio_calls(address: str, seconds: float, tasks: int, options: Sequence[Tuple[str, Any]], metadata: Any,
              run: Callable[[Any], Any] = asyncio.run) -> Tuple[float, float]:
    """Calls per second and client CPU µs per call, tasks concurrent tasks on one grpc.aio channel."""

    async def main() -> Tuple[float, float]:
        async with grpc.aio.insecure_channel(address, options=list(options)) as channel:
            stub = intent_pb2_grpc.IntentServiceStub(channel)

            async def load(seconds: float) -> int:
                end, n = time.monotonic() + seconds, [0]

                async def task() -> None:
                    while time.monotonic() < end:
                        await stub.DeriveKey(REQUEST, timeout=10, metadata=metadata)
                        n[0] += 1

                await asyncio.gather(*(task() for _ in range(tasks)))
                return n[0]

            await load(min(seconds / 3, 1.0))
            cpu, start = time.process_time(), time.monotonic()
            n = await load(seconds)
            return n / (time.monotonic() - start), 1e6 * (time.process_time() - cpu) / n

    return run(main())


def thread_calls(address: str, seconds: float, threads: int) -> Tuple[float, float]:
    """The same with the sync stack: threads threads on one grpc channel."""
    with grpc.insecure_channel(address) as channel:
        stub = intent_pb2_grpc.IntentServiceStub(channel)
        lock = threading.Lock()

        def load(seconds: float) -> int:
            end, n = time.monotonic() + seconds, [0]

            def worker() -> None:
                k = 0
                while time.monotonic() < end:
                    stub.DeriveKey(REQUEST, timeout=10, metadata=METADATA)
                    k += 1
                with lock:
                    n[0] += k

            ts = [threading.Thread(target=worker) for _ in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return n[0]

        load(min(seconds / 3, 1.0))
        cpu, start = time.process_time(), time.monotonic()
        n = load(seconds)
        return n / (time.monotonic() - start), 1e6 * (time.process_time() - cpu) / n


# The library's own work: a stub that answers at once.
ACQUIRED = intent_pb2.AcquireResponse(outcome=intent_pb2.OUTCOME_EXECUTE)
ACQUIRED.lease.token, ACQUIRED.lease.session_id = 7, "bench-session"
COMPLETED = intent_pb2.CompleteResponse()
COMPLETED.intent.state = intent_pb2.STATE_COMPLETED
PARAMS = {"note": "n" * 289}
RESULT = intent_pb2.Result(payload=b"r" * 300)


class AnsweringStub:
    """Answers Acquire with EXECUTE and Complete with COMPLETED, at once."""

    def __init__(self, wrap: Callable[[Any], Any]) -> None:
        self._wrap = wrap

    def __getattr__(self, method: str) -> Callable[..., Any]:
        answer = {"Acquire": ACQUIRED, "Complete": COMPLETED}.get(method)
        return lambda request, timeout=None, metadata=None: self._wrap(answer)


async def _now(value: Any) -> Any:
    return value


class StubbedAsyncClient(intentd.aio.AsyncClient):
    @property
    def rpc(self) -> Any:  # type: ignore[override]
        return AnsweringStub(_now)


def task(i: int) -> intentd.Task:
    key = f"calls-{i}"
    return intentd.Task(key=key, execute=lambda att: RESULT, register=intentd.Client.register_request(key, PARAMS))


def library_work(cycles: int) -> Tuple[float, float, float]:
    """CPU µs per cycle: building the task; what AsyncSession.run and
    Session.run add beyond that, their calls answered at once."""
    cpu = time.process_time()
    for i in range(cycles):
        task(i)
    building = (time.process_time() - cpu) / cycles

    async def aio() -> float:
        session = intentd.aio.AsyncSession(StubbedAsyncClient("unused:1"), "bench-session", "bench", 60, time.monotonic())
        for i in range(cycles // 10):
            await session.run(task(i))
        cpu = time.process_time()
        for i in range(cycles):
            await session.run(task(i))
        took = (time.process_time() - cpu) / cycles
        session._beater.cancel()
        return took

    client = intentd.Client("unused:1")
    client.rpc = AnsweringStub(lambda answer: answer)
    session = intentd.Session(client, "bench-session", "bench", 60, time.monotonic())
    for i in range(cycles // 10):
        session.run(task(i))
    cpu = time.process_time()
    for i in range(cycles):
        session.run(task(i))
    threaded = (time.process_time() - cpu) / cycles
    session._stop.set()
    client.close()
    return 1e6 * building, 1e6 * (asyncio.run(aio()) - building), 1e6 * (threaded - building)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=2.0, help="seconds of each measurement, after its warm-up")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--tasks", type=int, default=64, help="concurrent tasks (threads for the sync stack)")
    ap.add_argument("--cycles", type=int, default=20000, help="cycles of the library's own work")
    args = ap.parse_args()
    ours = intentd.aio._channel_options(())
    variants: Dict[str, Callable[[str], Tuple[float, float]]] = {
        "grpc.aio, intentd.aio's options": lambda a: aio_calls(a, args.duration, args.tasks, ours, None),
        "grpc.aio, gRPC's retries on": lambda a: aio_calls(a, args.duration, args.tasks, (), None),
        "grpc.aio, metadata as a tuple": lambda a: aio_calls(a, args.duration, args.tasks, ours, METADATA),
        "grpc.aio, grpc.aio.Metadata": lambda a: aio_calls(a, args.duration, args.tasks, ours, grpc.aio.Metadata(*METADATA)),
        f"grpc, {args.tasks} threads": lambda a: thread_calls(a, args.duration, args.tasks),
    }
    if uvloop is not None:
        variants["grpc.aio on uvloop"] = lambda a: aio_calls(a, args.duration, args.tasks, ours, None, run=uvloop.run)
    server = Intentd("--rate-per-principal", "0", "--rate-per-tenant", "0")
    rows: Dict[str, List[Tuple[float, float]]] = {name: [] for name in variants}
    loads: List[float] = []
    try:
        for r in range(args.rounds):
            for name, fn in variants.items():
                rows[name].append(fn(server.address))
                rate, cpu = rows[name][-1]
                print(f"round {r + 1}: {name:34}{rate:9.0f} calls/s{cpu:8.1f} client CPU µs/call", flush=True)
            loads.append(os.getloadavg()[0])
    finally:
        server.stop()
    base = rows[next(iter(variants))]
    print(f"\nDeriveKey, {args.tasks} at a time, median of {args.rounds} rounds of {args.duration}s; load average {min(loads):.1f}–{max(loads):.1f}")
    print(f"{'':36}{'calls/s':>9}{'client µs/call':>16}{'÷ first, per round':>20}")
    for name, xs in rows.items():
        per_round = statistics.median(x[1] / b[1] for x, b in zip(xs, base))
        print(f"{name:36}{statistics.median(x[0] for x in xs):9.0f}{statistics.median(x[1] for x in xs):16.1f}{per_round:20.2f}")
    building, aio, threaded = library_work(args.cycles)
    print(f"\nthe library's own work per cycle (Acquire with register + Complete answered at once, {args.cycles} cycles): "
          f"building the task {building:.1f} µs; AsyncSession.run {aio:.1f} µs; Session.run {threaded:.1f} µs")


if __name__ == "__main__":
    main()
