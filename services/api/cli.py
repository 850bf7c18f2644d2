"""`tide api`: serve the query API with uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer

from services.console import console, load_settings, user_errors


def api_command(
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Port to listen on. Default: TIDE_API_PORT (8000).")
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on. Default: the stack's host (loopback).")
    ] = None,
) -> None:
    """Serve the query API in the foreground (search, cache, warehouse); OpenAPI docs at /docs.

    `tide up` runs this same command as a managed background process (services/api/server.py)."""
    import uvicorn

    from services.api.app import create_app

    settings = load_settings()
    with user_errors():
        app = create_app(settings)
    bind, port = host or settings.host, port or settings.api_port
    console.print(f"query API on http://{bind}:{port} (docs: http://{bind}:{port}/docs)", highlight=False)
    uvicorn.run(app, host=bind, port=port, log_level="info")
