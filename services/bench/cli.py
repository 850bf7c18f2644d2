"""`tide bench`: run a benchmark scenario on its own clean stack; JSON and PNG plots to bench/results/."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from services.bench import baseline, core, drain, freshness, runs, snapshot, throughput
from services.console import console, load_settings, terminated_as_exit, user_errors

SCENARIOS = {module.NAME: module for module in (freshness, throughput, snapshot, drain, baseline)}


class ScenarioName(enum.StrEnum):
    freshness = "freshness"
    throughput = "throughput"
    snapshot = "snapshot"
    drain = "drain"
    baseline = "baseline"


def bench_command(
    scenario: Annotated[ScenarioName, typer.Option(help="Which benchmark to run.")] = ScenarioName.freshness,
    out: Annotated[
        Path | None, typer.Option(help="Result folder. Default: bench/results/<date>-<scenario>/.")
    ] = None,
    rates: Annotated[
        str | None, typer.Option(help="freshness, throughput: operations/s to run, comma-separated (e.g. 100,1000).")
    ] = None,
    duration: Annotated[
        float | None, typer.Option(min=5, help="Seconds per rate (freshness, throughput, baseline).")
    ] = None,
    warm_up: Annotated[
        float | None, typer.Option(min=0, help="freshness: seconds of load at the first rate before measuring, "
                                               "unmeasured (default 180; 0 measures from the cold start).")
    ] = None,
    rows: Annotated[int | None, typer.Option(min=1, help="snapshot: products rows to snapshot.")] = None,
    changes: Annotated[
        int | None, typer.Option(min=1, help="drain: row changes in the backlog (default 500,000).")
    ] = None,
    capture_only: Annotated[
        bool, typer.Option(help="snapshot, freshness: measure the capture stage alone (into Kafka), no Spark jobs.")
    ] = False,
    connector: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE added to the connector config for this run (repeatable), "
                                            "e.g. --connector max.batch.size=8192: how capture settings are measured.")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(min=10, help="snapshot, drain: seconds to wait for every sink before recording "
                                                "the progress so far (default 3600).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the demo workload.")] = 1,
    keep_stack: Annotated[bool, typer.Option(help="Leave the bench stack running afterwards (to inspect it).")] = False,
) -> None:
    """Measure Tideline on a clean local stack of its own (state folder <state_dir>/bench, the configured ports).

    A benchmark, not a test: it takes minutes, and its numbers depend on the machine and on what else runs on it
    (recorded in the result). Every scenario with sinks ends with `tide verify` over every view; baseline and
    --capture-only runs check their own counts instead.
    """
    settings = load_settings()
    options: dict = {"seed": seed}
    if rates:
        with user_errors():
            options["rates"] = parse_rates(rates)
    if duration:
        options["duration_s"] = duration
    if warm_up is not None:
        options["warm_up_s"] = warm_up
    if rows:
        options["rows"] = rows
    if changes:
        options["changes"] = changes
    if capture_only:
        options["capture_only"] = True
    if timeout:
        options["timeout_s"] = timeout
    if connector:
        with user_errors():
            options["connector"] = parse_settings(connector)
    out_dir = out or runs.result_dir(runs.RESULTS_DIR, scenario.value + ("-capture" if capture_only else ""))
    with user_errors(), terminated_as_exit():
        result = runs.run_scenario(SCENARIOS[scenario.value], settings, out_dir, options,
                                   say=lambda line: console.print(line, highlight=False), keep_stack=keep_stack)
    state = "[green]clean[/green]" if result["verify"]["clean"] else "[red]NOT CLEAN[/red]"
    console.print(f"verify: {state}; wrote {out_dir}/result.json and {', '.join(result['plots'])} "
                  f"in {result['wall_s']:.0f}s")
    if not result["verify"]["clean"]:
        raise typer.Exit(1)


def parse_settings(pairs: list[str]) -> dict[str, str]:
    """['max.batch.size=8192'] → {'max.batch.size': '8192'}; a one-line error for anything else."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise core.BenchError(f"--connector {pair!r} is not KEY=VALUE, e.g. --connector max.batch.size=8192")
        settings[key.strip()] = value.strip()
    return settings


def parse_rates(text: str) -> list[float]:
    """'100,1000' → [100.0, 1000.0]; a one-line error for anything else."""
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise core.BenchError(
            f"--rates {text!r} is not a comma-separated list of numbers, e.g. --rates 100,1000"
        ) from None
    if not rates or any(rate <= 0 for rate in rates):
        raise core.BenchError(f"--rates {text!r}: give one or more positive rates, e.g. --rates 100,1000")
    return rates
