"""Elasticsearch: a real node assembled from Maven Central (server + transport-netty4 module),
started by the small launcher in services/stack/assets/elasticsearch/ (see its README for what is missing)."""

from __future__ import annotations

import httpx

from services.settings import StackSettings
from services.stack import jars, jvm
from services.stack.service import Service, Unhealthy

LAUNCHER_MAIN = "dev.tideline.elasticsearch.TidelineElasticsearch"
CLUSTER_NAME = "tideline"


def command(settings: StackSettings) -> list[str]:
    home = settings.state_dir / "elasticsearch"
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    build = jars.build_dir(settings, "elasticsearch")
    launcher = sorted(build.glob("tideline-elasticsearch-*.jar"))
    return jvm.command(
        heap=settings.elasticsearch_heap,
        classpath=[*(str(path) for path in launcher), jars.classpath(settings, "elasticsearch")],
        main=LAUNCHER_MAIN,
        props={
            "file.encoding": "UTF-8",
            "java.io.tmpdir": str(home / "tmp"),
            "log4j.shutdownHookEnabled": "false",  # keep the shutdown log lines
            "log4j2.disable.jmx": "true",
            "es.distribution.type": "tar",
            "tideline.es.modules": str(build / "es-modules"),
        },
        args=[
            f"-Epath.home={home}",
            f"-Epath.data={home / 'data'}",
            f"-Epath.logs={settings.logs_dir / 'elasticsearch'}",
            f"-Ecluster.name={CLUSTER_NAME}",
            f"-Enetwork.host={settings.host}",
            f"-Ehttp.port={settings.elasticsearch_port}",
            f"-Etransport.port={settings.elasticsearch_transport_port}",
        ],
    )


def url(settings: StackSettings) -> str:
    return f"http://{settings.host_of('elasticsearch')}:{settings.elasticsearch_port}"


def probe(settings: StackSettings) -> str:
    """Healthy at cluster health yellow or green."""
    try:
        health = httpx.get(f"{url(settings)}/_cluster/health", timeout=3).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise Unhealthy(f"HTTP not answering: {exc}") from exc
    if health.get("status") not in ("yellow", "green"):
        raise Unhealthy(f"cluster health {health.get('status')}")
    version = httpx.get(url(settings), timeout=3).json()["version"]["number"]
    return f"{health['status']}, Elasticsearch {version}"


SERVICE = Service(
    name="elasticsearch",
    port_fields=("elasticsearch_port", "elasticsearch_transport_port"),
    command=command,
    probe=probe,
    jar_bundles=("elasticsearch",),
)
