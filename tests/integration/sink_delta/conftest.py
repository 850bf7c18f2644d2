"""The Delta sink tests' Spark session: one per module, on two cores, with the jars jars.ensure resolves
(it overrides tests/integration/conftest.py's `spark` for this folder)."""

from __future__ import annotations

import pytest

from services.settings import StackSettings
from services.stack import jars


@pytest.fixture(scope="module")
def spark(stack_settings: StackSettings):
    from spark_jobs.runtime.session import build_session

    session = build_session("tideline-test-delta", jars.ensure(stack_settings, "spark"), master="local[2]")
    yield session
    session.stop()
