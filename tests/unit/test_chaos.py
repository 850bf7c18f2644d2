"""The chaos runner's pure parts: the seeded schedule, what counts as a duplicate delivery, which
records a stale redelivery sends, when a micro-batch counts as replayed, and the ledger verdict."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest

from services.chaos import observe
from services.chaos.ledger import LedgerState, ledger_table
from services.chaos.profiles import FAULTS, PROFILES, Profile, schedule
from services.chaos.run import Report, chaos_pipeline
from services.console import terminated_as_exit
from spark_jobs.model.config import load
from spark_jobs.model.settings import SINKS

RECORDS = {r["name"]: r for r in json.loads((Path(__file__).parent / "fixtures" / "debezium_records.json").read_text())}


def _delivered(name: str, offset: int, partition: int = 0, value: str | None = "same",
               key_of: str | None = None) -> observe.Delivered:
    record = RECORDS[name]
    body = record["value"] if value == "same" else value
    key = RECORDS[key_of or name]["key"]
    return observe.Delivered(record["topic"], partition, offset, key.encode(), body and body.encode())


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_schedule_holds_every_fault_of_the_profile_inside_the_write_window_in_order(name):
    profile = PROFILES[name]
    planned = schedule(profile, 7)
    assert sorted(p.fault for p in planned) == sorted(f for f, n in profile.faults.items() for _ in range(n))
    times = [p.at_s for p in planned]
    assert times == sorted(times)
    assert profile.warm_up_s <= times[0] and times[-1] < profile.write_s


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    smoke = PROFILES["smoke"]
    assert schedule(smoke, 42) == schedule(smoke, 42)
    assert schedule(smoke, 42) != schedule(smoke, 43)


def test_smoke_kills_connect_the_driver_and_kafka_and_full_injects_every_fault_several_times():
    assert {"connect", "driver", "kafka"} <= set(PROFILES["smoke"].faults)
    assert PROFILES["full"].faults == dict.fromkeys(FAULTS, 4) and PROFILES["full"].snapshot_rows == 1_000_000


def test_an_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="unknown faults"):
        Profile(name="x", writers=1, write_s=10, faults={"meteor": 1})


def test_a_change_delivered_twice_is_one_duplicate_but_a_tombstone_or_the_runners_own_record_is_not():
    update = [_delivered("orders_update", 0), _delivered("orders_update", 1), _delivered("orders_update", 2)]
    tombstones = [_delivered("order_items_tombstone", 0, value=None),
                  _delivered("order_items_tombstone", 1, value=None)]
    assert observe.duplicate_deliveries(update + tombstones, injected=set()) == 2
    assert observe.duplicate_deliveries(update, injected={update[2].position}) == 1
    assert observe.duplicate_deliveries([_delivered("orders_update", 0), _delivered("products_insert", 0)], set()) == 0


def test_a_stale_redelivery_sends_the_first_change_of_a_row_that_changed_since_and_never_an_unchanged_one():
    changed = [_delivered("order_items_delete", 0), _delivered("order_items_tombstone", 1, value=None)]
    unchanged = [_delivered("products_insert", 0)]
    repeated = [_delivered("orders_update", 0), _delivered("orders_update", 1)]
    picked = observe.stale_records(changed + unchanged + repeated, 10, random.Random(1))
    assert picked == [changed[0]]


def test_a_stale_redelivery_also_picks_a_row_whose_later_change_has_an_unchanged_toast_placeholder():
    toasted = [_delivered("products_insert", 0),
               _delivered("products_update_unchanged_toast", 1, key_of="products_insert")]
    assert observe.stale_records(toasted, 10, random.Random(1)) == [toasted[0]]


def _checkpoint(root: Path, sink: str, offsets: dict[int, str], commits: list[int]) -> None:
    for folder in ("offsets", "commits"):
        (root / sink / folder).mkdir(parents=True, exist_ok=True)
    for batch, text in offsets.items():
        (root / sink / "offsets" / str(batch)).write_text(text)
    for batch in commits:
        (root / sink / "commits" / str(batch)).write_text("v1")


def test_a_batch_in_flight_at_the_kill_and_committed_after_it_with_the_same_offsets_is_a_replay(tmp_path):
    _checkpoint(tmp_path, "cache", {4: "a", 5: "b"}, [4])
    _checkpoint(tmp_path, "search", {7: "c"}, [7])
    (flight,) = observe.in_flight(tmp_path)
    assert (flight.sink, flight.batch) == ("cache", 5)
    killed_at = (tmp_path / "cache" / "commits" / "4").stat().st_mtime
    assert observe.replayed(tmp_path, flight, killed_at) is None  # not committed yet
    _checkpoint(tmp_path, "cache", {}, [5])
    os.utime(tmp_path / "cache" / "commits" / "5", (killed_at + 3, killed_at + 3))
    assert observe.replayed(tmp_path, flight, killed_at) == observe.Replay("cache", 5, 3.0)


def test_a_batch_committed_before_the_kill_or_with_other_offsets_is_no_replay(tmp_path):
    _checkpoint(tmp_path, "cache", {5: "b"}, [])
    (flight,) = observe.in_flight(tmp_path)
    _checkpoint(tmp_path, "cache", {}, [5])
    committed = (tmp_path / "cache" / "commits" / "5").stat().st_mtime
    assert observe.replayed(tmp_path, flight, committed + 1) is False
    (tmp_path / "cache" / "offsets" / "5").write_text("other")
    assert observe.replayed(tmp_path, flight, committed - 1) is False


def test_a_ledger_with_a_gap_or_missing_an_acknowledged_commit_is_a_problem():
    assert LedgerState("chaos_ledger_1", 10, 1, 10, acknowledged=10).problems == []
    assert "a gap" in LedgerState("chaos_ledger_1", 9, 1, 10, acknowledged=10).problems[0]
    assert "below the acknowledged" in LedgerState("chaos_ledger_1", 8, 1, 8, acknowledged=9).problems[0]
    with pytest.raises(ValueError, match="migration 0003"):
        ledger_table(5)


def test_a_run_that_saw_no_duplicate_or_no_replay_is_invalid_even_when_verify_is_clean():
    report = Report("smoke", 1, "now", verify_passes=[[], []])
    report.judge(PROFILES["smoke"])
    assert not report.passed and len(report.failures) == 2
    clean = Report("smoke", 1, "now", verify_passes=[[], []], duplicates=3,
                   replays=[observe.Replay("cache", 5, 2.0)])
    clean.judge(PROFILES["smoke"])
    assert clean.passed


def test_only_a_profile_that_kills_connect_kafka_or_the_driver_must_show_duplicates_or_replays():
    workers_only = Profile("workers", writers=1, write_s=60.0, faults={"spark_worker": 1})
    report = Report("workers", 1, "now", verify_passes=[[], []])
    report.judge(workers_only)
    assert report.passed, "a worker's kill proves itself in the fault (executors started again elsewhere)"
    diverged = Report("workers", 1, "now", verify_passes=[[], ["a divergence"]])
    diverged.judge(workers_only)
    assert not diverged.passed


def test_without_the_demo_tables_the_chaos_pipeline_is_the_ledgers_in_every_sink_and_nothing_built_on_them():
    pipeline = chaos_pipeline(load(), writers=2, bulk=False, label="c1", demo=False)
    assert list(pipeline.tables) == ["chaos_ledger_1", "chaos_ledger_2"]
    assert all(pipeline.sink_tables(sink) == list(pipeline.tables) for sink in SINKS)
    assert not (pipeline.nested or pipeline.windows or pipeline.cache_aggregates)


def test_the_chaos_pipeline_captures_the_ledgers_under_names_of_its_own():
    base = load()
    pipeline = chaos_pipeline(base, writers=3, bulk=False, label="t1")
    assert set(pipeline.tables) == set(base.tables) | {"chaos_ledger_1", "chaos_ledger_2", "chaos_ledger_3"}
    assert pipeline.source.publication != base.source.publication and pipeline.source.slot != base.source.slot
    assert all(views.search.index.startswith("t1_") for views in pipeline.tables.values())
    assert set(pipeline.nested) == {f"t1_{name}_nested" for name in base.nested}


def test_tide_chaos_names_an_unknown_profile_and_the_choices_in_one_line():
    from typer.testing import CliRunner

    from services.cli import app

    result = CliRunner().invoke(app, ["chaos", "--profile", "nope"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: unknown profile nope: choose smoke, cluster or full"


def test_the_cluster_profile_is_refused_on_a_stack_without_it_before_anything_starts(tmp_path):
    from services.chaos.faults import ChaosError
    from services.chaos.run import prepare
    from services.settings import StackSettings

    with pytest.raises(ChaosError, match=r"cluster profile: set TIDE_SPARK_WORKERS=2 .* and TIDE_KAFKA_BROKERS=3"):
        prepare(StackSettings(state_dir=tmp_path), PROFILES["cluster"], 1, tmp_path / "chaos")
    assert not (tmp_path / "chaos").exists()
    assert PROFILES["cluster"].needs_cluster and not PROFILES["smoke"].needs_cluster


def test_a_killed_worker_needs_another_worker_and_a_killed_broker_two_other_brokers():
    cluster = PROFILES["cluster"]
    assert cluster.unmet(spark_workers=2, kafka_brokers=3) == []
    assert [need.split()[0] for need in cluster.unmet(spark_workers=1, kafka_brokers=2)] == [
        "TIDE_SPARK_WORKERS=2", "TIDE_KAFKA_BROKERS=3"]
    assert PROFILES["smoke"].unmet(spark_workers=0, kafka_brokers=1) == []


def test_the_cluster_profiles_topics_have_four_partitions_and_the_others_the_pipelines():
    base = load()
    assert chaos_pipeline(base, writers=2, bulk=False, label="c2", demo=False, partitions=4).source.partitions == 4
    assert chaos_pipeline(base, writers=2, bulk=False, label="c3").source.partitions == base.source.partitions
    assert PROFILES["cluster"].partitions == 4


def test_sigterm_during_a_run_unwinds_through_its_tear_down():
    torn_down = []
    with pytest.raises(SystemExit) as stopped, terminated_as_exit():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            torn_down.append(False)  # never reached: the handler runs as soon as kill returns
        finally:
            torn_down.append(True)
    assert stopped.value.code == 128 + signal.SIGTERM and torn_down == [True]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
