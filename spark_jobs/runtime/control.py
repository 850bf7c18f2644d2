"""Operator control of the running driver: which sinks' queries are paused, and requests to re-read
pipeline.yaml's tables.

`tide jobs pause <sink>` writes the paused file; the driver reads it every supervision loop (at most
a few seconds) and stops or restarts that one query, leaving the others running. `tide tables add |
remove` writes the reload file the same way. Kept here, next to the driver, so the jobs need nothing
from `services` to read them.
"""

from __future__ import annotations

import json
from pathlib import Path

from spark_jobs.model.files import replace_text


def read_paused(path: Path) -> frozenset[str]:
    """The paused sinks; none when the file is absent or unreadable (a bad file must not stop the jobs)."""
    try:
        paused = json.loads(path.read_text()).get("paused", [])
    except (OSError, ValueError, AttributeError):
        return frozenset()
    return frozenset(name for name in paused if isinstance(name, str))


def write_paused(path: Path, paused: frozenset[str] | set[str]) -> None:
    """Replace the paused set atomically (write then rename: the driver never reads half a file)."""
    replace_text(path, json.dumps({"paused": sorted(paused)}))


def read_reload(path: Path) -> str | None:
    """The newest request to re-read pipeline.yaml's tables (`tide tables add|remove`), None if none."""
    try:
        request = json.loads(path.read_text()).get("request")
    except (OSError, ValueError, AttributeError):
        return None
    return request if isinstance(request, str) else None


def write_reload(path: Path, request: str) -> None:
    """Ask the running driver to re-read pipeline.yaml's tables; it reports `request` in its status
    once done (atomically written, as the paused set)."""
    replace_text(path, json.dumps({"request": request}))
