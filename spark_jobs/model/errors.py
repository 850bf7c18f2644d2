"""The root of every error Tideline raises on purpose, and its four kinds (the whole tree, with where
each error lives: docs/errors.md). An error under the root has a message of one line naming the
problem and the fix; the CLI prints it without a traceback, and the jobs refuse to start with it.
Anything else that escapes is a bug.
"""

from __future__ import annotations


class TidelineError(Exception):
    """An error Tideline raises on purpose: its message names the problem and the fix, in one line."""


class ConfigurationError(TidelineError):
    """What the user configured is wrong (pipeline.yaml, a TIDE_* setting, a sink's name): nothing
    starts until it is fixed, and retrying does not help."""


class StoreError(TidelineError):
    """A store cannot take a batch now (down, or still conflicting after retries): the batch fails,
    and Spark runs it again (every write is idempotent)."""


class StoreStateError(TidelineError):
    """A store holds what this Tideline cannot continue from (another encoding or declaration):
    rebuild it (`tide rebuild SINK`)."""


class ChangeError(TidelineError, ValueError):
    """One change record cannot be decoded or applied: it goes to the dead-letter topic with this
    message as its reason, and the rest of its batch is applied."""
