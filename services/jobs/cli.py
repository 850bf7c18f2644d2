"""`tide jobs ...`: the Spark apply jobs (one streaming query per sink) as a local driver process."""

from __future__ import annotations

from typing import Annotated

import typer

from services.console import console, load_settings, reporter, user_errors
from services.jobs import driver, rebuild
from services.stack import process, runner, spark
from services.stack.service import StackError
from spark_jobs.model.settings import SINKS
from spark_jobs.model.sink_registry import spec_of
from spark_jobs.runtime import control

jobs_app = typer.Typer(help="The Spark Structured Streaming jobs that apply the changelog to every sink.")
# Top-level commands about the jobs (merged into `tide` itself).
rebuild_app = typer.Typer()


@jobs_app.command()
def start() -> None:
    """Start the driver (local[4], or on the cluster profile's master); wait until every query runs. Idempotent."""
    settings = load_settings()
    with user_errors():
        needs = ["kafka", "elasticsearch", "redis", *(service.name for service in spark.members(settings))]
        for needed in needs:
            if not next(row for row in runner.status(settings) if row.name == needed).healthy:
                raise StackError(f"{needed} is not healthy: run `tide stack up` first")
        runner.start_and_wait(settings, [driver.SERVICE], report=reporter())


@jobs_app.command()
def stop() -> None:
    """Stop the driver. Queries resume from their checkpoints on the next start."""
    settings = load_settings()
    stopped = process.stop(runner.pid_file(settings, driver.SERVICE))
    console.print("jobs stopped" if stopped else "jobs were not running")


SinkArgument = Annotated[str, typer.Argument(help=", ".join(SINKS[:-1]) + " or " + SINKS[-1])]


def _check_sink(sink: str) -> None:
    spec_of(sink)  # an UnknownSinkError names the sinks there are


@jobs_app.command()
def pause(sink: SinkArgument) -> None:
    """Stop one sink's query (the others keep running) until `tide jobs resume`; it resumes where it stopped."""
    _set_paused(sink, paused=True)


@jobs_app.command()
def resume(sink: SinkArgument) -> None:
    """Let a paused sink's query run again; the running driver starts it within a few seconds."""
    _set_paused(sink, paused=False)


def _set_paused(sink: str, paused: bool) -> None:
    settings = load_settings()
    with user_errors():
        _check_sink(sink)
    path = driver.paused_file(settings)
    now = control.read_paused(path)
    control.write_paused(path, now | {sink} if paused else now - {sink})
    console.print(f"{sink} {'paused' if paused else 'resumed'}: the driver applies it within a few seconds "
                  "(`tide jobs status` shows it)")


@rebuild_app.command("rebuild")
def rebuild_sink(sink: SinkArgument) -> None:
    """Recreate one sink from the compacted topics (offset zero), without touching PostgreSQL."""
    settings = load_settings()
    with user_errors():
        _check_sink(sink)
        swapped = rebuild.rebuild(settings, sink, console.print)
        if swapped:
            console.print("now read from " + ", ".join(f"{name} -> {store}" for name, store in swapped.items()))
