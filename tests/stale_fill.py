"""The stale-fill case every sink is tested on (docs/reliability.md, "Found by the chaos runner").

A micro-batch holds, for one row, an update whose TOASTed description is Debezium's placeholder
(version 10) and an old full image of the row sent again (version 5, description D0). The newest
per row (spark_jobs/changes/newest.py) fills D0 into the update, from version 5; whether the sink keeps its
own value depends on the version its stored row has reached:

- key 1: stored at version 8 with D1 (a later edit than D0) → D1 stays;
- key 2: stored at version 4 with an earlier value → D0 (the newest value known);
- key 3: not stored → D0.

Each sink test applies `stored_first()` and then `batch()` (CHANGE rows of `products`) and checks every
key has version 10's name and `EXPECTED`.
"""

from __future__ import annotations

from typing import Any

from tests.unit.spark_frames import change

UPDATE, STALE = (10, 0), (5, 0)
EXPECTED = {1: "D1", 2: "D0", 3: "D0"}


def product(version: tuple[int, int], key: int, description: str | None) -> dict[str, Any]:
    """An upsert of products; no description means Debezium's placeholder."""
    after = {"id": str(key), "name": f"v{version}"} | ({} if description is None else {"description": description})
    return change(version, key=key, after=after, unavailable=() if description is not None else ("description",))


def stored_first() -> list[dict[str, Any]]:
    """What the sink holds before the batch (keys 1 and 2)."""
    return [product((8, 0), 1, "D1"), product((4, 0), 2, "D-before")]


def batch() -> list[dict[str, Any]]:
    """The micro-batch: per key the update with the placeholder and the stale full image."""
    return [row for key in EXPECTED for row in (product(UPDATE, key, None), product(STALE, key, "D0"))]
