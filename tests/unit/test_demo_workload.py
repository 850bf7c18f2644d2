"""The demo workload's statements: rows picked by key, never by sorting a table (the load generator
must offer PostgreSQL's own ceiling, docs/benchmarks.md); the text is checked, the behaviour is in
tests/integration/test_demo_load.py."""

from __future__ import annotations

import random
import re

from services.demo import workload

STATEMENTS = {name: value for name, value in vars(workload).items() if name.isupper() and isinstance(value, str)}
STATEMENTS |= {f"DELETE_UNUSED[{table}]": sql for table, sql in workload.DELETE_UNUSED.items()}


def test_no_statement_sorts_a_table_by_random():
    assert STATEMENTS, "no statements found"
    for name, sql in STATEMENTS.items():
        assert "random()" not in sql.lower(), name


def test_a_pick_takes_the_first_key_at_a_random_point_of_the_live_range():
    sql = workload.pick_sql("customers")
    assert "min(id) + floor(%(at)s * (max(id) - min(id) + 1))" in sql
    assert re.search(r"WHERE id >= .* ORDER BY id LIMIT 1\)$", sql)


def test_a_filtered_pick_falls_back_to_the_first_match_of_the_table():
    sql = workload.pick_sql("orders", where="status = 'cancelled'")
    after_point, from_start = sql.split(" UNION ALL ")
    assert "status = 'cancelled' AND id >= " in after_point
    assert from_start.startswith("(SELECT id FROM orders WHERE status = 'cancelled' ORDER BY id LIMIT 1)")


def test_an_unused_row_is_sought_in_a_bounded_window_with_the_probes_kept():
    sql = workload.DELETE_UNUSED["customers"]
    assert sql.count(f"LIMIT {workload.UNUSED_WINDOW}") == 2  # after the point, then from the start
    assert f"NOT LIKE '%%@{workload.PROBE_DOMAIN}'" in sql  # freshness markers are never deleted


def test_descriptions_are_toasted_sizes_and_follow_the_seed():
    sizes = [len(workload.description(random.Random(seed))) for seed in range(200)]
    assert min(sizes) >= 1_600 and max(sizes) <= 22_400
    assert workload.description(random.Random(7)) == workload.description(random.Random(7))
