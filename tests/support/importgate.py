"""A handler module whose import fails while the file named by $IMPORTGATE_CLOSED exists:
a fork server started then (a restart after it died) cannot load it, so the daemon cannot
start children (tests/fault/test_faults.py)."""

from __future__ import annotations

import os

if os.path.exists(os.environ.get("IMPORTGATE_CLOSED", "/nonexistent")):
    raise ImportError("the import gate is closed")

from faulthandlers import work

__all__ = ["work"]
