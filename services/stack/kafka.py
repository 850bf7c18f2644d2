"""Apache Kafka (KRaft, single combined broker+controller) and Kafka Connect (distributed mode)
with the Debezium PostgreSQL plugin, both from jars resolved by Maven."""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from services.settings import StackSettings
from services.stack import jars, jvm
from services.stack.service import Service, StackError, Unhealthy
from services.stack.templates import render
from services.versions import PROJECT_ROOT

KAFKA_ASSETS = PROJECT_ROOT / "services" / "stack" / "assets" / "kafka"
CONNECT_ASSETS = PROJECT_ROOT / "services" / "capture" / "connect"
DEBEZIUM_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
CONNECT_GROUP = "tideline-connect"


def _home(settings: StackSettings, name: str) -> Path:
    return settings.state_dir / name


def _log_props(settings: StackSettings, assets: Path) -> dict[str, str]:
    return {
        "log4j2.configurationFile": f"file:{assets / 'log4j2.properties'}",
        "kafka.logs.dir": str(settings.logs_dir / assets.name),
    }


def _broker_config(settings: StackSettings) -> Path:
    return _home(settings, "kafka") / "server.properties"


def new_cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A random KRaft cluster id: 16 bytes, URL-safe base64 without padding.

    Like Kafka's own Uuid.randomUuid, an id starting with '-' is drawn again: the storage
    tool's argument parser would read it as an option (one format in 64 failed that way)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(draw()).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def prepare_broker(settings: StackSettings) -> None:
    """Render server.properties and format the KRaft storage once (kept cluster id on restarts)."""
    data = _home(settings, "kafka") / "data"
    config = render(
        KAFKA_ASSETS / "server.properties",
        _broker_config(settings),
        {
            "KAFKA_HOST": settings.host,
            "KAFKA_ADVERTISED_HOST": settings.host_of("kafka"),
            "KAFKA_BROKER_PORT": str(settings.kafka_port),
            "KAFKA_CONTROLLER_PORT": str(settings.kafka_controller_port),
            "KAFKA_DATA_DIR": str(data),
        },
    )
    if (data / "meta.properties").is_file():
        return
    argv = _kafka_java(
        settings, "256m", "kafka.tools.StorageTool", KAFKA_ASSETS,
        ["format", "-t", new_cluster_id(), "-c", str(config), "--ignore-formatted"],
    )
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["(no output)"])[-1]
        raise StackError(f"formatting Kafka storage in {data} failed: {last}")


def _kafka_java(settings: StackSettings, heap: str, main: str, assets: Path, args: list[str]) -> list[str]:
    """A java argv on the Kafka classpath (broker, storage tool and Connect share it) with file logging."""
    return jvm.command(
        heap=heap,
        classpath=[jars.classpath(settings, "kafka")],
        main=main,
        props=_log_props(settings, assets),
        args=args,
    )


def broker_command(settings: StackSettings) -> list[str]:
    return _kafka_java(settings, settings.kafka_heap, "kafka.Kafka", KAFKA_ASSETS, [str(_broker_config(settings))])


def probe_broker(settings: StackSettings) -> str:
    """A real metadata request: the broker answers with itself as a live broker."""
    try:
        admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=3000)
    except KafkaError as exc:
        raise Unhealthy(f"no broker at {settings.kafka_bootstrap}: {exc}") from exc
    try:
        cluster = admin.describe_cluster()
    except KafkaError as exc:
        raise Unhealthy(f"metadata request failed: {exc}") from exc
    finally:
        admin.close()
    if not cluster.get("brokers"):
        raise Unhealthy("metadata lists no live broker yet")
    return f"{len(cluster['brokers'])} broker, cluster {cluster['cluster_id']}"


def _connect_config(settings: StackSettings) -> Path:
    return _home(settings, "connect") / "connect-distributed.properties"


def prepare_connect(settings: StackSettings) -> None:
    render(
        CONNECT_ASSETS / "connect-distributed.properties",
        _connect_config(settings),
        {
            "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap,
            "CONNECT_GROUP_ID": CONNECT_GROUP,
            "CONNECT_REST_HOST": settings.host,
            "CONNECT_ADVERTISED_HOST": settings.host_of("connect"),
            "CONNECT_REST_PORT": str(settings.connect_port),
            "CONNECT_PLUGIN_PATH": str(jars.bundle_dir(settings, "debezium").parent),
        },
    )


def connect_env(settings: StackSettings) -> dict[str, str]:
    """The CDC credentials, for the connector config's `${env:...}` references (never written to a file)."""
    env = {"TIDE_CDC_USER": settings.cdc_user}
    if settings.cdc_password is not None:
        env["TIDE_CDC_PASSWORD"] = settings.cdc_password.get_secret_value()
    return env


def connect_command(settings: StackSettings) -> list[str]:
    return _kafka_java(
        settings,
        settings.connect_heap,
        "org.apache.kafka.connect.cli.ConnectDistributed",
        CONNECT_ASSETS,
        [str(_connect_config(settings))],
    )


def connect_url(settings: StackSettings) -> str:
    return f"http://{settings.host_of('connect')}:{settings.connect_port}"


def probe_connect(settings: StackSettings) -> str:
    """Healthy once the REST API answers and lists the Debezium PostgreSQL plugin."""
    try:
        response = httpx.get(f"{connect_url(settings)}/connector-plugins", timeout=3)
    except httpx.HTTPError as exc:
        raise Unhealthy(f"REST API not answering: {exc}") from exc
    if response.status_code != 200:
        raise Unhealthy(f"REST API answered {response.status_code}")
    versions = [plugin["version"] for plugin in response.json() if plugin["class"] == DEBEZIUM_CONNECTOR]
    if not versions:
        raise Unhealthy("Debezium PostgreSQL plugin not loaded")
    return f"Debezium PostgreSQL {versions[0]}"


BROKER = Service(
    name="kafka",
    port_fields=("kafka_port", "kafka_controller_port"),
    command=broker_command,
    probe=probe_broker,
    prepare=prepare_broker,
    jar_bundles=("kafka",),
)

CONNECT = Service(
    name="connect",
    port_fields=("connect_port",),
    command=connect_command,
    probe=probe_connect,
    prepare=prepare_connect,
    after=("kafka",),
    jar_bundles=("kafka", "debezium"),
    env=connect_env,
)
