"""How a query continues without a removed table's topic and how a batch that keeps failing is planned again smaller
(spark_jobs/runtime/checkpoints.py), and which queries a
re-read pipeline.yaml restarts (spark_jobs/runtime/reload.py). Pure: folders written as Spark writes them."""

import json

from spark_jobs.model.config import load
from spark_jobs.runtime import checkpoints, reload


def write_batch(checkpoint, batch: int, offsets: dict, committed: bool = True) -> None:
    for folder in ("offsets", "commits"):
        (checkpoint / folder).mkdir(parents=True, exist_ok=True)
    source = {topic: {str(p): o for p, o in parts.items()} for topic, parts in offsets.items()}
    (checkpoint / "offsets" / str(batch)).write_text(f"v1\n{json.dumps({'batchWatermarkMs': 0})}\n{json.dumps(source)}")
    if committed:
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}")


def test_a_query_without_a_retired_checkpoint_reads_from_the_earliest_offsets(tmp_path):
    assert checkpoints.starting_offsets(tmp_path / "search", ["t.a"], 3) == "earliest"
    write_batch(tmp_path / "search", 0, {"t.a": {0: 5}})
    assert checkpoints.starting_offsets(tmp_path / "search", ["t.a"], 3) == "earliest"  # Spark resumes itself


def test_retiring_continues_where_the_old_checkpoint_committed_less_the_removed_topic(tmp_path):
    search = tmp_path / "search"
    write_batch(search, 0, {"t.a": {0: 5, 1: 2}, "t.gone": {0: 9}})
    write_batch(search, 1, {"t.a": {0: 7, 1: 3}, "t.gone": {0: 11}})
    write_batch(search, 2, {"t.a": {0: 8, 1: 3}, "t.gone": {0: 12}}, committed=False)  # replayed: not committed
    checkpoints.retire(search)
    assert not search.exists() and checkpoints.retired(search).is_dir()
    assert json.loads(checkpoints.starting_offsets(search, ["t.a", "t.new"], 2)) == {
        "t.a": {"0": 7, "1": 3}, "t.new": {"0": checkpoints.EARLIEST, "1": checkpoints.EARLIEST}}
    assert checkpoints.committed_offsets(search) == {"t.a": {0: 7, 1: 3}, "t.gone": {0: 11}}  # lag, meanwhile


def test_a_second_removal_before_the_new_checkpoint_commits_keeps_the_first_retired_one(tmp_path):
    search = tmp_path / "search"
    write_batch(search, 4, {"t.a": {0: 7}, "t.b": {0: 1}, "t.c": {0: 2}})
    checkpoints.retire(search)
    write_batch(search, 0, {"t.a": {0: 7}}, committed=False)  # the new query planned a batch, then stopped
    checkpoints.retire(search)
    assert json.loads(checkpoints.starting_offsets(search, ["t.a"], 1)) == {"t.a": {"0": 7}}


def test_the_retired_checkpoint_is_dropped_once_the_new_one_has_committed(tmp_path):
    search = tmp_path / "search"
    write_batch(search, 3, {"t.a": {0: 7}, "t.b": {0: 1}})
    checkpoints.retire(search)
    checkpoints.drop_retired(search)
    assert checkpoints.retired(search).is_dir()  # nothing committed yet: still where to start from
    write_batch(search, 0, {"t.a": {0: 9}})
    checkpoints.drop_retired(search)
    assert not checkpoints.retired(search).exists()
    assert checkpoints.committed_offsets(search) == {"t.a": {0: 9}}


def test_a_batch_that_did_not_finish_twice_is_planned_again_under_a_halved_cap_per_further_start(tmp_path):
    analytics = tmp_path / "analytics"
    write_batch(analytics, 2, {"t.a": {0: 100}})
    write_batch(analytics, 3, {"t.a": {0: 100_100}}, committed=False)  # the driver died in batch 3
    (analytics / "offsets" / ".3.crc").write_text("")
    assert checkpoints.batch_cap(analytics, 100_000) == 100_000  # replayed as planned once
    assert (analytics / "offsets" / "3").exists()
    assert checkpoints.batch_cap(analytics, 100_000) == 50_000  # ... and it died again
    assert not (analytics / "offsets" / "3").exists() and not (analytics / "offsets" / ".3.crc").exists()
    assert checkpoints.pending_batch(analytics) is None  # Spark plans batch 3 again from batch 2's end
    assert checkpoints.committed_offsets(analytics) == {"t.a": {0: 100}}
    write_batch(analytics, 3, {"t.a": {0: 50_100}}, committed=False)  # planned again, and died once more
    assert checkpoints.batch_cap(analytics, 100_000) == 25_000
    for _ in range(10):
        write_batch(analytics, 3, {"t.a": {0: 1_100}}, committed=False)
        assert checkpoints.batch_cap(analytics, 100_000) >= checkpoints.MIN_REPLANNED


def test_the_count_of_attempts_starts_again_with_each_batch_and_ends_when_it_commits(tmp_path):
    warehouse = tmp_path / "warehouse"
    assert checkpoints.batch_cap(warehouse, 20_000) == 20_000  # a new checkpoint
    write_batch(warehouse, 0, {"t.a": {0: 10}}, committed=False)
    assert checkpoints.batch_cap(warehouse, 20_000) == 20_000
    write_batch(warehouse, 0, {"t.a": {0: 10}})  # the replay committed ...
    write_batch(warehouse, 1, {"t.a": {0: 30}}, committed=False)  # ... and the next batch was interrupted
    assert checkpoints.batch_cap(warehouse, 20_000) == 20_000  # a first interruption of batch 1
    write_batch(warehouse, 1, {"t.a": {0: 30}})
    assert checkpoints.batch_cap(warehouse, 20_000) == 20_000
    assert not (warehouse / checkpoints.ATTEMPTS).exists()
    write_batch(warehouse, 2, {"t.a": {0: 31}}, committed=False)
    assert checkpoints.batch_cap(warehouse, 500) == 500  # a cap below the floor is never raised
    assert checkpoints.batch_cap(warehouse, 500) == 500


DEMO = load()


def test_adding_a_table_restarts_only_the_queries_that_read_it():
    added = DEMO.model_copy(update={"tables": {**DEMO.tables, "notes": DEMO.tables["order_items"]}})
    assert reload.refusal(DEMO, added) is None
    changed = reload.changes(DEMO, added, ["search", "cache", "warehouse", "analytics"])
    assert sorted(changed) == ["cache", "search", "warehouse"]  # notes has no history: analytics runs on
    assert changed["search"].after - changed["search"].before == {"notes"} and not changed["search"].removed


def test_removing_a_table_marks_it_removed_from_each_query_that_read_it():
    without = DEMO.model_copy(update={"tables": {t: v for t, v in DEMO.tables.items() if t != "customers"},
                                      "nested": {}, "cache_aggregates": {}})
    assert reload.refusal(DEMO, without) is not None  # nested views and aggregates changed too
    base = DEMO.model_copy(update={"nested": {}, "cache_aggregates": {}})
    changed = reload.changes(base, without, ["search", "cache", "warehouse", "analytics"])
    assert {sink: set(change.removed) for sink, change in changed.items()} == \
        {sink: {"customers"} for sink in ("search", "cache", "warehouse", "analytics")}


def test_any_other_change_is_refused_with_the_restart_to_run():
    edited = DEMO.model_copy(update={"tables": {**DEMO.tables, "orders": DEMO.tables["order_items"]}})
    assert reload.refusal(DEMO, edited) == ("pipeline.yaml changed the views of orders: restart the jobs to apply "
                                            "it (`tide jobs stop`, `tide jobs start`)")
    source = DEMO.model_copy(update={"source": DEMO.source.model_copy(update={"partitions": 6})})
    assert reload.refusal(DEMO, source).startswith("pipeline.yaml changed more than its tables")


def test_tables_waits_until_every_query_reads_its_tables_and_runs_them_and_fails_on_a_stopped_one(tmp_path):
    import pytest

    from services.jobs import driver
    from services.settings import StackSettings
    from services.stack.service import StackError
    from services.tables.jobs import _applied

    settings = StackSettings(state_dir=tmp_path)
    pipeline = DEMO

    def status(request="r1", error=None, **search) -> None:
        queries = {sink: {"active": True, "paused": False, "last_error": None, "batch_id": 3,
                          "tables": pipeline.sink_tables(sink)}
                   for sink in ("search", "cache", "warehouse", "analytics")}
        queries["search"].update(search)
        driver.status_file(settings).parent.mkdir(parents=True, exist_ok=True)
        driver.status_file(settings).write_text(json.dumps({"queries": queries,
                                                            "reload": {"request": request, "error": error}}))

    status(request="r0")
    assert not _applied(settings, pipeline, "r1")  # the driver has not seen the request yet
    status(tables=["customers"])
    assert not _applied(settings, pipeline, "r1")  # still on its old tables
    status(batch_id=None)
    assert not _applied(settings, pipeline, "r1")  # restarted, no progress yet
    status()
    assert _applied(settings, pipeline, "r1")
    status(batch_id=None, running=True)
    assert _applied(settings, pipeline, "r1")  # a real-time query in its first epoch for a few seconds
    status(active=False, last_error="Partitions Set(t-0) have been deleted")
    with pytest.raises(StackError, match="the search query stopped on its new tables: Partitions Set"):
        _applied(settings, pipeline, "r1")
    status(error="pipeline.yaml changed the views of orders")
    with pytest.raises(StackError, match=r"the apply jobs kept their tables: pipeline\.yaml changed the views"):
        _applied(settings, pipeline, "r1")


def test_files_written_by_many_threads_at_once_end_whole_and_leave_no_temporary_file(tmp_path):
    """Two queries' threads seeing the same new catalogue write its cache at once (the CI failure of
    `tide tables remove`: one renamed the other's temporary file away)."""
    from concurrent.futures import ThreadPoolExecutor

    from spark_jobs.model.files import replace_text

    target = tmp_path / "checkpoints" / "catalogue.json"
    texts = [json.dumps({"writer": n, "padding": "x" * 20_000}) for n in range(8)]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(25):
            list(pool.map(lambda text: replace_text(target, text), texts))
            assert target.read_text() in texts
    assert [path.name for path in target.parent.iterdir()] == ["catalogue.json"]
