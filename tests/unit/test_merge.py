"""Order-safety of the merge rules: any order, any duplicates of a row's history → the newest wins."""

from __future__ import annotations

import random
from dataclasses import replace
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.changes import Change
from spark_jobs.merge import (
    TRUNCATE_KEY,
    ZERO,
    applies,
    doc_id,
    group_key,
    keep_from,
    kept_columns,
    merged_row,
    newer,
    newest_per_row,
    stored_version,
)


def change(seq, op="u", key=1, after=None, unavailable=frozenset()):
    if after is None and op not in ("d", "t"):
        after = {"id": key, "name": f"v{seq}", "description": f"text {seq}"}
    return Change(
        table="products", op=op, key={} if op == "t" else {"id": key}, before=None, after=after,
        sequence=seq, lsn=seq[1], tx_id=None, commit_ts_ms=None, snapshot=None, unavailable=frozenset(unavailable),
    )


def test_doc_id_is_stable_for_single_and_composite_keys():
    assert doc_id({"id": 42}) == "42"
    assert doc_id({"order_id": 7, "line_no": 2}) == "[7,2]"
    assert doc_id({"order_id": 7, "line_no": 2}) == doc_id({"order_id": 7, "line_no": 2})


def test_very_long_keys_are_hashed_to_a_bounded_id():
    long_id = doc_id({"sku": "x" * 2000})
    assert long_id.startswith("sha256:") and len(long_id) < 100
    assert long_id == doc_id({"sku": "x" * 2000})


def test_truncates_of_a_table_share_one_group():
    assert group_key(change((5, 5), op="t")) == ("products", TRUNCATE_KEY)


def test_unchanged_toast_column_is_filled_from_the_older_change_in_the_batch():
    insert = change((1, 1), op="c")
    update = change((2, 2), after={"id": 1, "name": "v2"}, unavailable={"description"})
    merged = newer(update, insert)
    assert merged.after == {"id": 1, "name": "v2", "description": "text (1, 1)"}
    assert merged.unavailable == frozenset()
    assert merged.filled == {"description": (1, 1)}, "the filled value carries the version it came from"


def placeholder(seq, name=None):
    """An update that leaves the TOASTed description unchanged (Debezium's placeholder)."""
    return change(seq, after={"id": 1, "name": name or f"v{seq}"}, unavailable={"description"})


def test_a_stale_full_image_in_the_batch_does_not_overwrite_a_newer_stored_value():
    # The sink holds version 8 with D1 (set at 7); the batch holds P (10, placeholder) and a resent X' (5, D0).
    stale = change((5, 0), op="c", after={"id": 1, "name": "v5", "description": "D0"})
    (merged,) = newest_per_row([placeholder((10, 0)), stale])
    assert merged.sequence == (10, 0) and merged.after["description"] == "D0"
    assert keep_from(merged) == {"description": (5, 0)}
    stored = {"id": 1, "name": "v8", "description": "D1"}
    assert merged_row(merged, stored, (8, 0)) == {"id": 1, "name": "v(10, 0)", "description": "D1"}
    assert merged_row(merged, stored, (5, 0)) == {"id": 1, "name": "v(10, 0)", "description": "D1"}, "same source"
    # A sink behind the fill's source takes the filled value, and so does one without the row.
    assert merged_row(merged, {**stored, "description": "older"}, (4, 9))["description"] == "D0"
    assert merged_row(merged, None)["description"] == "D0"


def test_a_fill_carries_the_version_of_the_change_that_had_the_value_not_of_a_later_placeholder():
    (merged,) = newest_per_row([placeholder((10, 0)), placeholder((7, 0)), change((5, 0), op="c")])
    assert merged.after["description"] == "text (5, 0)" and merged.filled == {"description": (5, 0)}


def test_the_rule_unchanged_toast_columns_are_always_kept_filled_ones_if_the_row_reached_their_source():
    two_columns = replace(placeholder((10, 0)), unavailable=frozenset({"description", "notes"}))
    merged = newer(two_columns, change((6, 0), after={"id": 1, "name": "v6", "description": "D"}))
    assert keep_from(merged) == {"notes": ZERO, "description": (6, 0)}
    assert kept_columns(merged, (5, 9)) == {"notes"}
    assert kept_columns(merged, (6, 0)) == {"notes", "description"}


def test_stored_version_takes_row_tombstone_and_truncate_into_account():
    assert stored_version((3, 1), None, None) == (3, 1)
    assert stored_version((3, 1), (4, 0), None) == (4, 0)
    assert stored_version(None, None, (9, 9)) == (9, 9)
    assert not applies(change((4, 0)), (4, 0)), "an equal version is a replay"
    assert applies(change((4, 1)), (4, 0))


def test_snapshot_record_loses_to_any_streamed_change():
    snapshot = change((0, 500), op="r")
    streamed = change((100, 90))  # a transaction that began before the snapshot point and committed after it
    assert newer(snapshot, streamed) is streamed


def test_merged_row_keeps_the_stored_value_of_unavailable_columns():
    update = change((2, 2), after={"id": 1, "price": Decimal("3.00")}, unavailable={"description"})
    assert merged_row(update, {"id": 1, "price": Decimal("1.00"), "description": "kept"}, (1, 0)) == {
        "id": 1, "price": Decimal("3.00"), "description": "kept"
    }


history = st.lists(st.tuples(st.integers(1, 50), st.integers(0, 50)), min_size=1, max_size=30, unique=True)


@settings(max_examples=300, deadline=None)
@given(history, st.randoms(use_true_random=False), st.integers(0, 3))
def test_any_order_and_any_duplicates_of_a_rows_history_yield_the_newest(sequences, rnd: random.Random, dupes):
    versions = sorted(sequences)
    ops = ["c"] + [rnd.choice(["u", "u", "d"]) for _ in versions[1:]]
    events = [change(v, op=op) for v, op in zip(versions, ops)]
    delivered = events + [rnd.choice(events) for _ in range(dupes)]
    rnd.shuffle(delivered)
    (winner,) = newest_per_row(delivered)
    assert winner.sequence == versions[-1] and winner.op == ops[-1]

    # Applied one by one with the guard, in any order, the sink ends at the newest version too.
    held = None
    for event in delivered:
        if applies(event, stored_version(held, None, None)):
            held = event.sequence
    assert held == versions[-1]


def reduce_in_any_grouping(changes, rnd: random.Random):
    """newer() applied the way Spark may: pairs of partial results, in any grouping and order."""
    pending = list(changes)
    while len(pending) > 1:
        a, b = pending.pop(rnd.randrange(len(pending))), pending.pop(rnd.randrange(len(pending)))
        pending.append(newer(a, b))
    return pending[0]


@settings(max_examples=300, deadline=None)
@given(history, st.lists(st.booleans(), min_size=30, max_size=30), st.randoms(use_true_random=False))
def test_filling_is_the_same_in_any_order_and_grouping_and_takes_the_newest_value(sequences, toasted, rnd):
    versions = sorted(sequences)
    events = [placeholder(v) if is_placeholder else change(v) for v, is_placeholder in zip(versions, toasted)]
    delivered = events + [rnd.choice(events)]
    rnd.shuffle(delivered)
    merged = reduce_in_any_grouping(delivered, rnd)
    assert merged == reduce_in_any_grouping(events, rnd) == newest_per_row(events)[0]
    sources = [e.sequence for e in events if "description" in e.after]
    if merged.unavailable:
        assert not sources
    elif "description" in merged.filled:
        assert merged.filled["description"] == sources[-1]
        assert merged.after["description"] == f"text {sources[-1]}"
    else:
        assert sources[-1] == merged.sequence  # the newest change carried the value itself
