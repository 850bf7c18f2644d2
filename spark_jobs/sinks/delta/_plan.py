"""What one table's Delta columns become for a batch: decided on the driver from the catalogue, the
stored schema and the batch's facts (no data is read here).

- The table's columns are the catalogue's (less the pipeline's `exclude_columns`, which never reach
  Kafka), plus any column the batch carries that the catalogue does not know (a dropped column in an
  old record of a replayed topic), kept as text. A new column is added (ADD COLUMNS) before the
  MERGE, so a column added at the source flows without a restart.
- A column whose catalogue type is wider than the stored one, in a way Delta widens in place
  (short→int→long, float→double, decimal growing on both sides), is widened. A narrower type is
  stored in the wider column.
- Any other difference is an incompatible type change: every upsert carrying the column is rejected
  with the reason (`refused`), and the rest of the batch applies.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from pyspark.sql.types import DataType

from spark_jobs.model.catalogue import TableSchema
from spark_jobs.sinks.base import META_PREFIX
from spark_jobs.sinks.delta._types import fits, spark_type


@dataclass(frozen=True)
class TablePlan:
    """One table's columns for a batch: `fields` in the table's order with the types the table holds
    after `added` and `widened` are applied."""

    table: str
    keys: tuple[str, ...]
    fields: dict[str, DataType]
    added: tuple[str, ...] = ()
    widened: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)  # column -> why an upsert carrying it is rejected

    @property
    def data_columns(self) -> list[str]:
        return [column for column in self.fields if column not in self.keys]


def plan_table(table: str, schema: TableSchema | None, stored: dict[str, DataType] | None,
               batch_columns: list[str], batch_keys: list[str], excluded: Collection[str] = ()) -> TablePlan:
    """The plan for `table`. `stored` holds the table's data columns (None: no table yet);
    `batch_columns`/`batch_keys` are the column and key names the batch's changes carry."""
    catalogue = {name: column for name, column in (schema.columns.items() if schema else ()) if name not in excluded}
    keys = tuple(schema.primary_key) if schema and schema.primary_key else tuple(batch_keys)
    wanted: dict[str, DataType] = {name: spark_type(column) for name, column in catalogue.items()}
    for name in [*keys, *batch_columns]:
        if name not in wanted and not name.startswith(META_PREFIX):
            wanted[name] = spark_type(None)
    stored = stored or {}
    fields: dict[str, DataType] = dict(stored)
    added, widened, refused = [], [], {}
    for name, dtype in wanted.items():
        held = stored.get(name)
        if held is None:
            fields[name] = dtype
            added.append(name)
        elif held != dtype and fits(held, dtype):
            fields[name] = dtype
            widened.append(name)
        elif not fits(dtype, held):
            source = catalogue[name].type if name in catalogue else "unknown"
            refused[name] = (f"{table}.{name}: the warehouse column is {held.simpleString()} but the change has "
                             f"{dtype.simpleString()} (PostgreSQL {source}), an incompatible type change")
    return TablePlan(table, keys, fields, tuple(added) if stored else (), tuple(widened), refused)


__all__ = ["TablePlan", "plan_table"]
