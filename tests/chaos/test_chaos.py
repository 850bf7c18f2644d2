"""`tide chaos --profile smoke` against the session's test stack: writers under kill -9 of Connect,
the Spark driver and Kafka (plus a walsender kill, a pause and stale redeliveries), then verify
twice. The seed is random unless TIDE_CHAOS_SEED is set; a failure prints it and the whole log."""

from __future__ import annotations

import pytest

from tests.chaos_runs import run_profile

pytestmark = pytest.mark.stack


def test_smoke_profile_converges_with_complete_ledgers_after_real_duplicates_and_replays(stack, tmp_path):
    report, story = run_profile(stack, "smoke", tmp_path / "chaos")
    assert {"connect", "driver", "kafka"} <= {injected.fault for injected in report.injected}, story
    assert report.passed, story
