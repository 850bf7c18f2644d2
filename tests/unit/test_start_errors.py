"""The one-line errors users meet when the machine lacks something: named problem, named fix."""

from __future__ import annotations

import pytest

from services.settings import StackSettings
from services.stack import jvm
from services.stack.jars import JarBundle, resolve
from services.stack.service import StackError

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
