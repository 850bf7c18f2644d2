import pytest

from services.stack import runner
from services.stack.members import MEMBERS
from services.stack.service import StackError


def test_selecting_a_service_brings_what_it_starts_after():
    for service in MEMBERS.values():
        selected = {s.name for s in runner.select([service.name])}
        assert set(service.after) <= selected


def test_unknown_service_is_a_clear_error():
    with pytest.raises(StackError, match="unknown service nope; known: postgres"):
        runner.select(["nope"])


def test_every_port_field_names_a_setting():
    from services.settings import StackSettings

    settings = StackSettings()
    for service in MEMBERS.values():
        for field in service.port_fields:
            assert isinstance(getattr(settings, field), int)


def test_stopping_a_service_stops_what_depends_on_it_but_not_what_it_depends_on():
    assert [s.name for s in runner.with_dependants(["connect"])] == ["connect"]
    assert [s.name for s in runner.with_dependants(["kafka"])] == ["kafka", "connect"]
