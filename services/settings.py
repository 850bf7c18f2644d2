"""Typed settings for the local stack, read from the environment and `.env` at start-up.

Every setting is `TIDE_<FIELD>` in the environment (e.g. `TIDE_POSTGRES_PORT`).
Secrets are `SecretStr` so they never show up in reprs or logs; `.env` is
git-ignored and `.env.example` lists every variable.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from services.versions import PROJECT_ROOT
from spark_jobs.model.errors import ConfigurationError
from spark_jobs.model.settings import REALTIME_CAPABLE, sink_names

Port = Annotated[int, Field(ge=1, le=65535)]
JvmSize = Annotated[str, Field(pattern=r"^\d+[mMgG]$")]


# Well below the 2GB max_slot_wal_keep_size the local stack runs with: time to act before invalidation.
DEFAULT_LAG_WARN_BYTES = 512 * 1024 * 1024
# As many Kafka brokers as the cluster profile may run (what stopping looks for, whatever the setting says now).
MOST_BROKERS = 5
ENV_FILE = PROJECT_ROOT / ".env"  # git-ignored; `make` writes it from .env.example


class StackSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIDE_",
        env_file=ENV_FILE,
        extra="ignore",
        frozen=True,
    )

    state_dir: Path = PROJECT_ROOT / ".tideline"
    # Resolved jars are derived from the pin file alone, so every stack (yours, the tests') shares them.
    lib_dir: Path = PROJECT_ROOT / ".tideline" / "lib"
    # The declarative pipeline file (captured tables and views).
    pipeline_file: Path = PROJECT_ROOT / "pipeline.yaml"
    # Services listen on loopback unless told otherwise (secure default).
    host: str = "127.0.0.1"
    # Where clients reach each service; unset means `host` (the local stack, all on one machine).
    # Set them when services run elsewhere, e.g. as compose service names (`host_of`).
    postgres_host: str | None = None
    redis_host: str | None = None
    kafka_host: str | None = None
    connect_host: str | None = None
    elasticsearch_host: str | None = None
    # The cluster profile's Spark master, and the jobs' driver as the executors reach it (docs/cluster.md).
    spark_master_host: str | None = None
    jobs_host: str | None = None
    # PostgreSQL as Kafka Connect reaches it (the connector's database.hostname); unset = postgres's host.
    connector_database_host: str | None = None

    postgres_port: Port = 5432
    postgres_db: str = "tideline"
    postgres_user: str = "tideline"
    postgres_password: SecretStr | None = None
    # An existing PostgreSQL to capture (a URL, postgresql://user:password@host:port/db, or libpq's
    # key=value form). Set, the stack starts no PostgreSQL of its own and Tideline never creates or
    # alters its tables: what it states in the URL replaces postgres_host/port/db/user/password
    # (docs/own-database.md).
    postgres_url: SecretStr | None = None
    # Least-privilege role Debezium logs in as (LOGIN REPLICATION, SELECT on captured tables).
    cdc_user: str = "tideline_cdc"
    cdc_password: SecretStr | None = None
    # Caps the WAL a stalled replication slot may pin (invalidates the slot instead of filling the disk).
    postgres_max_slot_wal_keep_size: str = "2GB"
    # `tide status`, GET /status and /metrics warn when the slot holds more WAL than this (bytes):
    # well before the cap above invalidates it (docs/reliability.md, Slot safety).
    slot_lag_warn_bytes: int = Field(default=DEFAULT_LAG_WARN_BYTES, ge=0)

    redis_port: Port = 6379
    kafka_port: Port = 9092
    kafka_controller_port: Port = 9093
    connect_port: Port = 8083
    elasticsearch_port: Port = 9200
    elasticsearch_transport_port: Port = 9300
    # The query API (`tide api`, and the managed process `tide up` starts).
    api_port: Port = 8000
    # The cluster profile's Spark standalone master (RPC, web UI and its JSON); worker N's web UI is
    # spark_worker_webui_port + N - 1 (docs/cluster.md).
    spark_master_port: Port = 7077
    spark_master_webui_port: Port = 8080
    spark_worker_webui_port: Port = 8091
    # The cluster profile's Kafka brokers after the first: broker N (N >= 2) listens on kafka_broker_port + N - 2.
    kafka_broker_port: Port = 9094

    # Heaps sized so everything fits a 2-core, 24 GiB machine together with Spark.
    kafka_heap: JvmSize = "512m"
    connect_heap: JvmSize = "768m"
    elasticsearch_heap: JvmSize = "512m"

    # Apply jobs (passed to the Spark driver as TIDE_JOB_*): back-pressure and memory.
    job_trigger_interval: str = "2 seconds"
    job_max_offsets_per_trigger: int = Field(default=20_000, ge=1)
    job_driver_memory: JvmSize = "2g"  # spark_jobs/model/settings.py says why
    # The cache sink's Redis database (a truncate scans it, so it is best not shared).
    job_redis_db: int = Field(default=0, ge=0, le=15)
    # The queries run in Spark's Real-Time Mode (docs/apply.md); the others run micro-batches.
    job_realtime_sinks: Annotated[list[str], NoDecode] = list(REALTIME_CAPABLE)

    # The cluster profile (docs/cluster.md): with N > 0 the stack runs a Spark standalone master and N
    # workers, each a process of its own, and the jobs run on them (TIDE_JOB_MASTER=spark://...). 0: the
    # jobs run in a local driver.
    spark_workers: int = Field(default=0, ge=0, le=8)
    # What each worker offers executors. Cores are task slots, not CPUs: a real-time task holds one for as
    # long as its query runs, mostly waiting in Kafka's fetch, and the jobs ask for one per partition their
    # real-time queries read plus 4 (the demo: 28; a chaos run's pipeline more). Each worker offers all the
    # jobs need, so either one alone takes the other's executors when it dies (docs/cluster.md).
    spark_worker_cores: int = Field(default=64, ge=1)
    spark_worker_memory: JvmSize = "3g"
    job_executor_memory: JvmSize = "1g"
    # The cluster profile's Kafka (docs/cluster.md): N > 1 adds brokers 2..N (brokers only) to the first
    # (broker and the KRaft controller); topics the stack creates are replicated min(N, 3) times with
    # min.insync.replicas one less, so one broker may die without a write refused or a record lost.
    kafka_brokers: int = Field(default=1, ge=1, le=MOST_BROKERS)

    startup_timeout_s: float = Field(default=240.0, gt=0)

    _realtime_names = field_validator("job_realtime_sinks", mode="before")(lambda value: sink_names(value))

    @model_validator(mode="before")
    @classmethod
    def _source_from_url(cls, values: Any) -> Any:
        """Spread TIDE_POSTGRES_URL over the postgres_* fields: the parts it states win."""
        if not isinstance(values, dict) or not values.get("postgres_url"):
            return values
        url = values["postgres_url"]
        parts = _url_parts(url.get_secret_value() if isinstance(url, SecretStr) else str(url))
        return {**values, **parts}

    @model_validator(mode="after")
    def _ports_are_distinct(self) -> StackSettings:
        ports = self.ports()
        seen: dict[int, str] = {}
        for name, port in ports.items():
            if port in seen:
                raise ValueError(f"{name} and {seen[port]} are both set to port {port}; give each its own port")
            seen[port] = name
        return self

    def ports(self) -> dict[str, int]:
        """Every port field of a service this stack runs, by name (used for the distinctness check and
        the port-in-use check): an existing PostgreSQL's port is its own business."""
        ports = {name: value for name, value in self.model_dump().items() if name.endswith("_port")}
        # The cluster profile's workers after the first take the web UI ports after its.
        ports |= {f"spark_worker_{number}_webui_port": self.spark_worker_webui_port + number - 1
                  for number in range(2, self.spark_workers + 1)}
        # The same for the profile's brokers after the second (kafka_broker_port is the second's).
        ports |= {f"kafka_broker_{number}_port": self.broker_port(number)
                  for number in range(3, self.kafka_brokers + 1)}
        if self.source_external:
            del ports["postgres_port"]
        return ports

    @property
    def source_external(self) -> bool:
        """Whether the source is a PostgreSQL Tideline did not start (TIDE_POSTGRES_URL is set)."""
        return self.postgres_url is not None

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def loopback_only(self) -> bool:
        """Whether services listen on loopback only, as on one machine. In a container they listen on
        every interface of the container (docker-compose.yml sets TIDE_HOST=0.0.0.0)."""
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a name
            return self.host == "localhost"

    @property
    def spark_cluster(self) -> bool:
        """Whether the jobs run on a Spark standalone cluster of the stack's own (the cluster profile)."""
        return self.spark_workers > 0

    def host_of(self, service: Literal["postgres", "redis", "kafka", "connect", "elasticsearch", "spark_master",
                                       "jobs"]) -> str:
        """The host clients use to reach `service`: its own setting, else `host`."""
        return getattr(self, f"{service}_host") or self.host

    def broker_port(self, number: int) -> int:
        """Kafka broker `number`'s client port (1: kafka_port; the cluster profile's others after kafka_broker_port)."""
        return self.kafka_port if number == 1 else self.kafka_broker_port + number - 2

    def broker_host(self, number: int) -> str:
        """Where clients reach broker `number`: Kafka's host; in containers (TIDE_KAFKA_HOST set) the cluster
        profile's other brokers by their own service names, `kafka-2`, ..."""
        return self.host_of("kafka") if number == 1 or self.kafka_host is None else f"{self.kafka_host}-{number}"

    @property
    def kafka_bootstrap(self) -> str:
        """Every broker, so a client starts (and a Spark task re-reads metadata) whichever of them is down."""
        return ",".join(f"{self.broker_host(number)}:{self.broker_port(number)}"
                        for number in range(1, self.kafka_brokers + 1))

    @property
    def kafka_replication(self) -> int:
        """Replicas of each topic the stack creates: one per broker, at most three."""
        return min(self.kafka_brokers, 3)

    @property
    def kafka_min_insync(self) -> int:
        """The replicas a write waits for (acks=all): all but one, so one broker may be down."""
        return max(self.kafka_replication - 1, 1)

    def require_postgres_password(self) -> str:
        return _require_secret("postgres_password", self.postgres_password)

    def require_cdc_password(self) -> str:
        return _require_secret("cdc_password", self.cdc_password)


# libpq's names for the parts of a connection string -> the settings they fill.
_URL_FIELDS = {"host": "postgres_host", "port": "postgres_port", "dbname": "postgres_db",
               "user": "postgres_user", "password": "postgres_password"}


def _url_parts(url: str) -> dict[str, str]:
    """The postgres_* settings a connection URL states. One host only: the connector, the jobs and
    verify all reach the source at one address."""
    try:
        parts = conninfo_to_dict(url)
    except ProgrammingError as exc:
        raise ValueError(f"TIDE_POSTGRES_URL is not a PostgreSQL connection URL ({str(exc).strip()}): "
                         "write it as postgresql://user:password@host:port/dbname") from None
    if "," in str(parts.get("host", "")):
        raise ValueError("TIDE_POSTGRES_URL names several hosts: give the one primary Tideline captures")
    if not parts.get("host") or str(parts["host"]).startswith("/"):
        raise ValueError("TIDE_POSTGRES_URL has no TCP host: Kafka Connect reaches the source over TCP, "
                         "write postgresql://user:password@host:port/dbname")
    return {field: str(parts[name]) for name, field in _URL_FIELDS.items() if parts.get(name)}


def _require_secret(field: str, value: SecretStr | None) -> str:
    if value is None:
        raise SettingsError(
            f"TIDE_{field.upper()} is not set: run `make env` (creates .env from .env.example) or export it"
        )
    return value.get_secret_value()


class SettingsError(ConfigurationError):
    """A setting is missing or unusable; the message names the fix."""
