"""The newest change per row, in Spark: ordering, duplicates, deletes, truncates, TOAST filling."""

from __future__ import annotations

import itertools

from spark_jobs.changes.newest import newest_per_row
from tests.unit.spark_frames import change, frame


def newest(spark, rows):
    return {(r["table"], r["row_id"] or r["op"]): r.asDict(recursive=True)
            for r in newest_per_row(frame(spark, rows)).collect()}


def version(row):
    return (row["version"]["major"], row["version"]["minor"])


def every_order(history):
    """Each order of `history` as the history of a row of its own (key = the order's number): one frame."""
    rows = []
    for number, order in enumerate(itertools.permutations(history)):
        for item in order:
            keyed = {**item, "row_id": str(number), "key": {"id": str(number)}}
            rows.append({**keyed, "after": None if item["after"] is None else {**item["after"], "id": str(number)}})
    return rows


def test_the_newest_version_wins_in_any_order(spark):
    history = [change((5, 1)), change((5, 2)), change((7, 0)), change((6, 9))]
    result = newest(spark, every_order(history))
    assert len(result) == 24
    assert {version(row) for row in result.values()} == {(7, 0)}
    assert {row["after"]["name"] for row in result.values()} == {"v(7, 0)"}


def test_rows_tables_truncates_and_letters_are_kept_apart(spark):
    rows = [change((5, 1), key=1), change((5, 2), key=2), change((4, 0), table="orders", key=1),
            change((3, 0), op="t"), change((8, 0), op="t"), change((9, 0), op="t", table="orders"),
            change((1, 1), error="value is not JSON", offset=10), change((1, 1), error="value is not JSON", offset=11)]
    result = newest_per_row(frame(spark, rows)).collect()
    assert len(result) == 7
    truncates = {r["table"]: version(r) for r in result if r["op"] == "t"}
    assert truncates == {"products": (8, 0), "orders": (9, 0)}
    assert sorted(r["origin"]["offset"] for r in result if r["error"]) == [10, 11]


def test_unchanged_toast_column_is_filled_from_the_older_change_with_its_version(spark):
    full = change((5, 1), after={"id": "1", "name": "a", "description": "long text"})
    partial = change((6, 2), after={"id": "1", "name": "b"}, unavailable=("description",))
    for order in ([full, partial], [partial, full]):
        row = newest(spark, order)[("products", "1")]
        assert row["after"] == {"id": "1", "name": "b", "description": "long text"}
        assert row["unavailable"] == []
        assert row["filled"] == {"description": {"major": 5, "minor": 1}}
        assert version(row) == (6, 2)


def test_a_fill_carries_the_version_of_the_change_that_had_the_value(spark):
    full = change((5, 1), after={"id": "1", "name": "a", "description": "long text"})
    middle = change((6, 0), after={"id": "1", "name": "b"}, unavailable=("description",))
    last = change((7, 0), after={"id": "1", "name": "c"}, unavailable=("description",))
    result = newest(spark, every_order([full, middle, last]))
    assert len(result) == 6
    for row in result.values():
        assert row["after"]["description"] == "long text" and row["after"]["name"] == "c"
        assert row["filled"] == {"description": {"major": 5, "minor": 1}}


def test_nothing_is_filled_across_a_delete(spark):
    full = change((5, 1), after={"id": "1", "name": "a", "description": "long text"})
    delete = change((6, 0), op="d")
    partial = change((7, 0), op="c", after={"id": "1", "name": "b"}, unavailable=("description",))
    row = newest(spark, [partial, full, delete])[("products", "1")]
    assert row["unavailable"] == ["description"] and "description" not in row["after"]
    assert row["filled"] == {}


def test_a_delete_is_the_newest_when_it_is_last(spark):
    row = newest(spark, [change((5, 1)), change((6, 0), op="d")])[("products", "1")]
    assert row["op"] == "d" and row["after"] is None


def test_a_duplicate_changes_nothing(spark):
    once = newest(spark, [change((5, 1)), change((6, 0))])
    twice = newest(spark, [change((5, 1)), change((6, 0)), change((6, 0)), change((5, 1))])
    assert once == twice
