"""What the tests imported: the installed wheel (with its stubs and
py.typed) when scripts/python-test.sh says so, and stubs that match the
runtime they were loaded on."""

from __future__ import annotations

import os
import sys
import unittest

import google.protobuf
import grpc

import intentd
from intent.v1 import intent_pb2, intent_pb2_grpc
from tests.live import REPO

INSTALLED = os.environ.get("INTENTD_TEST_INSTALLED", "")
"""The matrix entry's name when the suite runs against an installed wheel."""


class PackagingTest(unittest.TestCase):
    def test_runtime_said(self) -> None:
        # Printed so that a CI log says which runtimes each run was on.
        print(f"\n  runtimes: python {sys.version.split()[0]}, protobuf {google.protobuf.__version__}, grpcio {grpc.__version__};"
              f" intentd {intentd.__version__} from {os.path.dirname(intentd.__file__)}", file=sys.stderr)
        self.assertTrue(hasattr(intent_pb2_grpc, "IntentServiceStub"))

    @unittest.skipUnless(INSTALLED, "runs against an installed wheel only (scripts/python-test.sh)")
    def test_the_wheel_is_what_runs(self) -> None:
        """intentd and its stubs come from site-packages, not the clone, with
        py.typed beside them and the release version."""
        for module in (intentd, intent_pb2, intent_pb2_grpc):
            path = os.path.realpath(module.__file__)
            self.assertFalse(path.startswith(os.path.realpath(REPO) + os.sep + "python"), f"{module.__name__} imported from the clone: {path}")
            self.assertIn("site-packages", path)
        for package in (intentd, intent_pb2):
            self.assertTrue(os.path.exists(os.path.join(os.path.dirname(package.__file__), "py.typed")), package.__name__)
        self.assertTrue(os.path.exists(os.path.splitext(intent_pb2.__file__)[0] + ".pyi"))
        self.assertNotEqual(intentd.__version__, "0.0.0")

    @unittest.skipUnless(INSTALLED, "runs against an installed wheel only (scripts/python-test.sh)")
    def test_the_stubs_floors_are_the_wheels(self) -> None:
        """The generated code's own version checks and the wheel's declared
        floors agree: what the stubs need at import is what pip installs."""
        from importlib import metadata

        requires = metadata.requires("intentd") or []
        core = [r for r in requires if "extra ==" not in r]
        with open(intent_pb2.__file__) as f:
            pb = f.read()
        with open(intent_pb2_grpc.__file__) as f:
            rpc = f.read()
        gen_major_minor_patch = pb.split("ValidateProtobufRuntimeVersion(")[1].split(")")[0].split(",")[1:4]
        protobuf_floor = ".".join(x.strip() for x in gen_major_minor_patch)
        grpc_floor = rpc.split("GRPC_GENERATED_VERSION = '")[1].split("'")[0]
        specs = {}
        for r in core:
            name = r.split("<")[0].split(">")[0].split("=")[0].strip()
            specs[name] = {s.strip() for s in r[len(name):].split(";")[0].split(",")}
        self.assertIn(f">={protobuf_floor}", specs["protobuf"], core)
        self.assertIn(f">={grpc_floor}", specs["grpcio"], core)


if __name__ == "__main__":
    unittest.main()
