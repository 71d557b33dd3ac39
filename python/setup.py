"""The wheel's version: the project's release version, as deploy/build.sh
takes it — $VERSION (v1.2.3), else `git describe --tags` of the checkout —
spelled as PEP 440 wants it. Everything else is in pyproject.toml."""

from __future__ import annotations

import os
import re
import subprocess

from setuptools import setup

_RELEASE = re.compile(r"^v?(\d+(?:\.\d+)*)(?:-(\d+)-g([0-9a-f]+))?(-dirty)?$")


def pep440(described: str) -> str:
    """v1.2.3 → 1.2.3; v1.2.3-4-gabc → 1.2.3.post4+gabc; a bare commit
    (no release tag yet) abc123 → 0.0.0+gabc123; -dirty adds .dirty."""
    described = described.strip()
    m = _RELEASE.match(described)
    if m:
        version, ahead, commit, dirty = m.groups()
        local = []
        if ahead:
            version += f".post{ahead}"
            local.append(f"g{commit}")
        if dirty:
            local.append("dirty")
        return version + ("+" + ".".join(local) if local else "")
    m = re.match(r"^([0-9a-f]{4,40})(-dirty)?$", described)
    if m:
        return f"0.0.0+g{m.group(1)}" + (".dirty" if m.group(2) else "")
    return "0.0.0"


def release_version() -> str:
    if os.environ.get("VERSION"):
        return pep440(os.environ["VERSION"])
    try:
        out = subprocess.run(
            ["git", "describe", "--tags", "--always", "--dirty", "--match", "v[0-9]*"],
            cwd=os.path.dirname(os.path.abspath(__file__)), capture_output=True, text=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "0.0.0"
    return pep440(out)


setup(version=release_version())
