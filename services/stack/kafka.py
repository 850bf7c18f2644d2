"""Apache Kafka (KRaft, single combined broker+controller) and Kafka Connect (distributed mode)
with the Debezium PostgreSQL plugin, both from jars resolved by Maven."""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
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


def _log_props(settings: StackSettings, assets: Path, logs: str) -> dict[str, str]:
    return {
        "log4j2.configurationFile": f"file:{assets / 'log4j2.properties'}",
        "kafka.logs.dir": str(settings.logs_dir / logs),
    }


def broker_name(number: int) -> str:
    """The first broker is `kafka` (what every other member starts after); the cluster profile's are kafka-2, ..."""
    return "kafka" if number == 1 else f"kafka-{number}"


def _broker_home(settings: StackSettings, number: int) -> Path:
    return _home(settings, broker_name(number))


def _broker_config(settings: StackSettings, number: int) -> Path:
    return _broker_home(settings, number) / "server.properties"


def new_cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A random KRaft cluster id: 16 bytes, URL-safe base64 without padding.

    Like Kafka's own Uuid.randomUuid, an id starting with '-' is drawn again: the storage
    tool's argument parser would read it as an option (one format in 64 failed that way)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(draw()).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def broker_values(settings: StackSettings, number: int) -> dict[str, str]:
    """server.properties' values for broker `number`: the first is broker and controller (the quorum's one
    voter), the others brokers only; the replication the stack's brokers allow."""
    host, port = settings.host, settings.broker_port(number)
    controller = f",CONTROLLER://{host}:{settings.kafka_controller_port}" if number == 1 else ""
    return {
        "PROCESS_ROLES": "broker,controller" if number == 1 else "broker",
        "NODE_ID": str(number),
        "LISTENERS": f"PLAINTEXT://{host}:{port}{controller}",
        "KAFKA_ADVERTISED_HOST": settings.broker_host(number),
        "CONTROLLER_HOST": settings.host_of("kafka"),
        "KAFKA_BROKER_PORT": str(port),
        "KAFKA_CONTROLLER_PORT": str(settings.kafka_controller_port),
        "KAFKA_DATA_DIR": str(_broker_home(settings, number) / "data"),
        "REPLICATION": str(settings.kafka_replication),
        "MIN_INSYNC": str(settings.kafka_min_insync),
    }


def prepare_broker(settings: StackSettings, number: int = 1) -> None:
    """Render server.properties and format the KRaft storage once (kept cluster id on restarts). The first
    broker draws the cluster id; the others join it, asking it for the id (they start once it is healthy:
    in a container of their own they cannot read its storage)."""
    values = broker_values(settings, number)
    config = render(KAFKA_ASSETS / "server.properties", _broker_config(settings, number), values)
    data = Path(values["KAFKA_DATA_DIR"])
    if (data / "meta.properties").is_file():
        return
    argv = _kafka_java(
        settings, "256m", "kafka.tools.StorageTool", KAFKA_ASSETS,
        ["format", "-t", new_cluster_id() if number == 1 else _joined_cluster(settings, number),
         "-c", str(config), "--ignore-formatted"],
    )
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["(no output)"])[-1]
        raise StackError(f"formatting Kafka storage in {data} failed: {last}")


def _joined_cluster(settings: StackSettings, number: int) -> str:
    """The id of the cluster broker `number` joins, as the first broker answers it."""
    first = f"{settings.host_of('kafka')}:{settings.kafka_port}"
    try:
        return registered_brokers(settings, first)[0]
    except Unhealthy as exc:
        raise StackError(f"broker {number} joins the first broker's cluster, which does not answer at {first} "
                         f"({exc}): start `kafka` first") from exc


def _kafka_java(settings: StackSettings, heap: str, main: str, assets: Path, args: list[str],
                logs: str | None = None) -> list[str]:
    """A java argv on the Kafka classpath (broker, storage tool and Connect share it) with file logging."""
    return jvm.command(
        heap=heap,
        classpath=[jars.classpath(settings, "kafka")],
        main=main,
        props=_log_props(settings, assets, logs or assets.name),  # a broker's own folder: kafka, kafka-2, ...
        args=args,
    )


def broker_command(settings: StackSettings, number: int = 1) -> list[str]:
    config = _broker_config(settings, number)
    return _kafka_java(settings, settings.kafka_heap, "kafka.Kafka", KAFKA_ASSETS, [str(config)], broker_name(number))


def _admin(address: str) -> KafkaAdminClient:
    # Probes and checks: a broker that does not answer within seconds is reported, not waited for.
    try:
        return KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=3000, bootstrap_timeout_ms=5000)
    except KafkaError as exc:
        raise Unhealthy(f"no broker at {address}: {exc}") from exc


def registered_brokers(settings: StackSettings, address: str | None = None) -> tuple[str, dict[int, bool]]:
    """The cluster id and every broker the controller knows, by id: whether it is live (not fenced). Asked
    of `address` (default: whichever broker answers)."""
    admin = _admin(address or settings.kafka_bootstrap)
    try:
        cluster = admin.describe_cluster()
    except KafkaError as exc:
        raise Unhealthy(f"metadata request failed: {exc}") from exc
    finally:
        admin.close()
    return cluster["cluster_id"], {broker["broker_id"]: not broker.get("is_fenced") for broker in cluster["brokers"]}


def probe_broker(settings: StackSettings, number: int = 1) -> str:
    """A real metadata request to broker `number` itself: it answers with itself among the live (unfenced)
    brokers."""
    cluster_id, known = registered_brokers(settings, f"{settings.broker_host(number)}:{settings.broker_port(number)}")
    live = sorted(broker for broker, alive in known.items() if alive)
    if number not in live:
        raise Unhealthy(f"broker {number} is not among the live brokers yet ({live})")
    return f"{len(live)} broker{'s' if len(live) > 1 else ''} live, cluster {cluster_id}"


@dataclass(frozen=True)
class Partition:
    """One partition of a topic as the cluster's metadata has it: its leader (-1 while it has none), its
    replicas and those in sync with the leader."""

    topic: str
    number: int
    leader: int
    replicas: tuple[int, ...]
    in_sync: tuple[int, ...]


def partitions(settings: StackSettings, topics: list[str] | None = None) -> list[Partition]:
    """Every partition of `topics` (the missing ones have none; None: of every topic), asked of whichever
    broker answers."""
    admin = _admin(settings.kafka_bootstrap)
    try:
        found = admin.describe_topics(topics)
    except KafkaError as exc:
        raise Unhealthy(f"metadata request failed: {exc}") from exc
    finally:
        admin.close()
    return [Partition(topic["name"], part["partition_index"], part["leader_id"], tuple(part["replica_nodes"]),
                      tuple(part["isr_nodes"]))
            for topic in found for part in topic.get("partitions", [])]


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
            "REPLICATION": str(settings.kafka_replication),
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
    name=broker_name(1),
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


def broker(number: int) -> Service:
    """The cluster profile's broker `number` (2, 3, ...): a broker only, joining the first one's cluster."""
    if number == 1:
        return BROKER
    return Service(name=broker_name(number), port_fields=(), command=lambda settings: broker_command(settings, number),
                   probe=lambda settings: probe_broker(settings, number),
                   prepare=lambda settings: prepare_broker(settings, number), after=(BROKER.name,),
                   jar_bundles=("kafka",))


def brokers(count: int) -> list[Service]:
    """The first `count` brokers (TIDE_KAFKA_BROKERS of a stack)."""
    return [broker(number) for number in range(1, count + 1)]


def connect_after(count: int) -> Service:
    """Connect, started once each of `count` brokers is healthy: its topics take a replica on up to three."""
    return CONNECT if count == 1 else replace(CONNECT, after=tuple(service.name for service in brokers(count)))
