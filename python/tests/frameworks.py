"""Which agent frameworks this run has: an adapter's tests run where its
framework is installed (scripts/python-test.sh's "frameworks" entry pins
them) and are skipped elsewhere, saying why. Where the run requires them
($INTENTD_REQUIRE_FRAMEWORKS, as that entry sets), a missing one fails."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional, Tuple


def framework(*modules: str) -> Tuple[Optional[ModuleType], str]:
    """The first of modules imported, or None and the skip reason."""
    try:
        got = [importlib.import_module(m) for m in modules]
    except ImportError as e:
        if os.environ.get("INTENTD_REQUIRE_FRAMEWORKS"):
            raise
        return None, (f"skipped: {', '.join(modules)} not installed here ({e}); "
                      "scripts/python-test.sh frameworks installs the pinned versions")
    return got[0], ""
