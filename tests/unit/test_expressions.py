"""Expressions built once and reused: per Spark context and per the arguments that shape them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from spark_jobs.runtime.expressions import MAX_KEPT, frozen, reused


@dataclass(frozen=True)
class Shape:
    name: str
    columns: dict


def test_equal_contents_freeze_equal_and_different_contents_do_not():
    assert frozen({"b": [1, 2], "a": Shape("t", {"x": 1})}) == frozen({"a": Shape("t", {"x": 1}), "b": (1, 2)})
    assert frozen({"a": Shape("t", {"x": 1})}) != frozen({"a": Shape("t", {"x": 2})})
    assert frozen(["a", "b"]) != frozen(["b", "a"])
    assert frozen({"b", "a"}) == frozen({"a", "b"})


def test_pydantic_models_freeze_by_their_contents():
    from pydantic import BaseModel

    class View(BaseModel):
        root: str
        children: list[str]

    assert frozen({"v": View(root="a", children=["b"])}) == frozen({"v": View(root="a", children=["b"])})
    assert frozen({"v": View(root="a", children=["b"])}) != frozen({"v": View(root="a", children=["c"])})


def test_an_unhashable_leaf_is_refused():
    with pytest.raises(TypeError):
        frozen([bytearray(b"x")])


def test_a_builder_runs_once_per_context_and_arguments(spark):
    calls = []

    @reused
    def build(prefix, tables):
        calls.append((prefix, tuple(tables)))
        from pyspark.sql import functions as F

        return F.lit(prefix)

    first = build("p", ["a"])
    assert build("p", ["a"]) is first
    assert build("q", ["a"]) is not first
    assert calls == [("p", ("a",)), ("q", ("a",))]
    # The reused column still serves new DataFrames.
    assert [r[0] for r in spark.range(2).select(first).collect()] == ["p", "p"]


def test_kept_builds_are_bounded(spark):
    calls = []

    @reused
    def build(number):
        calls.append(number)
        return number

    for number in range(MAX_KEPT + 1):
        build(number)
    build(0)  # let go when the bound was reached, so built again
    assert calls.count(0) == 2
