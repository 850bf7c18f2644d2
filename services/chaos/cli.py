"""`tide chaos`: run a chaos profile against the running stack and print the verdict."""

from __future__ import annotations

import random
from typing import Annotated

import typer
from rich.table import Table

from services.chaos.profiles import PROFILES
from services.chaos.run import Report, run
from services.console import console, load_settings, terminated_as_exit, user_errors
from services.stack.service import StackError


def chaos_command(
    profile: Annotated[str, typer.Option(
        help="smoke (a few minutes, CI), cluster (the same on the cluster profile) or full (30 minutes, by hand)")
    ] = "smoke",
    seed: Annotated[int | None, typer.Option(help="replay a run: the seed a run printed (default: a new one)")] = None,
) -> None:
    """Writers, seeded faults (kill -9, pauses, restarts), then `tide verify` twice; exit 1 unless clean."""
    settings = load_settings()
    with user_errors():
        if profile not in PROFILES:
            *others, last = PROFILES
            raise StackError(f"unknown profile {profile}: choose {', '.join(others)} or {last}")
        chosen = seed if seed is not None else random.SystemRandom().randrange(1, 1_000_000)
        with terminated_as_exit():
            report = run(settings, PROFILES[profile], chosen, settings.state_dir / "chaos" / f"{profile}-{chosen}",
                         say=lambda line: console.print(line, highlight=False))
    console.print(summary(report))
    if not report.passed:
        for failure in report.failures:
            console.print(f"[red]{failure}[/red]", highlight=False)
        console.print(f"[red]chaos run FAILED; replay with `tide chaos --profile {profile} --seed {chosen}`[/red]")
        raise typer.Exit(1)
    console.print(f"[green]chaos run passed (seed {chosen})[/green]")


def summary(report: Report) -> Table:
    table = Table("what", "observed", title=f"chaos {report.profile}, seed {report.seed}")
    faults: dict[str, int] = {}
    for injected in report.injected:
        faults[injected.fault] = faults.get(injected.fault, 0) + 1
    rows = {
        "duration": f"{report.duration_s:.0f}s",
        "faults injected": ", ".join(f"{name} ×{times}" for name, times in sorted(faults.items())) or "none",
        "transactions": f"{report.committed} committed, {report.rolled_back} rolled back (writer conflicts)",
        "duplicate deliveries": str(report.duplicates),
        "replayed micro-batches": ", ".join(f"{r.sink} {r.batch}" for r in report.replays) or "none",
        "ledgers": ", ".join(f"{s.table} 1..{s.last}" for s in report.ledgers) or "not read",
        "verify": ", ".join(f"pass {n}: {len(d)} divergences" for n, d in enumerate(report.verify_passes, 1))
        or "not run",
    }
    for name, value in rows.items():
        table.add_row(name, value)
    return table
