"""The table of services the local stack runs, in start order."""

from __future__ import annotations

from services.settings import MOST_BROKERS, StackSettings
from services.stack import elasticsearch, kafka, postgres, redis, spark
from services.stack.service import Service

# Every stack's services; the cluster profile adds Kafka brokers, a Spark master and workers (`members`).
MEMBERS: dict[str, Service] = {
    service.name: service
    for service in (postgres.SERVICE, redis.SERVICE, kafka.BROKER, kafka.CONNECT, elasticsearch.SERVICE)
}
# As many workers as the profile's setting allows: what `down` looks for, whatever the setting says now.
MOST_WORKERS = 8


def members(settings: StackSettings, workers: int | None = None, brokers: int | None = None) -> dict[str, Service]:
    """The services of this stack: MEMBERS, and with the cluster profile its other Kafka brokers (Connect
    after all of them), its Spark master and workers (`workers` and `brokers` of them if given, else as many
    as TIDE_SPARK_WORKERS and TIDE_KAFKA_BROKERS say)."""
    count = brokers or settings.kafka_brokers
    every = [postgres.SERVICE, redis.SERVICE, *kafka.brokers(count), kafka.connect_after(count), elasticsearch.SERVICE,
             *spark.members(settings, workers)]
    return {service.name: service for service in every}


def every_member(settings: StackSettings) -> list[Service]:
    """Every service a stack may have started, whatever its settings say now (what stopping looks for)."""
    return list(members(settings, MOST_WORKERS, MOST_BROKERS).values())


def managed(settings: StackSettings) -> dict[str, Service]:
    """The services this stack starts: every member, but PostgreSQL when the source is one the user
    brings (TIDE_POSTGRES_URL): that one is reached, never started or stopped."""
    if not settings.source_external:
        return members(settings)
    return {name: service for name, service in members(settings).items() if name != postgres.SERVICE.name}
