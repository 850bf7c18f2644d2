"""Topics the jobs write to (the dead-letter topic, the real-time sinks' follow-up topics), created before
the first record with the replication the stack's brokers allow: a topic Kafka creates on its first
record takes the broker's defaults, which a broker that joined a running cluster does not set."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spark_jobs.model.settings import JobSettings

# (bootstrap, topic) known to exist in this process: a query restarted after a fault (Kafka away included)
# does not ask again, so its restart never waits on Kafka's admin API for a topic created at the driver's start.
_KNOWN: set[tuple[str, str]] = set()


def ensure_topic(settings: JobSettings, topic: str, retention_ms: int | None = None) -> bool:
    """Create `topic` (one partition, TIDE_JOB_KAFKA_REPLICATION replicas, all but one of them in sync for a
    write) unless it exists; whether it was created. `retention_ms`: how long records stay (the broker's
    default: a week)."""
    known = (settings.kafka_bootstrap, topic)
    if known in _KNOWN:
        return False
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    replication = settings.kafka_replication
    configs = {"min.insync.replicas": str(max(replication - 1, 1))}
    if retention_ms is not None:
        configs["retention.ms"] = str(retention_ms)
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        if topic in set(admin.list_topics()):
            created = False
        else:
            admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=replication,
                                          topic_configs=configs)])
            created = True
    except TopicAlreadyExistsError:
        created = False  # another driver created it first
    finally:
        admin.close()
    _KNOWN.add(known)
    return created


__all__ = ["ensure_topic"]
