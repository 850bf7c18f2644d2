"""The running processes' side of `tide tables`: the apply driver re-reads pipeline.yaml's tables, the
query API is restarted to serve the new list. Neither needs a restart by hand."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from services.api import server
from services.jobs import driver
from services.settings import StackSettings
from services.stack import process, runner
from services.stack.service import StackError
from spark_jobs.model.config import PipelineConfig
from spark_jobs.model.settings import SINKS
from spark_jobs.runtime import control

Say = Callable[[str], None]
# A restarted query reports progress once its first batch is done: on 2 busy cores, a warehouse batch can take a minute.
RELOAD_TIMEOUT_S = 300.0


def _running(settings: StackSettings, service) -> bool:
    return process.running(runner.pid_file(settings, service)) is not None


def _applied(settings: StackSettings, pipeline: PipelineConfig, request: str) -> bool:
    """Whether the driver handled `request` and every query reads exactly its tables in `pipeline`
    and runs them: has made progress since, or has been in its first batch for a few seconds (a
    real-time query reports progress at its first epoch's end only). A query restarted on a new
    subscription that Spark refuses stops at its first batch, just after it reported itself active.
    A query that stopped is a StackError."""
    status = driver.read_status(settings) or {}
    reload = status.get("reload") or {}
    if reload.get("request") != request:
        return False
    if reload.get("error"):
        raise StackError(f"the apply jobs kept their tables: {reload['error']}")
    queries = status.get("queries", {})
    for sink in SINKS:
        wanted, query = pipeline.sink_tables(sink), queries.get(sink)
        if not wanted:
            if query is not None:
                return False
            continue
        if query is None or sorted(query.get("tables", [])) != sorted(wanted):
            return False
        if query.get("paused"):
            continue
        if not query["active"] and query.get("last_error"):
            raise StackError(f"the {sink} query stopped on its new tables: {query['last_error']} "
                             "(see `tide jobs status` and the jobs log)")
        if not query["active"] or not (query.get("running") or query.get("batch_id") is not None):
            return False
    return True


def reload(settings: StackSettings, pipeline: PipelineConfig, say: Say, timeout_s: float = RELOAD_TIMEOUT_S) -> None:
    """Ask the running driver to re-read pipeline.yaml and wait until every query reads its new tables
    (the queries whose tables did not change run on untouched). Nothing to do if the jobs are stopped:
    they read the file when they start."""
    if not _running(settings, driver.SERVICE):
        say("apply jobs not running: they read pipeline.yaml when started (`tide jobs start`)")
        return
    request = uuid.uuid4().hex
    control.write_reload(driver.reload_file(settings), request)
    deadline = time.monotonic() + timeout_s
    while not _applied(settings, pipeline, request):
        if time.monotonic() > deadline:
            raise StackError(f"the apply jobs did not take up pipeline.yaml's tables within {timeout_s:.0f}s: "
                             "see `tide jobs status` and the jobs log (`tide stack logs` lists it)")
        time.sleep(0.5)  # poll: the driver looks at the request every few seconds
    say("apply jobs: " + "; ".join(f"{sink} reads {', '.join(pipeline.sink_tables(sink)) or 'nothing'}"
                                   for sink in SINKS if pipeline.sink_tables(sink)))


def restart_api(settings: StackSettings, say: Say) -> None:
    """The query API reads pipeline.yaml's view list at start: restart it, if it runs."""
    if not _running(settings, server.SERVICE):
        return
    runner.stop(settings, [server.SERVICE])
    runner.start_and_wait(settings, [server.SERVICE])
    say(f"query API restarted with the new table list ({server.url(settings)})")
