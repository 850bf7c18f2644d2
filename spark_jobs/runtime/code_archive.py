"""The jobs' own Python code as one zip, for the executors of a cluster.

On a cluster the executors' Python workers unpickle functions that name `spark_jobs` modules (the
shippers, the dead-letter step), so those modules must be importable there. The package travels as a zip
the driver adds to the session (`SparkContext.addPyFile`): every executor fetches it, new ones included
after a worker is lost, and puts it on its workers' path. Third-party packages are not in it: they come
with the interpreter the workers run (PYSPARK_PYTHON), a packed environment on a real cluster
(docs/cluster.md). The Java sources of the writers stay out: their jar travels with the session's jars.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
ARCHIVE = f"{PACKAGE.name}.zip"
_LEFT_OUT = {"jars", "__pycache__"}


def write(folder: Path) -> Path:
    """The package as `folder`/spark_jobs.zip: every file of it but the Java module and compiled caches."""
    target = folder / ARCHIVE
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(PACKAGE.rglob("*")):
            inside = path.relative_to(PACKAGE)
            if path.is_file() and not _LEFT_OUT & set(inside.parts[:-1]) and path.suffix != ".pyc":
                archive.write(path, Path(PACKAGE.name) / inside)
    return target


def for_this_driver() -> Path:
    """A fresh archive in a folder of this process's own, removed when it exits (executors fetch the
    file from the driver whenever one starts, so it stays as long as the driver does)."""
    folder = Path(tempfile.mkdtemp(prefix="tideline-code-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return write(folder)


__all__ = ["ARCHIVE", "for_this_driver", "write"]
