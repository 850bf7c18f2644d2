import json

from services.jobs.lag import committed_offsets, records_behind


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
