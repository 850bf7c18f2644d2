"""Which queries a changed pipeline.yaml touches, when the running driver re-reads it (pure).

Only the captured tables may change under a running driver (`tide tables add | remove`): a query
whose tables changed restarts with its new subscription; every other query runs on. Any other
change (a view's fields, aggregates, windows, the source) needs the jobs restarted, and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.model.config import PipelineConfig


@dataclass(frozen=True)
class TableChange:
    """One sink's tables before and after."""

    before: frozenset[str]
    after: frozenset[str]

    @property
    def removed(self) -> frozenset[str]:
        return self.before - self.after


def refusal(old: PipelineConfig, new: PipelineConfig) -> str | None:
    """Why `new` cannot replace `old` while the driver runs; None when only tables were added or removed."""
    kept = set(old.tables) & set(new.tables)
    changed = sorted(table for table in kept if old.tables[table] != new.tables[table])
    if changed:
        return (f"pipeline.yaml changed the views of {', '.join(changed)}: restart the jobs to apply it "
                "(`tide jobs stop`, `tide jobs start`)")
    if old.model_dump(exclude={"tables"}) != new.model_dump(exclude={"tables"}):
        return ("pipeline.yaml changed more than its tables (source, windows, aggregates or nested views): "
                "restart the jobs to apply it (`tide jobs stop`, `tide jobs start`)")
    return None


def changes(old: PipelineConfig, new: PipelineConfig, sinks: list[str]) -> dict[str, TableChange]:
    """Each sink whose tables differ, with its tables before and after."""
    found = {sink: TableChange(frozenset(old.sink_tables(sink)), frozenset(new.sink_tables(sink))) for sink in sinks}
    return {sink: change for sink, change in found.items() if change.before != change.after}
