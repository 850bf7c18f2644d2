"""The pin file is the one place versions live; everything else must agree with it."""

import tomllib

from services.versions import PIN_FILE, pinned


def _python_pins() -> dict[str, str]:
    deps = tomllib.loads(PIN_FILE.read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        name, version = dep.split("==")
        pins[name.split("[")[0]] = version
    return pins


def test_every_python_dependency_is_pinned_exactly():
    deps = tomllib.loads(PIN_FILE.read_text())["project"]["dependencies"]
    assert all("==" in dep for dep in deps), deps


def test_pyspark_matches_the_pinned_spark():
    assert _python_pins()["pyspark"] == pinned().spark


def test_delta_spark_matches_the_pinned_delta():
    assert _python_pins()["delta-spark"] == pinned().delta


def test_elasticsearch_client_major_matches_the_server():
    assert _python_pins()["elasticsearch"].split(".")[0] == pinned().elasticsearch.split(".")[0]


def test_lock_file_agrees_with_the_direct_pins():
    lock = (PIN_FILE.parent / "requirements.lock").read_text().lower().splitlines()
    for name, version in _python_pins().items():
        assert f"{name.lower()}=={version}" in lock, f"{name}=={version} missing from requirements.lock"


def test_the_classes_the_session_names_by_string_are_in_the_installed_spark():
    """Class names set as strings are not checked until a query runs (Spark 4.2 moved the checkpoint
    file manager into another package, and every streaming query failed)."""
    import zipfile
    from pathlib import Path

    import pyspark

    from spark_jobs.runtime import session

    (jar,) = (Path(pyspark.__file__).parent / "jars").glob("spark-sql_*.jar")
    with zipfile.ZipFile(jar) as archive:
        assert session._CHECKPOINT_FILES.replace(".", "/") + ".class" in archive.namelist()
