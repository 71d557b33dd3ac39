"""Whose code the event loop runs, from a py-spy profile of bench/cycle.py.

    ../.cache/python/bench/bin/py-spy record -r 200 --format raw -o /tmp/cycle.prof -- \\
        ../.cache/python/bench/bin/python bench/cycle.py --duration 3 --rounds 2
    python bench/loopshare.py /tmp/cycle.prof

Counts the samples taken inside asyncio's loop (a frame of
``BaseEventLoop._run_once`` on the stack: the asyncio measurements) and
gives each to the innermost frame of grpc, asyncio, intentd, protobuf or
this benchmark (docs/PERFORMANCE.md, "The Python library").
"""

from __future__ import annotations

import collections
import sys

OWNERS = (("grpc/", "grpc"), ("intentd/", "intentd"), ("asyncio/", "asyncio"), ("selectors.py", "asyncio"),
          ("protobuf/", "protobuf"), ("cycle.py", "benchmark"))


def owner(frames: list) -> str:
    for frame in reversed(frames):
        for marker, name in OWNERS:
            if marker in frame:
                return name
    return "other"


def main() -> None:
    shares: "collections.Counter[str]" = collections.Counter()
    with open(sys.argv[1]) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            if any("_run_once" in fr for fr in frames):
                shares[owner(frames)] += int(count)
    total = sum(shares.values())
    print(f"{total} samples in the event loop: " + ", ".join(f"{name} {n / total:.0%}" for name, n in shares.most_common()))


if __name__ == "__main__":
    main()
