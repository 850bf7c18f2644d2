"""Column expressions built once per Spark session and reused by every micro-batch.

Building an expression tree from Python costs a py4j round trip per node, and the decoder, the
newest-per-row fold and a sink's payload are thousands of nodes: measured 6,431 round trips and 1.4 s
of a 300-record cache batch's 4.6 s (docs/apply.md). Expressions are immutable and unresolved until a
DataFrame uses them, so the same `Column` objects serve every batch. `reused` keeps what a builder
returned per Spark context and per the arguments that shaped it (tables, catalogue, prefixes).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Mapping
from typing import Any, ParamSpec, TypeVar

from pydantic import BaseModel

P = ParamSpec("P")
T = TypeVar("T")

# A catalogue change (a column added at the source) shapes new expressions; older ones are let go.
MAX_KEPT = 32


def frozen(value: Any) -> Hashable:
    """`value` as a hashable equivalent: mappings, sequences, dataclasses and pydantic models by their contents."""
    if isinstance(value, Mapping):
        return ("map", tuple(sorted((frozen(k), frozen(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(frozen(item) for item in value))
    if isinstance(value, (set, frozenset)):
        # a set's items are of one kind, and their frozen forms compare as they do
        return ("set", tuple(sorted(frozen(item) for item in value)))  # type: ignore[type-var]
    if isinstance(value, BaseModel):
        return (type(value).__qualname__, frozen(value.model_dump()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__, tuple(frozen(getattr(value, f.name)) for f in dataclasses.fields(value)))
    hash(value)  # anything else must be hashable itself (str, int, bool, None, enums)
    return value


def reused(build: Callable[P, T]) -> Callable[P, T]:
    """`build` (a function returning Columns) called once per Spark context and arguments."""
    kept: dict[Hashable, T] = {}

    @functools.wraps(build)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        from pyspark import SparkContext

        # The context itself, not its id: a stopped context's expressions must not serve a new one.
        key = (SparkContext._active_spark_context, frozen(args), frozen(kwargs))
        if key not in kept:
            if len(kept) >= MAX_KEPT:
                kept.clear()
            kept[key] = build(*args, **kwargs)
        return kept[key]

    return wrapper


__all__ = ["frozen", "reused"]
