"""The one way tests synchronise: poll real state until a predicate holds, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, reason: str, interval: float = 0.25) -> T:
    """Return the first truthy value of predicate(); fail with `reason` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - the state is not there yet; keep the last error for the message
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {reason}{detail}")
        time.sleep(interval)  # poll
