"""Which TCP addresses a set of processes listens on, read from /proc (Linux): for the secure-default
tests, which must see every socket a service opens, not just the port it was told to use."""

from __future__ import annotations

import ipaddress
from pathlib import Path

_LISTEN = "0A"


def descendants(pid: int) -> set[int]:
    """`pid` and every process below it (JVMs and Python workers fork helpers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo += children.get(current, [])
    return found


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = fd.readlink().name if fd.is_symlink() else ""
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        except OSError:
            continue
    return inodes


def _address(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # /proc prints the address as host-order 32-bit words.
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(packed)), int(port, 16)


def listening(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket owned by one of `pids`."""
    inodes = _socket_inodes(pids)
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == _LISTEN and fields[9] in inodes:
                found.add(_address(fields[1]))
    return found


def _is_loopback(host: str) -> bool:
    address = ipaddress.ip_address(host)
    # A JVM's IPv4 socket shows in tcp6 as ::ffff:127.0.0.1, which Python does not call loopback.
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def not_loopback(addresses: set[tuple[str, int]]) -> set[tuple[str, int]]:
    return {(host, port) for host, port in addresses if not _is_loopback(host)}
