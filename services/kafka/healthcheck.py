"""Stdlib-only Kafka broker health check (Tideline).

Sends a Kafka Metadata v4 request (all topics) over a raw socket and returns the
registered brokers + cluster id. Metadata v4 is non-flexible and supported by Kafka 4.x
(KIP-896 removed v0-v3). A broker answers only after it has registered with the KRaft
controller and caught up on metadata, so "brokers non-empty" == ready for clients.

    python3 services/kafka/healthcheck.py localhost 9092   # exit 0 when healthy
"""
from __future__ import annotations

import socket
import struct
import sys


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return buf


def _string(data: bytes, off: int) -> tuple[str | None, int]:
    (length,) = struct.unpack_from(">h", data, off)
    off += 2
    if length < 0:
        return None, off
    return data[off : off + length].decode(), off + length


def metadata(host: str, port: int, timeout: float = 3.0) -> dict:
    """Return {"cluster_id", "controller_id", "brokers": [(id, host, port)], "topics": [...]}."""
    client_id = b"tideline-health"
    # request header v1: api_key=3 (Metadata), api_version=4, correlation_id, client_id
    header = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id
    body = struct.pack(">i?", -1, False)  # topics=null (all), allow_auto_topic_creation=false
    payload = header + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", _read_exact(sock, 4))
        data = _read_exact(sock, size)
    off = 4  # correlation_id
    off += 4  # throttle_time_ms
    (n_brokers,) = struct.unpack_from(">i", data, off)
    off += 4
    brokers = []
    for _ in range(max(n_brokers, 0)):
        (node_id,) = struct.unpack_from(">i", data, off)
        off += 4
        bhost, off = _string(data, off)
        (bport,) = struct.unpack_from(">i", data, off)
        off += 4
        _rack, off = _string(data, off)
        brokers.append((node_id, bhost, bport))
    cluster_id, off = _string(data, off)
    (controller_id,) = struct.unpack_from(">i", data, off)
    off += 4
    (n_topics,) = struct.unpack_from(">i", data, off)
    off += 4
    topics = []
    for _ in range(max(n_topics, 0)):
        off += 2  # error_code
        name, off = _string(data, off)
        off += 1  # is_internal
        (n_parts,) = struct.unpack_from(">i", data, off)
        off += 4
        for _ in range(max(n_parts, 0)):
            off += 2 + 4 + 4  # error_code, partition_index, leader_id (v4: no leader_epoch)
            for _arr in range(2):  # replica_nodes, isr_nodes (offline_replicas only from v5)
                (n,) = struct.unpack_from(">i", data, off)
                off += 4 + 4 * max(n, 0)
        topics.append((name, n_parts))
    return {"cluster_id": cluster_id, "controller_id": controller_id, "brokers": brokers, "topics": topics}


def is_healthy(host: str, port: int, timeout: float = 3.0) -> bool:
    try:
        return bool(metadata(host, port, timeout)["brokers"])
    except (OSError, ConnectionError, struct.error):
        return False


if __name__ == "__main__":
    h = sys.argv[1] if len(sys.argv) > 1 else "localhost"
    p = int(sys.argv[2]) if len(sys.argv) > 2 else 9092
    try:
        print(metadata(h, p))
    except Exception as exc:  # noqa: BLE001 - CLI: report and fail
        print(f"unhealthy: {exc!r}", file=sys.stderr)
        sys.exit(1)
