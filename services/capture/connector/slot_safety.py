"""What a replication slot's state means for the stream, as one-line warnings naming the fix (pure).

A stopped connector leaves its slot inactive: PostgreSQL keeps every WAL segment from the slot's
restart point on, so the lag grows with every write. Past `max_slot_wal_keep_size` PostgreSQL may
remove those segments at the next checkpoint (`wal_status` `unreserved`), and then invalidates the
slot (`lost`): the changes in the removed WAL are gone, and resuming would skip them. The only
recovery is a new slot and a new snapshot (docs/reliability.md, Slot safety).
"""

from __future__ import annotations

RESNAPSHOT = ("`tide connector delete --drop-slot` then `tide connector apply` (a new slot and a new snapshot), "
              "then `tide verify`")


def lost_message(slot: str) -> str:
    return (f"replication slot {slot} was invalidated (wal_status lost): PostgreSQL removed WAL it still needed "
            f"after it passed max_slot_wal_keep_size, so changes are missing from the stream and it cannot resume; "
            f"re-snapshot: {RESNAPSHOT}")


def gone_message(slot: str, connector: str) -> str:
    return (f"replication slot {slot} is gone but connector {connector} still has an offset to resume from: "
            f"a new slot would start at the current WAL position and skip the changes in between; "
            f"re-snapshot: {RESNAPSHOT}")


def unreserved_message(slot: str) -> str:
    return (f"replication slot {slot} holds more WAL than max_slot_wal_keep_size (wal_status unreserved): the next "
            "checkpoint may invalidate it; get the connector running now "
            "(`tide connector status`, `tide connector restart`)")


def lag_message(slot: str, lag_bytes: int, threshold: int) -> str:
    return (f"replication slot {slot} holds {lag_bytes} bytes of WAL, over TIDE_SLOT_LAG_WARN_BYTES ({threshold}): "
            "the connector is not confirming changes; see `tide connector status`")


def slot_warnings(slot: str, wal_status: str | None, lag_bytes: int | None, threshold: int) -> tuple[str, ...]:
    """The warnings a slot's state calls for, most severe first; none for a healthy slot."""
    if wal_status == "lost":
        return (lost_message(slot),)  # lag and reservation no longer mean anything
    warnings = []
    if wal_status == "unreserved":
        warnings.append(unreserved_message(slot))
    if lag_bytes is not None and lag_bytes > threshold:
        warnings.append(lag_message(slot, lag_bytes, threshold))
    return tuple(warnings)
