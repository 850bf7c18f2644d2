import pytest

from services.stack.templates import render


def test_placeholders_are_substituted_and_config_provider_references_kept(tmp_path):
    template = tmp_path / "in.properties"
    template.write_text("port=${PORT}\npassword=${env:PG_PASSWORD}\nfile=${file:/x.properties:key}\n")
    out = render(template, tmp_path / "out" / "x.properties", {"PORT": "9092"})
    assert out.read_text() == "port=9092\npassword=${env:PG_PASSWORD}\nfile=${file:/x.properties:key}\n"


def test_unknown_placeholder_is_an_error_not_an_empty_value(tmp_path):
    template = tmp_path / "in.properties"
    template.write_text("a=${A}\nb=${B}\n")
    with pytest.raises(KeyError, match="no value: B"):
        render(template, tmp_path / "out.properties", {"A": "1"})
