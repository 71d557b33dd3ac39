"""A live intentd for the tests: built from cmd/intentd with `go build`, run
with an embedded etcd in a temporary data directory on ports of its own
choosing, and an effect-counting provider reachable over HTTP (so that
worker child processes use the same one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional
from urllib.parse import parse_qs, urlsplit

REPO = os.environ.get("INTENTD_REPO") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository: $INTENTD_REPO when the tests run from a copy (as
scripts/python-test.sh runs them against an installed wheel), else the
clone they are in."""
TESTS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The directory holding the tests package: a child worker runs there."""

_bin_lock = threading.Lock()
_bin: Optional[str] = None


def intentd_binary() -> str:
    """$INTENTD_BIN, or cmd/intentd built once per test run."""
    global _bin
    with _bin_lock:
        if _bin is None:
            _bin = os.environ.get("INTENTD_BIN", "")
            if not _bin:
                out = tempfile.mkdtemp(prefix="intentd-bin-")
                _bin = os.path.join(out, "intentd")
                subprocess.run(["go", "build", "-o", _bin, "./cmd/intentd"], cwd=REPO, check=True)
        return _bin


class Intentd:
    """A running intentd process; stop() ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, *extra: str) -> None:
        self.data_dir = tempfile.TemporaryDirectory(prefix="intentd-data-")
        self.proc = subprocess.Popen(
            [
                intentd_binary(),
                "--data-dir", self.data_dir.name,
                "--listen", "127.0.0.1:0",
                "--metrics-listen", "",
                "--embed-client-url", "http://127.0.0.1:0",
                "--embed-peer-url", "http://127.0.0.1:0",
                "--janitor-interval", "200ms",
                "--log-format", "json",
                *extra,
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        self.logs: List[str] = []
        ready = threading.Event()
        self.address = ""

        def read() -> None:  # exits when intentd closes stderr
            for line in self.proc.stderr:
                self.logs.append(line.rstrip("\n"))
                if not ready.is_set():
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if rec.get("msg") == "intentd serving" and rec.get("grpc"):
                        self.address = rec["grpc"]
                        ready.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 30
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("intentd did not start:\n" + "\n".join(self.logs[-30:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()
        self.data_dir.cleanup()


class Provider:
    """An effect-counting merchant. It does NOT deduplicate: every create
    is a new order, so a second execution would show as a second effect.
    Reconciliation looks orders up by operation key.

    HTTP: POST /orders {"operation_key", "amount"} → {"order_id"};
    GET /orders?operation_key=K → {"orders": [...]}.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.orders: Dict[str, List[str]] = {}
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._reply({"order_id": provider.create(req["operation_key"])})

            def do_GET(self) -> None:
                key = parse_qs(urlsplit(self.path).query).get("operation_key", [""])[0]
                self._reply({"orders": provider.lookup(key)})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def create(self, operation_key: str) -> str:
        with self._lock:
            orders = self.orders.setdefault(operation_key, [])
            orders.append(f"order-{sum(len(v) for v in self.orders.values())}")
            return orders[-1]

    def lookup(self, operation_key: str) -> List[str]:
        with self._lock:
            return list(self.orders.get(operation_key, []))

    def effects(self, operation_key: str) -> int:
        return len(self.lookup(operation_key))

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def child_env() -> Dict[str, str]:
    """The environment of a child process: this one's, so that it imports
    intentd as the tests do (from PYTHONPATH=python:gen/python on Debian's
    runtimes, from the installed wheel otherwise), with PYTHONPATH made
    absolute: a child may run in another directory."""
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    return env


PYTHON = sys.executable
