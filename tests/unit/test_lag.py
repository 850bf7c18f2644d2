import json

from services.jobs.lag import committed_offsets, records_behind
from spark_jobs.runtime.checkpoints import furthest, query_id


def test_records_behind_counts_each_partition_short_of_its_end():
    ends = {"t": {0: 10, 1: 5}, "u": {0: 3}}
    assert records_behind({"t": {0: 7, 1: 5}}, ends) == 3 + 0 + 3


def test_a_partition_past_an_earlier_end_counts_zero_and_does_not_cancel_another_lag():
    ends = {"t": {0: 10, 1: 5}}
    assert records_behind({"t": {0: 19, 1: 5}}, ends) == 0
    assert records_behind({"t": {0: 19, 1: 4}}, ends) == 1


def test_committed_offsets_come_from_the_newest_committed_batch(tmp_path):
    (tmp_path / "commits").mkdir()
    (tmp_path / "offsets").mkdir()
    for batch, offset in ((0, 4), (1, 9), (2, 12)):
        metadata = json.dumps({"batchWatermarkMs": 0})
        (tmp_path / "offsets" / str(batch)).write_text(f"v1\n{metadata}\n" + json.dumps({"t": {"0": offset}}))
    for batch in (0, 1):  # batch 2 is planned but not committed
        (tmp_path / "commits" / str(batch)).write_text("v1\n{}")
    assert committed_offsets(tmp_path) == {"t": {0: 9}}
    assert committed_offsets(tmp_path / "missing") == {}


def test_a_real_time_query_is_as_far_as_the_further_of_its_checkpoint_and_its_published_positions():
    checkpoint = {"t": {0: 9, 1: 4}, "u": {0: 2}}
    published = {"t": {0: 12, 1: 3}, "v": {0: 5}}  # partition 1's epoch committed after its last publish
    assert furthest(checkpoint, published) == {"t": {0: 12, 1: 4}, "u": {0: 2}, "v": {0: 5}}
    assert furthest(checkpoint, {}) == checkpoint


def test_the_query_id_naming_its_published_positions_is_the_one_in_its_checkpoint(tmp_path):
    assert query_id(tmp_path) is None  # not started yet
    (tmp_path / "metadata").write_text(json.dumps({"id": "0b6f5c1e-query"}))
    assert query_id(tmp_path) == "0b6f5c1e-query"
    (tmp_path / "metadata").write_text("{")  # half written
    assert query_id(tmp_path) is None
