"""The apply jobs' settings: each query's cadence and batch cap, and bad values refused in one line."""

from __future__ import annotations

import pytest

from spark_jobs.model.settings import JobSettings, JobSettingsError, read_settings


def test_the_delta_queries_take_larger_batches_and_their_own_intervals_by_default(monkeypatch):
    for sink in ("WAREHOUSE", "ANALYTICS"):  # the suite's conftest shortens them for every driver
        monkeypatch.delenv(f"TIDE_JOB_{sink}_TRIGGER_INTERVAL", raising=False)
    settings = JobSettings()
    assert [settings.max_offsets_of(sink) for sink in ("search", "cache")] == [20_000, 20_000]
    assert [settings.max_offsets_of(sink) for sink in ("warehouse", "analytics")] == [100_000, 100_000]
    assert [settings.trigger_interval_of(sink) for sink in ("search", "cache", "warehouse", "analytics")] == [
        "2 seconds", "2 seconds", "10 seconds", "30 seconds"]


def test_a_real_time_epoch_is_two_minutes_by_default_and_follows_its_variable(monkeypatch):
    monkeypatch.delenv("TIDE_JOB_REALTIME_EPOCH", raising=False)
    assert JobSettings().realtime_epoch == "120 seconds"  # each changeover stalls the writes (docs/apply.md)
    monkeypatch.setenv("TIDE_JOB_REALTIME_EPOCH", "30 seconds")
    assert read_settings().realtime_epoch == "30 seconds"


def test_each_cap_follows_its_own_variable(monkeypatch):
    monkeypatch.setenv("TIDE_JOB_MAX_OFFSETS_PER_TRIGGER", "500")
    monkeypatch.setenv("TIDE_JOB_DELTA_MAX_OFFSETS_PER_TRIGGER", "7000")
    settings = read_settings()
    assert (settings.max_offsets_of("cache"), settings.max_offsets_of("warehouse")) == (500, 7000)


def test_a_cap_below_one_is_refused_naming_its_variable(monkeypatch):
    monkeypatch.setenv("TIDE_JOB_DELTA_MAX_OFFSETS_PER_TRIGGER", "0")
    with pytest.raises(JobSettingsError, match=r"^invalid setting TIDE_JOB_DELTA_MAX_OFFSETS_PER_TRIGGER: "):
        read_settings()


def test_a_drivers_own_jvm_options_are_none_by_default_and_follow_their_variable(monkeypatch):
    monkeypatch.delenv("TIDE_JOB_JVM_OPTIONS", raising=False)  # the suite's conftest sets the tests' JIT
    assert JobSettings().jvm_options.split() == []
    monkeypatch.setenv("TIDE_JOB_JVM_OPTIONS", "-XX:TieredStopAtLevel=1 -Xss4m")
    assert read_settings().jvm_options.split() == ["-XX:TieredStopAtLevel=1", "-Xss4m"]
