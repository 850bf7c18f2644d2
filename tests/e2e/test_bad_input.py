"""Bad input in a change topic, on the running pipeline of conftest.py (docs/reliability.md,
Bad-input catalogue): a well-formed change of a table pipeline.yaml does not name is dead-lettered
by every sink with the reason, and the changes after it still apply. (Malformed JSON:
tests/e2e/test_apply.py.)"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.e2e.support import dead_lettered_by_every_sink

pytestmark = pytest.mark.stack

RECORDS = Path(__file__).parents[1] / "unit" / "fixtures" / "debezium_records.json"


def _record_of_another_table(table: str) -> tuple[bytes, bytes]:
    """A real Debezium insert (captured from the stack) whose source names `table`."""
    record = next(r for r in json.loads(RECORDS.read_text()) if r["name"] == "customers_snapshot")
    value = json.loads(record["value"])
    value["source"]["table"] = table
    return record["key"].encode(), json.dumps(value).encode()


def test_a_change_of_an_unknown_table_is_dead_lettered_by_every_sink_and_later_changes_apply(run, stack):
    _, pipeline, _ = run
    topic, table = pipeline.topic("customers"), f"no_such_table_{uuid.uuid4().hex[:6]}"
    key, value = _record_of_another_table(table)
    letters = dead_lettered_by_every_sink(stack, topic, key, value, "stray record")
    assert all(f"table {table} is not configured in pipeline.yaml" in letter["reason"] for letter in letters), letters
