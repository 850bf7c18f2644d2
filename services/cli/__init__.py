"""`tide`: the command line. Each area registers its own sub-app; this file only wires them."""

from __future__ import annotations

import typer

from services.api.cli import api_command
from services.bench.cli import bench_command
from services.capture.connector.cli import connector_app
from services.capture.connector.snapshot import capture_ops_app
from services.capture.source.cli import init_command, source_app
from services.chaos.cli import chaos_command
from services.cluster.cli import cluster_app
from services.db.cli import db_app
from services.demo.cli import demo_app
from services.jobs.cli import jobs_app, rebuild_app
from services.stack.cli import stack_app
from services.status.cli import jobs_status_command, status_command
from services.tables.cli import tables_app
from services.up.cli import down_command, serve_command, up_command
from services.verify.cli import verify_command
from services.warehouse.cli import warehouse_app

app = typer.Typer(
    name="tide",
    help="Tideline: keep Elasticsearch, Redis and Delta Lake in sync with PostgreSQL through its change log.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("up")(up_command)
app.command("down")(down_command)
app.command("serve")(serve_command)
app.command("init")(init_command)
app.add_typer(stack_app, name="stack")
app.add_typer(cluster_app, name="cluster")
app.add_typer(source_app, name="source")
app.add_typer(tables_app, name="tables")
app.add_typer(db_app, name="db")
app.add_typer(demo_app, name="demo")
app.add_typer(connector_app, name="connector")
app.add_typer(warehouse_app, name="warehouse")
# `tide jobs status` is the status view's: mounted here so the jobs and status packages stay apart.
jobs_app.command("status")(jobs_status_command)
app.add_typer(jobs_app, name="jobs")
app.add_typer(capture_ops_app)
app.add_typer(rebuild_app)
app.command("verify")(verify_command)
app.command("api")(api_command)
app.command("status")(status_command)
app.command("bench")(bench_command)
app.command("chaos")(chaos_command)

