"""`tide cluster status`: the cluster profile's Spark master, its workers and where the executors run; its
Kafka brokers and the partitions each leads."""

from __future__ import annotations

import typer
from rich.table import Table

from services.console import console, load_settings
from services.settings import StackSettings
from services.stack import kafka, spark
from services.stack.service import Unhealthy

cluster_app = typer.Typer(help="The cluster profile: the jobs on a Spark standalone cluster, Kafka on several "
                                "brokers (docs/cluster.md).")


def worker_rows(settings: StackSettings) -> list[tuple[str, ...]]:
    """One row per configured worker: its state as the master sees it, cores and memory in use, and the
    executors it runs (application/executor id), as the worker itself reports them."""
    registered = spark.read_master(settings).get("workers", [])
    rows: list[tuple[str, ...]] = []
    for number in range(1, settings.spark_workers + 1):
        seen = spark.registered_worker(settings, number, registered)
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


def broker_rows(settings: StackSettings) -> list[tuple[str, ...]]:
    """One row per configured broker: live, fenced (the controller lost it) or not registered, the
    partitions it leads and those it holds a replica of that are not in sync."""
    _, known = kafka.registered_brokers(settings)
    every = kafka.partitions(settings)
    rows: list[tuple[str, ...]] = []
    for number in range(1, settings.kafka_brokers + 1):
        state = "not registered" if number not in known else "live" if known[number] else "fenced"
        lagging = sum(number in part.replicas and number not in part.in_sync for part in every)
        rows.append((kafka.broker_name(number), state, str(sum(part.leader == number for part in every)),
                     str(lagging)))
    return rows


Section = tuple[tuple[str, ...], list[tuple[str, ...]]]  # a table's header and rows


def _sections(settings: StackSettings) -> list[Section]:
    """The workers' table and the brokers' (each when the profile runs them); the master's lines printed."""
    sections: list[Section] = []
    if settings.spark_cluster:
        master = spark.read_master(settings)
        console.print(f"master {master['url']}: {master['status']}, {master.get('aliveworkers', 0)} workers alive")
        for app in master.get("activeapps", []):
            console.print(f"application {app['id']} ({app['name']}): {app['cores']} cores, {app['state']}")
        sections.append((("worker", "state", "cores", "memory", "executors"), worker_rows(settings)))
    if settings.kafka_brokers > 1:
        sections.append((("broker", "state", "leads", "out of sync"), broker_rows(settings)))
    return sections


@cluster_app.command()
def status() -> None:
    """The master, every worker (state, cores and memory in use) and the executors each one runs; every
    Kafka broker, the partitions it leads and those where it is behind. Exits 1 when one is not live."""
    settings = load_settings()
    if not settings.spark_cluster and settings.kafka_brokers == 1:
        console.print("the cluster profile is off: set TIDE_SPARK_WORKERS=2 and/or TIDE_KAFKA_BROKERS=3 and run "
                      "`tide up` (docs/cluster.md)")
        raise typer.Exit(1)
    try:
        sections = _sections(settings)
    except Unhealthy as exc:
        console.print(f"[red]{exc}[/red]: start it with `tide up` (or `tide stack up`)")
        raise typer.Exit(1) from None
    for header, rows in sections:
        table = Table(*header)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    if any(row[1] not in ("ALIVE", "live") for _, rows in sections for row in rows):
        raise typer.Exit(1)
