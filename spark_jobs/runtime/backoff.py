"""The one back-off rule of the jobs: wait `first_s`, doubling up to `max_s`; back to `first_s` once
the thing retried has run healthily for `healthy_after_s`. Used by the keep-alive (a dead driver),
the supervisor (a failed query) and a query waiting for its store."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("tideline.backoff")


@dataclass
class Backoff:
    first_s: float = 1.0
    max_s: float = 30.0
    healthy_after_s: float = 60.0
    current_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.current_s = self.first_s

    def after(self, ran_s: float = 0.0) -> float:
        """Seconds to wait before the next try, given how long the last one ran (0: it never started)."""
        if ran_s >= self.healthy_after_s:
            self.reset()
        wait, self.current_s = self.current_s, min(self.current_s * 2, self.max_s)
        return wait

    def reset(self) -> None:
        """The next try is a first one again (e.g. the operator resumed a paused query)."""
        self.current_s = self.first_s


def wait_until(ready: Callable[[], bool], what: str) -> None:
    """Return once `ready()` is true, checking with back-off and logging `what` waits."""
    backoff = Backoff()
    while not ready():
        delay = backoff.after()
        log.warning("%s waits %.0fs", what, delay)
        time.sleep(delay)  # back-off while the store is down


__all__ = ["Backoff", "wait_until"]
