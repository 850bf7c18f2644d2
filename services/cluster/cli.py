"""`tide cluster status`: the cluster profile's Spark master, its workers and where the executors run."""

from __future__ import annotations

import typer
from rich.table import Table

from services.console import console, load_settings
from services.settings import StackSettings
from services.stack import spark
from services.stack.service import Unhealthy

cluster_app = typer.Typer(help="The cluster profile: the jobs on a Spark standalone cluster (docs/cluster.md).")


def worker_rows(settings: StackSettings) -> list[tuple[str, ...]]:
    """One row per configured worker: its state as the master sees it, cores and memory in use, and the
    executors it runs (application/executor id), as the worker itself reports them."""
    # A worker started again is registered anew and the master keeps the lost one's record too: the live
    # record of an address wins.
    registered = sorted(spark.read_master(settings).get("workers", []), key=lambda worker: worker["state"] != "ALIVE")
    rows: list[tuple[str, ...]] = []
    for number in range(1, settings.spark_workers + 1):
        port = spark.worker_webui_port(settings, number)
        seen = next((worker for worker in registered if worker["webuiaddress"].endswith(f":{port}")), None)
        executors = _executors(settings, number)
        if seen is None or seen["state"] != "ALIVE":  # not what a lost worker held when it was lost
            rows.append((f"{spark.WORKER_PREFIX}{number}", seen["state"] if seen else "not registered", "-", "-",
                         executors))
        else:
            rows.append((f"{spark.WORKER_PREFIX}{number}", "ALIVE", f"{seen['coresused']}/{seen['cores']}",
                         f"{seen['memoryused']}/{seen['memory']} MB", executors or "none"))
    return rows


def _executors(settings: StackSettings, number: int) -> str:
    try:
        found = spark.read_worker(settings, number).get("executors", [])
    except Unhealthy:
        return "-"
    return ", ".join(f"{executor['appid']}/{executor['id']}" for executor in found)


@cluster_app.command()
def status() -> None:
    """The master, every worker (state, cores and memory in use) and the executors each one runs."""
    settings = load_settings()
    if not settings.spark_cluster:
        console.print("the cluster profile is off: set TIDE_SPARK_WORKERS (e.g. 2) and run `tide up` (docs/cluster.md)")
        raise typer.Exit(1)
    try:
        master = spark.read_master(settings)
        rows = worker_rows(settings)
    except Unhealthy as exc:
        console.print(f"[red]{exc}[/red]: start it with `tide up` (or `tide stack up`)")
        raise typer.Exit(1) from None
    console.print(f"master {master['url']}: {master['status']}, {master.get('aliveworkers', 0)} workers alive")
    for app in master.get("activeapps", []):
        console.print(f"application {app['id']} ({app['name']}): {app['cores']} cores, {app['state']}")
    table = Table("worker", "state", "cores", "memory", "executors")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if any(row[1] != "ALIVE" for row in rows):
        raise typer.Exit(1)
