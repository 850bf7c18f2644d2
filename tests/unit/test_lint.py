"""ruff and mypy as pyproject.toml configures them, and the size of a module: the unit tier fails on a
lint or type error, or on a Python module over the style guide's 400 lines.

Both run as `python -m` of this interpreter (the versions the dev extra and requirements.lock pin),
from the project root so they read its pyproject.toml. mypy keeps its cache in .mypy_cache (git-ignored):
a run after the first checks only what changed (under a second instead of about 20 s here).
"""

from __future__ import annotations

import subprocess
import sys

from services.versions import PROJECT_ROOT

# What ruff checks; mypy's files are in [tool.mypy] (services, spark_jobs, migrations, bench).
LINTED = ["services", "spark_jobs", "migrations", "bench", "tests"]
# The style guide's "no module over ~400 lines": past it a module holds more than one idea.
MAX_LINES = 400


def _run(*args: str, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=timeout_s)


def test_ruff_finds_nothing():
    result = _run("ruff", "check", "--no-fix", "--output-format=concise", *LINTED, timeout_s=60)
    assert result.returncode == 0, f"ruff check {' '.join(LINTED)}:\n{result.stdout}{result.stderr}"


def test_mypy_finds_nothing():
    result = _run("mypy", timeout_s=300)  # a cold cache takes about 20 s on 2 cores
    assert result.returncode == 0, f"mypy:\n{result.stdout}{result.stderr}"


def test_no_module_is_over_the_line_limit():
    sizes = {str(path.relative_to(PROJECT_ROOT)): len(path.read_text().splitlines())
             for folder in LINTED for path in (PROJECT_ROOT / folder).rglob("*.py")}
    assert len(sizes) > 200
    assert {path: lines for path, lines in sizes.items() if lines > MAX_LINES} == {}
