"""The Spark driver's class archive (spark_jobs/runtime/class_archive.py): the options that read or write
it, and that a session built the default way maps the archive `make setup` wrote."""

from __future__ import annotations

from pathlib import Path

from spark_jobs.runtime import class_archive


def test_no_archive_means_no_option(tmp_path: Path) -> None:
    assert class_archive.reading(tmp_path) == []


def test_an_archive_is_mapped_by_path(tmp_path: Path) -> None:
    class_archive.archive_of(tmp_path).write_bytes(b"archive")
    options = class_archive.reading(tmp_path)
    assert f"-XX:SharedArchiveFile={tmp_path / class_archive.ARCHIVE}" in options
    assert not any(option.startswith("-XX:ArchiveClassesAtExit") for option in options)


def test_writing_names_the_archive_to_write(tmp_path: Path) -> None:
    target = tmp_path / "out.jsa"
    assert f"-XX:ArchiveClassesAtExit={target}" in class_archive.writing(target)


def test_make_keeps_an_archive_that_is_there(tmp_path: Path) -> None:
    archive = class_archive.archive_of(tmp_path)
    archive.write_bytes(b"made before")
    said: list[str] = []
    assert class_archive.make(tmp_path, tmp_path / "log", say=said.append) == archive
    assert archive.read_bytes() == b"made before" and said == []


def test_the_session_jvm_maps_the_archive_setup_wrote(spark) -> None:
    """`make setup` (tide stack fetch) wrote the archive beside the Spark jars, and the JVM of a session
    built with the defaults has it mapped: the classes come from it, not from the jars."""
    from services.settings import StackSettings
    from services.stack import jars
    from tests.conftest import TEST_STACK

    archive = class_archive.archive_of(jars.bundle_dir(StackSettings(**TEST_STACK), "spark"))
    assert archive.is_file(), f"no {archive}: `tide stack fetch` (make setup) writes it"
    pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert str(archive.resolve()) in maps, f"the session's JVM (pid {pid}) did not map {archive}"
