"""The query API: search, cache point reads and warehouse rows over the views (docs/api.md), the
pipeline's status as JSON and Prometheus text, and a dashboard page at `/` (docs/status.md).

`create_app(settings)` builds the app for one stack; `tide api` serves it with uvicorn.
Bad input answers 4xx with a message; a store that cannot answer, 503; nothing answers a trace.
"""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path as PathLib
from typing import Annotated, Any

import redis
from elasticsearch import Elasticsearch
from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException

from services.api.stores import MAX_SEARCH_SIZE, MAX_WAREHOUSE_LIMIT, Cache, NotFound, Search, Unavailable, Warehouse
from services.api.validation import MAX_QUERY_CHARS, BadInput
from services.jobs.driver import job_settings
from services.settings import StackSettings
from services.status import figures, metrics
from services.status.collect import collect
from spark_jobs.model.config import PipelineConfig, load

log = logging.getLogger("tideline.api")

DASHBOARD = PathLib(__file__).with_name("dashboard.html")
DASHBOARD_SEARCH_TABLE = "orders"  # the view the dashboard's search box searches (nested view first)
STATUS_MAX_AGE_S = 1.0

Name = Annotated[str, Path(max_length=63, description="A name from pipeline.yaml")]


def create_app(settings: StackSettings, pipeline: PipelineConfig | None = None) -> FastAPI:
    pipeline = pipeline or load(settings.pipeline_file)
    stores = job_settings(settings)  # the stores the apply jobs write
    es = Elasticsearch(stores.elasticsearch_url, request_timeout=10, max_retries=1)
    cache_client = redis.Redis.from_url(stores.redis_url, socket_connect_timeout=5, socket_timeout=10)
    search, cache = Search(es, pipeline), Cache(cache_client, pipeline)
    warehouse = Warehouse(stores.warehouse_dir, pipeline)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        es.close()
        cache_client.close()

    app = FastAPI(
        title="Tideline query API",
        description="Reads of the views Tideline keeps in sync with PostgreSQL: search, cache, warehouse.",
        version="0.1.0",
        lifespan=lifespan,
    )

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc)})

    @app.exception_handler(BadInput)
    async def _bad_input(_: Request, exc: BadInput) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    @app.exception_handler(Unavailable)
    async def _unavailable(_: Request, exc: Unavailable) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc)})

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        detail = exc.detail
        if exc.status_code == 404 and detail == "Not Found":  # no route matched (a path segment of its own?)
            detail = "Not Found: no endpoint matches this path; the endpoints are listed at /docs"
        return JSONResponse(status_code=exc.status_code, content={"detail": detail}, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse(status_code=500, content={"detail": "internal error (logged by the API server)"})

    @app.get("/search/{index}", summary="Full-text search over a search view")
    def search_view(
        request: Request,
        index: Name,
        q: Annotated[str | None, Query(max_length=MAX_QUERY_CHARS,
                                       description="Words to find (simple query string syntax)")] = None,
        page: Annotated[int, Query(ge=1, le=10_000)] = 1,
        size: Annotated[int, Query(ge=1, le=MAX_SEARCH_SIZE)] = 10,
    ) -> dict[str, Any]:
        """Any other query parameter `field=value` is an exact-match filter (repeat a field for OR)."""
        return search.search(index, q, request.query_params.multi_items(), page, size)

    @app.get("/cache/{table}/{key:path}", summary="Point read of one row from the cache")
    def cache_row(table: Name, key: Annotated[str, Path(description="The primary key; [a,b] for a composite key")]
                  ) -> dict[str, Any]:
        return cache.get(table, key)

    @app.get("/warehouse/{table}", summary="Rows of a warehouse table: current state, history or window figures")
    def warehouse_rows(
        table: Name,
        limit: Annotated[int, Query(ge=1, le=MAX_WAREHOUSE_LIMIT)] = 100,
        offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    ) -> dict[str, Any]:
        return warehouse.rows(table, limit, offset)

    recent = RecentStatus(lambda: collect(settings, pipeline))
    page = _dashboard_page(pipeline)

    @app.get("/status", summary="The pipeline's status: source, and each sink's lag, freshness, dead letters")
    def status() -> dict[str, Any]:
        return figures.to_json(recent.get())

    @app.get("/metrics", summary="The same figures in Prometheus' text format", response_class=Response)
    def prometheus_metrics() -> Response:
        return Response(metrics.render(recent.get()), media_type=metrics.CONTENT_TYPE)

    @app.get("/", summary="The dashboard page (status and a search box, refreshing live)",
             response_class=HTMLResponse)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(page)

    return app


def _dashboard_page(pipeline: PipelineConfig) -> str:
    view = pipeline.tables.get(DASHBOARD_SEARCH_TABLE)
    if DASHBOARD_SEARCH_TABLE in pipeline.nested:  # the orders join documents, when declared
        alias = DASHBOARD_SEARCH_TABLE
    elif view is not None and view.search is not None:
        alias = view.search.index or DASHBOARD_SEARCH_TABLE
    else:
        alias = ""
    return DASHBOARD.read_text().replace("__SEARCH_INDEX__", html.escape(alias, quote=True))


class RecentStatus:
    """One status read shared by the requests of the same second (a dashboard tab and a Prometheus
    scrape ask often; each read opens Kafka consumers and a PostgreSQL connection)."""

    def __init__(self, read: Callable[[], figures.Status], max_age_s: float = STATUS_MAX_AGE_S) -> None:
        self.read, self.max_age_s = read, max_age_s
        self.lock = threading.Lock()
        self.value: figures.Status | None = None
        self.read_at = 0.0

    def get(self) -> figures.Status:
        with self.lock:
            if self.value is None or time.monotonic() - self.read_at > self.max_age_s:
                self.value, self.read_at = self.read(), time.monotonic()
            return self.value
