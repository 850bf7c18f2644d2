"""The JVM writers' unit tests (spark_jobs/jars/src/test: JUnit, no Spark, Redis or Kafka), run by Maven.

Offline: `tide stack fetch` (make setup) built the bundle with its tests compiled, so Maven already
holds every plugin and test library. Built into a temporary folder, never the source tree.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from services.stack.jars import BUNDLES
from services.versions import pinned


def test_the_jvm_writers_unit_tests_pass(tmp_path: Path) -> None:
    mvn = shutil.which("mvn")
    assert mvn, "Maven (mvn) not found: install it with `apt-get install maven` (or run `make setup`)"
    bundle = BUNDLES["spark"]
    argv = [mvn, "-B", "-q", "-o", "-f", str(bundle.pom), "test"]
    argv += [f"-D{key}={value}" for key, value in bundle.properties(pinned()).items()]
    argv.append(f"-Dtideline.build.dir={tmp_path / 'build'}")
    result = subprocess.run(argv, capture_output=True, text=True, cwd=bundle.pom.parent, timeout=300)
    reports = sorted((tmp_path / "build" / "surefire-reports").glob("*.txt"))
    summary = "\n".join(report.read_text() for report in reports)
    assert result.returncode == 0, (
        f"mvn test exited {result.returncode} (offline: run `tide stack fetch` first if a plugin is missing)\n"
        f"{result.stdout}\n{result.stderr}\n{summary}"
    )
    assert reports, f"Maven ran no test class\n{result.stdout}\n{result.stderr}"
