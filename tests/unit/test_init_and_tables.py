"""`tide init`'s choice of tables and the file it writes; `tide tables`' edits of pipeline.yaml (pure)."""

from pathlib import Path

import pytest
import yaml

from services.capture.source import introspect
from services.stack.service import StackError
from services.tables import ops, pipeline_file
from spark_jobs.model.catalogue import Column, TableSchema
from spark_jobs.model.config import DEFAULT_PATH, PipelineConfigError, TableConfig, load


def found(table: str, key: tuple[str, ...] = ("id",), identity: str = "d", **columns: str) -> introspect.Found:
    typed = {"id": Column("id", "INT8"), **{column: Column(column, kind) for column, kind in columns.items()}}
    return introspect.Found(table, False, None, identity, TableSchema(typed, key))


def test_init_captures_keyed_tables_with_text_columns_as_full_text_and_says_why_others_are_left_out():
    choice = introspect.choose([
        found("accounts", name="TEXT", email="VARCHAR", country="BPCHAR", profile="JSONB"),
        found("memberships", key=("account_id", "team"), account_id="INT8", team="TEXT", note="TEXT"),
        found("audit_log", key=()),
        found("queue", identity="n"),
        found("Mixed"),
        found("debezium_signal"),
        introspect.Found("events", True, None, "d", TableSchema({}, ())),
        introspect.Found("events_2026", False, "events", "d", TableSchema({}, ("id",))),
    ])
    assert choice.captured["accounts"].search.text == ["name", "email"]
    assert choice.captured["memberships"].search.text == ["note"]  # the key's text columns are exact keywords
    assert all(views.cache is not None and views.warehouse is not None for views in choice.captured.values())
    assert choice.skipped == {
        "audit_log": "no primary key: every view is keyed by it; add one, then `tide tables add audit_log`",
        "queue": "REPLICA IDENTITY NOTHING: its updates and deletes would carry no key; set it to DEFAULT",
        "Mixed": "pipeline.yaml names tables in lowercase letters, digits and _ only: rename it to capture it",
        "debezium_signal": "Tideline's own (Debezium's signals, heartbeats)",
        "events": "partitioned table: partitioned tables are not captured yet",
        "events_2026": "partition of events: partitioned tables are not captured yet",
    }


def test_the_written_file_loads_as_every_entry_point_loads_it_and_lists_the_skipped_tables(tmp_path):
    choice = introspect.choose([found("accounts", name="TEXT"), found("audit_log", key=())])
    path = tmp_path / "pipeline.yaml"
    path.write_text(introspect.render("app", choice))
    pipeline = load(path)
    assert pipeline.source.schema_name == "app" and pipeline.source.support_schema == "tideline"
    assert list(pipeline.tables) == ["accounts"]
    assert "# not captured: audit_log: no primary key" in path.read_text()


ENTRY = TableConfig.model_validate({"search": {"text": ["body"]}, "cache": {}, "warehouse": {}})


def test_adding_a_table_appends_its_entry_and_keeps_every_comment():
    text = DEFAULT_PATH.read_text()
    added = pipeline_file.with_table(text, "notes", ENTRY, DEFAULT_PATH)
    assert added.count("\n#") == text.count("\n#")
    parsed = yaml.safe_load(added)
    assert list(parsed["tables"])[-1] == "notes"
    assert parsed["tables"]["notes"] == {"search": {"text": ["body"]}, "cache": {}, "warehouse": {}}
    assert {key: value for key, value in parsed.items() if key != "tables"} == \
        {key: value for key, value in yaml.safe_load(text).items() if key != "tables"}


def test_removing_a_table_takes_exactly_its_entry_and_adding_it_back_restores_the_file():
    text = DEFAULT_PATH.read_text()
    added = pipeline_file.with_table(text, "notes", ENTRY, DEFAULT_PATH)
    assert pipeline_file.without_table(added, "notes", DEFAULT_PATH) == text
    without = yaml.safe_load(pipeline_file.without_table(text, "products", DEFAULT_PATH))
    assert list(without["tables"]) == ["customers", "orders", "order_items"]


def test_adding_a_table_init_left_out_drops_inits_note_about_it():
    text = introspect.render("app", introspect.choose([found("accounts"), found("audit_log", key=())]))
    added = pipeline_file.with_table(text, "audit_log", ENTRY, DEFAULT_PATH)
    assert "not captured: audit_log" not in added and "audit_log:" in added


def test_an_edit_that_breaks_the_pipeline_is_refused_naming_the_file_and_the_file_is_untouched(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(DEFAULT_PATH.read_text())
    text = pipeline_file.without_table(path.read_text(), "orders", path)  # the nested view and windows need it
    with pytest.raises(PipelineConfigError, match=rf"^{path}: .*unknown table"):
        pipeline_file.validated(path, text)
    assert path.read_text() == DEFAULT_PATH.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.yaml"]


def test_a_file_without_a_block_tables_section_is_refused_with_a_line_saying_to_edit_it_by_hand():
    with pytest.raises(PipelineConfigError, match="no entry `  ghost:` under `tables:`; edit the file by hand"):
        pipeline_file.without_table(DEFAULT_PATH.read_text(), "ghost", Path("pipeline.yaml"))
    with pytest.raises(PipelineConfigError, match="no top-level `tables:` line"):
        pipeline_file.with_table("source: {}\n", "notes", ENTRY, Path("pipeline.yaml"))


def test_tables_add_gives_inits_views_less_those_turned_off_and_checks_search_columns():
    table = found("notes", body="TEXT", title="VARCHAR")
    assert ops.table_views(table, ops.ViewChoice()) == introspect.views(table)
    chosen = ops.table_views(table, ops.ViewChoice(text=["title"], cache=False, history=True))
    assert chosen.search.text == ["title"] and chosen.cache is None and chosen.warehouse.history
    with pytest.raises(StackError, match="--search names nope, not a column of notes: choose from id, body, title"):
        ops.table_views(table, ops.ViewChoice(text=["nope"]))
    with pytest.raises(StackError, match=r"^audit cannot be captured: no primary key"):
        ops.table_views(found("audit", key=()), ops.ViewChoice())
