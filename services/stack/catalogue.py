"""The table of services the local stack runs, in start order."""

from __future__ import annotations

from services.stack import elasticsearch, kafka, postgres, redis
from services.stack.service import Service

CATALOGUE: dict[str, Service] = {
    service.name: service
    for service in (postgres.SERVICE, redis.SERVICE, kafka.BROKER, kafka.CONNECT, elasticsearch.SERVICE)
}
