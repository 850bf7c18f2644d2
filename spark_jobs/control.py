"""Operator control of the running driver: which sinks' queries are paused.

`tide jobs pause <sink>` writes the file; the driver reads it every supervision loop (at most
a few seconds) and stops or restarts that one query, leaving the others running. Kept here,
next to the driver, so the jobs need nothing from `services` to read it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_paused(path: Path) -> frozenset[str]:
    """The paused sinks; none when the file is absent or unreadable (a bad file must not stop the jobs)."""
    try:
        paused = json.loads(path.read_text()).get("paused", [])
    except (OSError, ValueError, AttributeError):
        return frozenset()
    return frozenset(name for name in paused if isinstance(name, str))


def write_paused(path: Path, paused: frozenset[str] | set[str]) -> None:
    """Replace the paused set atomically (write then rename: the driver never reads half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"paused": sorted(paused)}))
    os.replace(temporary, path)
