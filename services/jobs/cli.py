"""`tide jobs ...`: the Spark apply jobs (one streaming query per sink) as a local driver process."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from services.console import console, load_settings, reporter, user_errors
from services.jobs import dlq, driver, lag, rebuild
from services.stack import process, runner
from services.stack.service import StackError
from spark_jobs.config import load
from spark_jobs.pipeline import tables_with_view
from spark_jobs.settings import SINKS

jobs_app = typer.Typer(help="The Spark Structured Streaming jobs that apply the changelog to every sink.")
# Top-level commands about the jobs (merged into `tide` itself).
rebuild_app = typer.Typer()


@jobs_app.command()
def start() -> None:
    """Start the driver (local[2]) and wait until every sink's query runs. Idempotent."""
    settings = load_settings()
    with user_errors():
        for needed in ("kafka", "elasticsearch", "redis"):
            if not next(row for row in runner.status(settings) if row.name == needed).healthy:
                raise StackError(f"{needed} is not healthy: run `tide stack up` first")
        runner.start_and_wait(settings, [driver.SERVICE], report=reporter())


@jobs_app.command()
def stop() -> None:
    """Stop the driver. Queries resume from their checkpoints on the next start."""
    settings = load_settings()
    stopped = process.stop(runner.pid_file(settings, driver.SERVICE))
    console.print("jobs stopped" if stopped else "jobs were not running")


@jobs_app.command()
def status() -> None:
    """Each sink's query: state, records behind the end of its topics, dead letters, last error."""
    settings = load_settings()
    pipeline = load(settings.pipeline_file)
    reported = driver.read_status(settings) or {"queries": {}}
    dead = dlq.count_by_sink(dlq.read_letters(settings, driver.job_settings(settings).dlq_topic))
    table = Table("sink", "query", "records behind", "dead letters", "last error")
    for sink in SINKS:
        topics = [pipeline.topic(t) for t in tables_with_view(pipeline, sink)]
        behind = lag.records_behind(
            lag.committed_offsets(settings.state_dir / "checkpoints" / sink), lag.end_offsets(settings, topics)
        )
        query = reported["queries"].get(sink, {})
        state = "[green]running[/green]" if query.get("active") else "[red]stopped[/red]"
        table.add_row(sink, state, str(behind), str(dead.get(sink, 0)), (query.get("last_error") or "")[:80])
    console.print(table)


@rebuild_app.command("rebuild")
def rebuild_sink(sink: Annotated[str, typer.Argument(help="search, cache or warehouse")]) -> None:
    """Recreate one sink from the compacted topics (offset zero), without touching PostgreSQL."""
    settings = load_settings()
    with user_errors():
        if sink not in SINKS:
            raise StackError(f"unknown sink {sink}; choose one of {', '.join(SINKS)}")
        if sink == "search":
            swapped = rebuild.rebuild_search(settings, console.print)
            console.print("aliases now point at " + ", ".join(f"{a} -> {i}" for a, i in swapped.items()))
        else:
            rebuild.rebuild_by_replay(settings, sink, console.print)
