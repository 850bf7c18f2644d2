"""The version rule for Delta Lake, written once: SQL condition text for MERGE, DELETE and filters.

A version is a pair (major, minor) compared lexicographically (docs/apply.md, "The version"). Every
condition the warehouse and analytics tables need is built here, as text: the MERGE guards, the
unchanged-TOAST keep rule, the tombstone and truncate-watermark checks. Other modules never spell
the comparison themselves; tests/unit/test_delta_version.py checks the generated text, as PeerDB's
merge_stmt_generator_test does. No pyspark here: the text is used with `F.expr` or Delta's MERGE API.

SQL's three-valued logic matters: a comparison with a NULL version is NULL, which a MERGE clause or
a filter takes as false. `newer_or_absent` is the form for "beats what is held, if anything is".
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.sinks.base import VERSION_MAJOR, VERSION_MINOR


def quote(name: str) -> str:
    """A column or alias name as a SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def text(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class Version:
    """The SQL expressions of one version's two parts."""

    major: str
    minor: str

    @classmethod
    def of(cls, alias: str | None = None, major: str = VERSION_MAJOR, minor: str = VERSION_MINOR) -> Version:
        """The version held in columns `major`/`minor` (the row tables' metadata columns by default) of
        `alias` (a MERGE's `s` or `t`), or unqualified."""
        prefix = f"{alias}." if alias else ""
        return cls(f"{prefix}{quote(major)}", f"{prefix}{quote(minor)}")

    @classmethod
    def field(cls, struct: str) -> Version:
        """The version in a struct<major, minor> expression (CHANGE.version, a `_keep` entry)."""
        return cls(f"{struct}.major", f"{struct}.minor")

    @classmethod
    def literal(cls, version: tuple[int, int]) -> Version:
        major, minor = version
        return cls(f"{int(major)}L", f"{int(minor)}L")


def newer(a: Version, b: Version) -> str:
    """`a` is above `b`: the guard every write passes (an equal version is a replay)."""
    return f"({a.major} > {b.major} OR ({a.major} = {b.major} AND {a.minor} > {b.minor}))"


def not_newer(a: Version, b: Version) -> str:
    """`a` is at or below `b` (what a truncate at `b` removes)."""
    return f"NOT {newer(a, b)}"


def newer_or_absent(a: Version, b: Version) -> str:
    """`a` is above `b`, or there is no `b` (no tombstone, no watermark)."""
    return f"({b.major} IS NULL OR {newer(a, b)})"


def keep_stored(needed: Version, stored: Version) -> str:
    """The fill-version rule: the stored value of a column stays when the stored row is at least the
    version the change's value needs (`needed`: (0, 0) for an unchanged-TOAST column, the fill version
    for a column filled from an older change). NULL, so false, when the change names no such version."""
    return f"NOT {newer(needed, stored)}"


def max_of(versions: str) -> str:
    """The highest of a group's versions as struct<major, minor>; `versions` is a struct expression
    with fields major and minor (struct comparison is lexicographic in field order)."""
    return f"max({versions})"


__all__ = ["Version", "keep_stored", "max_of", "newer", "newer_or_absent", "not_newer", "quote", "text"]
