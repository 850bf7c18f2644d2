"""Edit pipeline.yaml's `tables:` as text, so its comments and layout stay as the user wrote them.

Only the one table's entry is written or removed; the result is validated as every entry point
validates the file before it replaces the old one, so a file this cannot edit safely is refused
with a line saying to edit it by hand.
"""

from __future__ import annotations

import re
from pathlib import Path

from services.capture.source.introspect import table_entry
from spark_jobs.model.config import PipelineConfig, PipelineConfigError, TableConfig, load
from spark_jobs.model.files import replace_text

_TABLES = re.compile(r"^tables:[ \t]*(#.*)?$", re.MULTILINE)
# The first line after `tables:` that is neither indented, blank nor a comment ends the section.
_SECTION_END = re.compile(r"^(?![ \t]|#|$)", re.MULTILINE)


def _section(text: str, path: Path) -> tuple[int, int]:
    """(start, end) offsets of the `tables:` section's body."""
    found = _TABLES.search(text)
    if found is None:
        raise PipelineConfigError(f"{path}: no top-level `tables:` line to edit; edit the file by hand")
    start = text.index("\n", found.end()) + 1 if "\n" in text[found.end():] else len(text)
    after = _SECTION_END.search(text, start)
    end = after.start() if after else len(text)
    # Blank lines and comments in column 0 just before the next section belong to that section.
    lines = text[start:end].splitlines(keepends=True)
    while lines and (not lines[-1].strip() or lines[-1].startswith("#")):
        end -= len(lines.pop())
    return start, end


def with_table(text: str, name: str, config: TableConfig, path: Path) -> str:
    """`text` with the entry appended at the end of `tables:` (block style only)."""
    start, end = _section(text, path)
    body = text[start:end]
    if body.strip() and not body.startswith("  "):
        raise PipelineConfigError(f"{path}: `tables:` is not written two spaces deep; add the table by hand")
    if body and not body.endswith("\n"):
        body += "\n"
    # `tide init`'s note that the table was left out is no longer true.
    rest = re.sub(rf"^# not captured: {re.escape(name)}: .*\n", "", text[end:], flags=re.MULTILINE)
    return text[:start] + body + table_entry(name, config) + rest


def without_table(text: str, name: str, path: Path) -> str:
    """`text` without the table's entry: its line and every more deeply indented line after it."""
    start, end = _section(text, path)
    entry = re.compile(rf"^  {re.escape(name)}:[^\n]*\n(?:(?:[ \t]{{3,}}[^\n]*|[ \t]*)\n)*", re.MULTILINE)
    found = entry.search(text, start, end)
    if found is None:
        raise PipelineConfigError(f"{path}: no entry `  {name}:` under `tables:`; edit the file by hand")
    return text[:found.start()] + text[found.end():]


def validated(path: Path, text: str) -> PipelineConfig:
    """`text` as the pipeline it describes, validated as `load` validates `path`; the file is not touched."""
    temporary = path.with_name(f".{path.name}.tide-check")
    temporary.write_text(text)
    try:
        return load(temporary)
    except PipelineConfigError as exc:
        raise PipelineConfigError(str(exc).replace(str(temporary), str(path))) from None
    finally:
        temporary.unlink(missing_ok=True)


def write(path: Path, text: str) -> None:
    """Replace the file's text (write, then rename: a reader never sees half a file)."""
    replace_text(path, text)
