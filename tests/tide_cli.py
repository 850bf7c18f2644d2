"""Running the `tide` command line as a user does: a subprocess, settings passed as TIDE_* variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

from services.settings import StackSettings
from spark_jobs.model.config import PipelineConfig

TIDE = (sys.executable, "-m", "services.cli")


def tide_env(settings: StackSettings, fields: Iterable[str]) -> dict[str, str]:
    """This environment plus TIDE_<FIELD> for each of `fields`, taken from `settings`."""
    overrides = {f"TIDE_{name.upper()}": _env_value(getattr(settings, name)) for name in fields}
    return {**os.environ, "COLUMNS": "200", **overrides}


def _env_value(value: object) -> str:
    """A setting as the environment spells it: a list as JSON (the settings parse both ways)."""
    return json.dumps(list(value)) if isinstance(value, (list, tuple)) else str(value)


def tide_result(settings: StackSettings, *args: str, fields: Iterable[str], timeout: float = 900,
                extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `tide ARGS` with those settings (and `extra` variables); whatever it returns, failing or not."""
    return subprocess.run([*TIDE, *args], env={**tide_env(settings, fields), **(extra or {})}, capture_output=True,
                          text=True, timeout=timeout)


def run_tide(settings: StackSettings, *args: str, fields: Iterable[str], timeout: float = 900) -> str:
    """Run `tide ARGS` with those settings; its output, or fail with it."""
    result = tide_result(settings, *args, fields=fields, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def pipeline_env(pipeline: PipelineConfig, directory: Path) -> dict[str, str]:
    """TIDE_* variables that point `tide` at the test stack and `pipeline` (written to `directory`)."""
    from tests.conftest import TEST_STACK

    path = directory / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(by_alias=True, mode="json")))
    env = {f"TIDE_{name.upper()}": str(value) for name, value in TEST_STACK.items()}
    return {**env, "TIDE_PIPELINE_FILE": str(path)}
