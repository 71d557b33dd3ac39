"""The examples under python/examples, run as a reader would run them,
against a live intentd: each guarded tool is called twice by its model and
places one order. The framework examples need their framework (the
"frameworks" entry of scripts/python-test.sh installs it); elsewhere they
are skipped, saying why."""

from __future__ import annotations

import os
import re
import subprocess
import unittest

from tests.frameworks import framework
from tests.live import PYTHON, REPO, Intentd, child_env

EXAMPLES = os.path.join(REPO, "python", "examples")


def setUpModule() -> None:
    global server
    server = Intentd()


def tearDownModule() -> None:
    server.stop()


def run(name: str) -> list:
    done = subprocess.run([PYTHON, os.path.join(EXAMPLES, name), "--target", server.address],
                          env=child_env(), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"{name} exited {done.returncode}:\n{done.stderr}")
    return done.stdout.splitlines()


class ReadmeTest(unittest.TestCase):
    def test_readme_recipes_are_the_examples(self) -> None:
        """Every Python block of python/README.md after a link to an example
        (in the same section) is in that example, line for line: the README
        shows what the tests run."""
        with open(os.path.join(REPO, "python", "README.md")) as f:
            readme = f.read()
        checked = 0
        for m in re.finditer(r"```python\n(.*?)```", readme, re.S):
            before = readme[: m.start()]
            section = before[before.rfind("\n## "):]
            links = re.findall(r"\]\((examples/[a-z_]+\.py)\)", section)
            if not links:
                continue
            with open(os.path.join(REPO, "python", links[-1])) as f:
                lines = set(f.read().splitlines())
            for line in m.group(1).splitlines():
                self.assertIn(line, lines, f"README.md shows a line {links[-1]} does not have")
            checked += 1
        self.assertGreaterEqual(checked, 8)


class ExamplesTest(unittest.TestCase):
    def assertOneOrderThenTheStatement(self, out: list) -> None:
        self.assertTrue(out[0].startswith("tool -> ordered desk lamp: order-1") or '"order_id": "order-1"' in out[0], out)
        self.assertTrue(out[1].startswith("tool -> already_completed: intent "), out)
        self.assertIn("action_taken: none", out[1])
        self.assertEqual(out[-1], "orders at the merchant: 1", out)

    def test_quickstart_async(self) -> None:
        out = run("quickstart_async.py")
        self.assertEqual(len(out), 4, out)
        self.assertOneOrderThenTheStatement(out)
        self.assertTrue(out[2].startswith("tool -> refused: FINGERPRINT_MISMATCH"), out)

    def test_langchain_agent(self) -> None:
        if framework("langchain", "langgraph")[0] is None:
            self.skipTest(framework("langchain", "langgraph")[1])
        self.assertOneOrderThenTheStatement(run("langchain_agent.py"))

    def test_pydantic_ai_agent(self) -> None:
        if framework("pydantic_ai")[0] is None:
            self.skipTest(framework("pydantic_ai")[1])
        self.assertOneOrderThenTheStatement(run("pydantic_ai_agent.py"))

    def test_openai_agents_agent(self) -> None:
        if framework("agents")[0] is None:
            self.skipTest(framework("agents")[1])
        self.assertOneOrderThenTheStatement(run("openai_agents_agent.py"))


if __name__ == "__main__":
    unittest.main()
