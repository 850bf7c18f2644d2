"""The pinned component versions, read from `[tool.tideline.versions]` in pyproject.toml.

pyproject.toml is the single pin file (design invariant 9): the local stack reads
it here, and tests check docker-compose.yml and the Python pins against it.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PIN_FILE = PROJECT_ROOT / "pyproject.toml"


class Versions(BaseModel):
    """Component versions; every field is required so a missing pin fails loudly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    postgresql: str
    redis: str
    kafka: str
    debezium: str
    elasticsearch: str
    spark: str
    scala_binary: str
    delta: str


@cache
def pinned() -> Versions:
    data = tomllib.loads(PIN_FILE.read_text())
    return Versions(**data["tool"]["tideline"]["versions"])
