"""The Delta sinks' version rule and MERGE as generated SQL text (as PeerDB's merge_stmt_generator_test),
and the rule's meaning, evaluated by Spark SQL on literals."""

from __future__ import annotations

import itertools

import pytest

from spark_jobs.sinks.delta._facts import Facts, inserts_only, key_range
from spark_jobs.sinks.delta._merge import in_key_range, merge_text
from spark_jobs.sinks.delta._version import Version, keep_stored, newer, newer_or_absent, not_newer, quote, text

S, T = Version.of("s"), Version.of("t")


def test_newer_is_lexicographic_on_major_then_minor():
    assert newer(S, T) == ("(s.`tl_version_major` > t.`tl_version_major` "
                           "OR (s.`tl_version_major` = t.`tl_version_major` "
                           "AND s.`tl_version_minor` > t.`tl_version_minor`))")


def test_the_other_forms_are_built_from_newer():
    tomb = Version.of("s", "_tomb_major", "_tomb_minor")
    assert not_newer(Version.of(), Version.literal((5, 0))) == \
        "NOT (`tl_version_major` > 5L OR (`tl_version_major` = 5L AND `tl_version_minor` > 0L))"
    assert newer_or_absent(S, tomb) == f"(s.`_tomb_major` IS NULL OR {newer(S, tomb)})"
    assert keep_stored(Version.field("k"), T) == f"NOT {newer(Version.field('k'), T)}"
    assert Version.field("s.version") == Version("s.version.major", "s.version.minor")


def test_names_and_texts_are_quoted():
    assert quote("we`ird") == "`we``ird`"
    assert text("it's \\ here") == "'it\\'s \\\\ here'"


def test_the_merge_guards_each_clause_and_keeps_toast_columns_by_the_fill_version():
    merge = merge_text(("id",), ["name", "description"])
    guard = newer(S, T)
    assert merge.on == "t.`id` = s.`id`"
    assert merge.delete_when == f"{guard} AND s._op = 'd'"
    assert merge.update_when == guard
    keep = keep_stored(Version.field("try_element_at(s._keep, 'description')"), T)
    assert merge.update_set["`description`"] == f"CASE WHEN {keep} THEN t.`description` ELSE s.`description` END"
    assert list(merge.update_set) == ["`name`", "`description`", "`tl_version_major`", "`tl_version_minor`",
                                      "`tl_commit_ts`"]
    assert merge.insert_when == f"s._op <> 'd' AND {newer_or_absent(S, Version.of('s', '_tomb_major', '_tomb_minor'))}"
    assert list(merge.insert_values) == ["`id`", "`name`", "`description`", "`tl_version_major`", "`tl_version_minor`",
                                         "`tl_commit_ts`"]
    assert "`id`" not in merge.update_set, "a key is never updated"


def test_a_composite_key_joins_on_every_column_and_a_key_range_prunes_only_one_column_keys():
    assert merge_text(("order_id", "line_no"), ["quantity"], (1, 9)).on \
        == "t.`order_id` = s.`order_id` AND t.`line_no` = s.`line_no`"
    assert merge_text(("id",), ["name"], (3, 70)).on == "t.`id` = s.`id` AND t.`id` BETWEEN 3L AND 70L"


def test_a_key_range_is_known_only_when_both_ends_are_and_bounds_text_and_numbers():
    assert key_range(Facts(extra={"low_orders": 3, "high_orders": 70}), "orders") == (3, 70)
    assert key_range(Facts(extra={"low_orders": None, "high_orders": None}), "orders") is None
    assert key_range(Facts(extra={"low_orders": 3, "high_orders": 70}), "products") is None
    assert in_key_range("t.`id`", (3, 70)) == "t.`id` BETWEEN 3L AND 70L"
    assert in_key_range("`sku`", ("a'b", "z")) == "`sku` BETWEEN 'a\\'b' AND 'z'"


def test_only_a_batch_of_reads_and_inserts_may_be_appended():
    assert inserts_only(Facts(rows=5))
    assert not inserts_only(Facts(rows=5, not_inserts=1)), "an update or delete may match a held row"
    assert not inserts_only(Facts()), "nothing to write"


def test_the_whole_statement_reads_as_sql():
    sql = merge_text(("id",), ["name"]).sql("delta.`/w/products`", "batch")
    assert sql.startswith("MERGE INTO delta.`/w/products` t USING batch s ON t.`id` = s.`id` WHEN MATCHED AND (s.")
    assert " THEN DELETE WHEN MATCHED AND " in sql and " THEN UPDATE SET `name` = CASE WHEN " in sql
    assert sql.endswith("VALUES (s.`id`, s.`name`, s.`tl_version_major`, s.`tl_version_minor`, s.`tl_commit_ts`)")


VERSIONS = [(0, 5), (3, 1), (3, 2), (4, 0)]


@pytest.mark.parametrize(("a", "b"), list(itertools.product(VERSIONS, VERSIONS)))
def test_spark_evaluates_newer_as_python_compares_tuples(spark, a, b):
    found = spark.sql(f"SELECT {newer(Version.literal(a), Version.literal(b))} AS n").first()["n"]
    assert found is (a > b)


def test_a_missing_version_makes_newer_null_and_newer_or_absent_true(spark):
    absent = Version("CAST(NULL AS BIGINT)", "CAST(NULL AS BIGINT)")
    row = spark.sql(f"SELECT {newer(Version.literal((1, 1)), absent)} AS n, "
                    f"{newer_or_absent(Version.literal((1, 1)), absent)} AS a, "
                    f"{keep_stored(absent, Version.literal((1, 1)))} AS k").first()
    assert row["n"] is None and row["a"] is True and row["k"] is None
