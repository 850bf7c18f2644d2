"""Slot safety (pure): which slot states warn, what each warning says, and how the status shows them."""

from dataclasses import replace

from services.capture.connector.slot_safety import RESNAPSHOT, slot_warnings
from services.settings import StackSettings
from services.status import metrics
from services.status.cli import problems_text
from services.status.figures import to_json
from tests.unit.test_status import _samples, _status

MB = 1024 * 1024


def test_a_healthy_slot_below_the_threshold_warns_nothing():
    assert slot_warnings("s", "reserved", 10 * MB, 512 * MB) == ()
    assert slot_warnings("s", None, None, 0) == ()  # no slot: nothing to say about its WAL


def test_lag_over_the_threshold_warns_with_both_figures_and_where_to_look():
    (warning,) = slot_warnings("s", "extended", 600 * MB, 512 * MB)
    assert f"{600 * MB} bytes" in warning and "TIDE_SLOT_LAG_WARN_BYTES" in warning and str(512 * MB) in warning
    assert "tide connector status" in warning
    assert slot_warnings("s", "reserved", 512 * MB, 512 * MB) == (), "at the threshold is not over it"


def test_an_unreserved_slot_warns_that_the_next_checkpoint_may_invalidate_it():
    warnings = slot_warnings("s", "unreserved", 3000 * MB, 512 * MB)
    assert len(warnings) == 2 and "unreserved" in warnings[0] and "next checkpoint" in warnings[0]


def test_a_lost_slot_says_only_that_it_is_lost_and_names_the_re_snapshot():
    (warning,) = slot_warnings("tl_slot", "lost", 3000 * MB, 512 * MB)
    assert "tl_slot" in warning and "invalidated" in warning and RESNAPSHOT in warning
    assert "tide connector delete --drop-slot" in RESNAPSHOT and "tide connector apply" in RESNAPSHOT
    assert "\n" not in warning


def test_the_threshold_is_a_typed_setting_from_the_environment(monkeypatch):
    monkeypatch.setenv("TIDE_SLOT_LAG_WARN_BYTES", "1048576")
    assert StackSettings().slot_lag_warn_bytes == MB
    monkeypatch.setenv("TIDE_SLOT_LAG_WARN_BYTES", "-1")
    try:
        StackSettings()
    except ValueError as exc:
        assert "slot_lag_warn_bytes" in str(exc)
    else:
        raise AssertionError("a negative threshold was accepted")


def test_status_json_metrics_and_terminal_carry_the_warning():
    status = _status()
    lost = replace(status, source=replace(status.source, slot_wal_status="lost", slot_lag_warn_bytes=MB))
    assert to_json(status)["warnings"] == []
    (warning,) = to_json(lost)["warnings"]
    assert "invalidated" in warning and warning in problems_text(lost)
    samples = _samples(metrics.render(lost))
    assert samples[("tideline_replication_slot_lost", (("slot", "tideline"),))] == 1
    assert samples[("tideline_status_warnings", ())] == 1
    assert samples[("tideline_replication_slot_lag_warn_bytes", (("slot", "tideline"),))] == MB
    assert _samples(metrics.render(status))[("tideline_replication_slot_lost", (("slot", "tideline"),))] == 0
