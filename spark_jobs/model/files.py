"""Files the driver and the CLI replace while others read them (the status, the paused set, the
catalogue's cache, pipeline.yaml)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """Replace `path`'s text atomically: written to a temporary file of this writer's own beside it, then
    renamed over it, so a reader never sees half a file and two writers at once (two queries' threads
    seeing the same new catalogue) never rename each other's temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
