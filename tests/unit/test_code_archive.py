"""The jobs' code as a cluster's executors get it (spark_jobs/runtime/code_archive.py): every module imports
from the zip alone, in an interpreter that sees the third-party packages but not the project's own install."""

from __future__ import annotations

import site
import subprocess
import sys
import zipfile

from spark_jobs.runtime import code_archive

_IMPORT_ALL = """
import importlib, pkgutil, sys
import spark_jobs
assert spark_jobs.__file__.startswith(sys.argv[1]), spark_jobs.__file__
names = [m.name for m in pkgutil.walk_packages(spark_jobs.__path__, "spark_jobs.")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_every_module_of_the_jobs_imports_from_the_archive_alone(tmp_path):
    archive = code_archive.write(tmp_path)
    names = zipfile.ZipFile(archive).namelist()
    assert "spark_jobs/runtime/pools.xml" in names, "files the code reads travel with it"
    assert not [name for name in names if name.startswith("spark_jobs/jars/") or name.endswith(".pyc")]
    # -S: no site processing, so no .pth file puts the project's editable install on the path; the
    # third-party packages come from site-packages named on PYTHONPATH, as a cluster's interpreter has them.
    result = subprocess.run(
        [sys.executable, "-S", "-c", _IMPORT_ALL, str(archive)], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": f"{archive}:{':'.join(site.getsitepackages())}"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) > 40, "every module was imported"
