"""SCD type 2 history, the pure rules: every committed version of a row, with its validity interval.

A row's versions are its changes ordered by `Change.sequence` (commit order). Version i is valid
from its commit time until the commit time of version i+1; the newest version is current unless it
is a delete. A delete is a version of its own (op 'd', no column values): it closes the version
before it and is never current. The warehouse sink computes the same intervals in Spark SQL
(`spark_jobs/sinks/delta_history.py`); `intervals` is the reference `tide verify` checks it against.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

Version = tuple[int, int]

# Operations that end a row: a delete, or a truncate of its table. Such a version is never current.
ENDS = ("d", "t")


def intervals(versions: Sequence[tuple[Version, datetime | None, str]]) -> list[tuple[datetime | None, bool]]:
    """(valid_to, is_current) of each (version, valid_from, op) of one row, in the order given.

    valid_to is the valid_from of the next version in commit order (None for the newest);
    only the newest version can be current, and only if it does not end the row (ENDS)."""
    order = sorted(range(len(versions)), key=lambda index: versions[index][0])
    result: list[tuple[datetime | None, bool]] = [(None, False)] * len(versions)
    for position, index in enumerate(order):
        following = order[position + 1] if position + 1 < len(order) else None
        valid_to = versions[following][1] if following is not None else None
        result[index] = (valid_to, following is None and versions[index][2] not in ENDS)
    return result
