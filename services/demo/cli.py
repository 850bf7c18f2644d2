"""`tide demo ...`: drive the demo workload against the stack's PostgreSQL."""

from __future__ import annotations

import random
from typing import Annotated

import psycopg
import typer

from services.console import console, load_settings, user_errors
from services.demo import load as demo_load
from services.demo import workload
from services.stack import postgres
from services.stack.rows import scalar
from services.stack.service import StackError

demo_app = typer.Typer(help="The demo workload: realistic, seeded traffic on the demo schema.")


@demo_app.command("load")
def load_command(
    rate: Annotated[float, typer.Option(min=0.1, help="Operations per second (each is one transaction).")] = 50.0,
    duration: Annotated[float, typer.Option(min=1, help="Seconds to run.")] = 60.0,
    seed: Annotated[int, typer.Option(help="Same seed, same operations (per worker).")] = 0,
    workers: Annotated[
        int | None, typer.Option(min=1, max=64, help="Connections in parallel. Default: one per 50 operations/s, "
                                                     "at most 32.")
    ] = None,
    processes: Annotated[
        int | None, typer.Option(min=1, max=16, help="Processes the connections run in. Default: one per 8.")
    ] = None,
) -> None:
    """Run new customers, orders with items, payments and shipping, renames, cancellations, deletions
    and large description edits at a steady RATE for DURATION seconds; print the rate achieved and the
    row changes/s PostgreSQL counted. A RATE above what the machine sustains runs as fast as it can."""
    settings = load_settings()
    with user_errors():
        conninfo = postgres.conninfo(settings)
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                if scalar(conn, "SELECT count(*) FROM customers") == 0:
                    workload.seed(conn, random.Random(seed))  # every operation needs something to act on
        except psycopg.OperationalError as exc:
            raise StackError(f"cannot reach PostgreSQL: {str(exc).strip().splitlines()[0]} — is the stack up?") from exc
        except psycopg.errors.UndefinedTable as exc:
            raise StackError("the demo tables do not exist: run `tide db migrate` first") from exc

        next_print = [10.0]

        def progress(report: demo_load.LoadReport) -> None:
            if report.seconds >= next_print[0]:
                next_print[0] += 10
                console.print(f"  {report.seconds:5.0f}s  {report.achieved_rate:7.1f} operations/s", highlight=False)

        report = demo_load.run(conninfo, rate, duration, seed=seed, workers=workers, on_progress=progress,
                               processes=processes)
    summary = report.as_dict()
    console.print(
        f"achieved {summary['achieved_rate']} operations/s of {rate:g} asked "
        f"({summary['operations']} in {summary['seconds']:.0f}s on {report.workers} connections in "
        f"{report.processes} process{'es' if report.processes > 1 else ''}: {summary['changed']} changed rows, "
        f"{summary['nothing_to_do']} found nothing to do, {summary['conflicts']} conflicts); PostgreSQL counted "
        f"{summary['row_changes']:,} row changes, {summary['row_changes_per_s']:,.0f}/s",
        highlight=False,
    )
    for error in report.errors:
        console.print(f"[red]{error}[/red]", highlight=False)
    if report.errors:
        raise typer.Exit(1)
