"""`tide api`: serve the query API with uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer

from services.console import console, errors, load_settings
from spark_jobs.config import PipelineConfigError


def api_command(
    port: Annotated[int, typer.Option(min=1, max=65535, envvar="TIDE_API_PORT", help="Port to listen on.")] = 8000,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on. Default: the stack's host (loopback).")
    ] = None,
) -> None:
    """Serve the query API (search, cache, warehouse); OpenAPI docs at /docs."""
    import uvicorn

    from services.api.app import create_app

    settings = load_settings()
    try:
        app = create_app(settings)
    except PipelineConfigError as exc:
        errors.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from exc
    bind = host or settings.host
    console.print(f"query API on http://{bind}:{port} (docs: http://{bind}:{port}/docs)", highlight=False)
    uvicorn.run(app, host=bind, port=port, log_level="info")
