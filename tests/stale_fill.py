"""The stale-fill case every sink is tested on (docs/reliability.md, "Found by the chaos runner").

A micro-batch holds, for one row, an update whose TOASTed description is Debezium's placeholder
(version 10) and an old full image of the row sent again (version 5, description D0).
`merge.newest_per_row` fills D0 into the update, from version 5; whether the sink keeps its own
value depends on the version its stored row has reached:

- key 1: stored at version 8 with D1 (a later edit than D0) → D1 stays;
- key 2: stored at version 4 with an earlier value → D0 (the newest value known);
- key 3: not stored → D0.

Each sink test passes `make(sequence, key, description)` building an upsert of `products` (no
description: the placeholder) and checks every key has version 10's other columns and `EXPECTED`.
"""

from __future__ import annotations

from collections.abc import Callable

from spark_jobs.changes import Change
from spark_jobs.merge import newest_per_row

UPDATE, STALE = (10, 0), (5, 0)
EXPECTED = {1: "D1", 2: "D0", 3: "D0"}
Make = Callable[[tuple[int, int], int, "str | None"], Change]


def stored_first(make: Make) -> list[Change]:
    """What the sink holds before the batch (keys 1 and 2)."""
    return [make((8, 0), 1, "D1"), make((4, 0), 2, "D-before")]


def batch(make: Make) -> list[Change]:
    """The micro-batch as the pipeline hands it to a sink: the newest change per row, filled."""
    changes = [change for key in EXPECTED for change in (make(UPDATE, key, None), make(STALE, key, "D0"))]
    merged = newest_per_row(changes)
    assert all(change.sequence == UPDATE and change.filled == {"description": STALE} for change in merged)
    return merged
