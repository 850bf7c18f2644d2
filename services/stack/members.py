"""The table of services the local stack runs, in start order."""

from __future__ import annotations

from services.settings import StackSettings
from services.stack import elasticsearch, kafka, postgres, redis
from services.stack.service import Service

MEMBERS: dict[str, Service] = {
    service.name: service
    for service in (postgres.SERVICE, redis.SERVICE, kafka.BROKER, kafka.CONNECT, elasticsearch.SERVICE)
}


def managed(settings: StackSettings) -> dict[str, Service]:
    """The services this stack starts: every one, but PostgreSQL when the source is one the user
    brings (TIDE_POSTGRES_URL): that one is reached, never started or stopped."""
    if not settings.source_external:
        return MEMBERS
    return {name: service for name, service in MEMBERS.items() if name != postgres.SERVICE.name}
