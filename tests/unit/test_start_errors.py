"""The one-line errors users meet when the machine lacks something: named problem, named fix."""

from __future__ import annotations

import pytest

from services.settings import StackSettings
from services.stack import jvm, runner
from services.stack.jars import JarBundle, resolve
from services.stack.service import Service, StackError, Unhealthy

MISSING_ARTIFACT_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.tideline</groupId><artifactId>missing-probe</artifactId><version>0.1.0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>dev.tideline.nonexistent</groupId><artifactId>nothing-here</artifactId>
    <version>0.0.1</version></dependency>
  </dependencies>
</project>
"""


def test_missing_java_names_the_package_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no java on it
    jvm.java.cache_clear()
    try:
        with pytest.raises(StackError, match=r"Java 17\+ not found: install openjdk-17-jdk-headless"):
            jvm.java()
    finally:
        jvm.java.cache_clear()


def test_a_failed_download_names_the_bundle_the_log_and_the_retry(tmp_path):
    pom = tmp_path / "pom.xml"
    pom.write_text(MISSING_ARTIFACT_POM)
    settings = StackSettings(state_dir=tmp_path / "state", lib_dir=tmp_path / "lib")
    with pytest.raises(StackError, match=r"Maven could not resolve the missing jars .* see .*maven-missing\.log"):
        resolve(settings, JarBundle("missing", pom, "missing"))
    assert (tmp_path / "state" / "logs" / "maven-missing.log").read_text().strip()


def test_a_start_up_time_out_says_why_the_service_is_not_healthy(tmp_path):
    def probe(settings: StackSettings) -> str:
        raise Unhealthy("queries not running: cache: run `tide rebuild cache`")

    never_ready = Service(name="never-ready", port_fields=(), command=lambda s: ["sleep", "30"], probe=probe)
    settings = StackSettings(state_dir=tmp_path / "state", startup_timeout_s=1)
    try:
        with pytest.raises(StackError, match=r"not healthy after 1s: never-ready: queries not running: cache: "
                                             r"run `tide rebuild cache` \(log: .*never-ready\.log\)"):
            runner.start_and_wait(settings, [never_ready])
    finally:
        runner.stop(settings, [never_ready])
