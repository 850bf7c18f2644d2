"""The query API as a managed local process (`tide up` starts it, `tide down` stops it).

It runs the same foreground command as `tide api`, so development and the managed process
serve one app the same way; the stack runner owns its pid file and log.
"""

from __future__ import annotations

import sys

import httpx

from services.settings import StackSettings
from services.stack.service import Service, Unhealthy


def url(settings: StackSettings) -> str:
    return f"http://{settings.host}:{settings.api_port}"


def probe(settings: StackSettings) -> str:
    """Healthy once the app answers its OpenAPI schema (served by FastAPI itself, not by a view)."""
    schema_url = f"{url(settings)}/openapi.json"
    try:
        response = httpx.get(schema_url, timeout=2)
        schema = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: not JSON, so not our app
        raise Unhealthy(f"{schema_url}: {exc}") from exc
    if "paths" not in schema:
        raise Unhealthy(f"{schema_url} answered {response.status_code} without an OpenAPI schema")
    return f"{url(settings)} answers"


SERVICE = Service(
    name="api",
    port_fields=("api_port",),
    # The child inherits TIDE_* and reads `.env`, so it serves the same stack on `api_port`.
    command=lambda settings: [sys.executable, "-m", "services.cli", "api"],
    probe=probe,
)
