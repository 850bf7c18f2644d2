"""Redis from Debian's packages."""

from __future__ import annotations

import shutil

import redis

from services.settings import StackSettings
from services.stack.service import Service, StackError, Unhealthy


def command(settings: StackSettings) -> list[str]:
    server = shutil.which("redis-server")
    if server is None:
        raise StackError("redis-server not found: install Debian's redis-server (run `make setup`)")
    data = settings.state_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    # Append-only file so a restart keeps the cache warm; it can always be rebuilt from Kafka.
    return [
        server,
        "--bind", settings.host,
        "--port", str(settings.redis_port),
        "--dir", str(data),
        "--daemonize", "no",
        "--appendonly", "yes",
        "--save", "",
        # Protected mode refuses every client beyond loopback while there is no password: in a container,
        # the other containers are the clients (and only the compose network and loopback reach it).
        "--protected-mode", "yes" if settings.loopback_only else "no",
    ]  # fmt: skip


def probe(settings: StackSettings) -> str:
    client = redis.Redis(host=settings.host_of("redis"), port=settings.redis_port, socket_connect_timeout=2,
                         socket_timeout=2)
    try:
        client.ping()
        version = client.info("server")["redis_version"]
    except redis.RedisError as exc:
        raise Unhealthy(str(exc)) from exc
    finally:
        client.close()
    return f"PONG, redis {version}"


SERVICE = Service(name="redis", port_fields=("redis_port",), command=command, probe=probe)
