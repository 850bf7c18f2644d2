"""`tide bench`: run a benchmark scenario on its own clean stack; JSON and PNG plots to bench/results/."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from services.bench import baseline, core, freshness, snapshot, throughput
from services.console import console, load_settings, terminated_as_exit, user_errors

SCENARIOS = {module.NAME: module for module in (freshness, throughput, snapshot, baseline)}


class ScenarioName(enum.StrEnum):
    freshness = "freshness"
    throughput = "throughput"
    snapshot = "snapshot"
    baseline = "baseline"


def bench_command(
    scenario: Annotated[ScenarioName, typer.Option(help="Which benchmark to run.")] = ScenarioName.freshness,
    out: Annotated[
        Path | None, typer.Option(help="Result folder. Default: bench/results/<date>-<scenario>/.")
    ] = None,
    rates: Annotated[
        str | None, typer.Option(help="freshness, throughput: operations/s to run, comma-separated (e.g. 100,1000).")
    ] = None,
    duration: Annotated[float | None, typer.Option(min=5, help="Seconds per rate (freshness, throughput, baseline).")] = None,
    rows: Annotated[int | None, typer.Option(min=1, help="snapshot: products rows to snapshot.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the demo workload.")] = 1,
    keep_stack: Annotated[bool, typer.Option(help="Leave the bench stack running afterwards (to inspect it).")] = False,
) -> None:
    """Measure Tideline on a clean local stack of its own (state folder <state_dir>/bench, the configured ports).

    A benchmark, not a test: it takes minutes, and its numbers depend on the machine and on what else runs on it
    (recorded in the result). Every scenario ends with `tide verify` over every view.
    """
    settings = load_settings()
    options: dict = {"seed": seed}
    if rates:
        with user_errors():
            options["rates"] = parse_rates(rates)
    if duration:
        options["duration_s"] = duration
    if rows:
        options["rows"] = rows
    out_dir = out or core.result_dir(core.RESULTS_DIR, scenario.value)
    with user_errors(), terminated_as_exit():
        result = core.run_scenario(SCENARIOS[scenario.value], settings, out_dir, options,
                                   say=lambda line: console.print(line, highlight=False), keep_stack=keep_stack)
    state = "[green]clean[/green]" if result["verify"]["clean"] else "[red]DIVERGES[/red]"
    console.print(f"verify: {state}; wrote {out_dir}/result.json and {', '.join(result['plots'])} "
                  f"in {result['wall_s']:.0f}s")
    if not result["verify"]["clean"]:
        raise typer.Exit(1)


def parse_rates(text: str) -> list[float]:
    """'100,1000' → [100.0, 1000.0]; a one-line error for anything else."""
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise core.BenchError(f"--rates {text!r} is not a comma-separated list of numbers, e.g. --rates 100,1000") from None
    if not rates or any(rate <= 0 for rate in rates):
        raise core.BenchError(f"--rates {text!r}: give one or more positive rates, e.g. --rates 100,1000")
    return rates
