"""Resolve the JVM jars each component needs with Maven, once, into the state folder.

Each bundle is a small pom in the repo; versions come from the pin file and are
passed as -D properties, so the poms never disagree with pyproject.toml.
Maven's own cache (~/.m2) makes a second resolution offline and fast; a marker
file per bundle makes `tide stack up` skip Maven entirely when nothing changed.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.settings import StackSettings
from services.stack.service import StackError
from services.versions import PROJECT_ROOT, Versions, pinned
from spark_jobs.runtime import class_archive


@dataclass(frozen=True)
class JarBundle:
    name: str
    pom: Path
    # Where the jars land, relative to the state folder's lib/ directory.
    target: str
    # Maven goals; a bundle with Java sources of its own is packaged first.
    goals: tuple[str, ...] = ("dependency:copy-dependencies",)

    def properties(self, versions: Versions) -> dict[str, str]:
        return {
            "kafka.version": versions.kafka,
            "debezium.version": versions.debezium,
            "es.version": versions.elasticsearch,
            "spark.version": versions.spark,
            "spark.minor.version": ".".join(versions.spark.split(".")[:2]),
            "scala.binary.version": versions.scala_binary,
            "delta.version": versions.delta,
        }


BUNDLES: dict[str, JarBundle] = {
    bundle.name: bundle
    for bundle in (
        JarBundle("kafka", PROJECT_ROOT / "services/stack/assets/kafka/pom.xml", "kafka"),
        JarBundle(
            "debezium",
            PROJECT_ROOT / "services/capture/connect/pom.xml",
            "connect-plugins/debezium-connector-postgres",
            goals=("package", "dependency:copy-dependencies"),
        ),
        JarBundle(
            "elasticsearch",
            PROJECT_ROOT / "services/stack/assets/elasticsearch/pom.xml",
            "elasticsearch",
            goals=("package", "dependency:copy-dependencies"),
        ),
        # The Kafka source, Delta and the jobs' own JVM writers (spark_jobs/jars/src), one folder.
        JarBundle(
            "spark",
            PROJECT_ROOT / "spark_jobs/jars/pom.xml",
            "spark",
            goals=("package", "dependency:copy-dependencies"),
        ),
    )
}


def bundle_dir(settings: StackSettings, name: str) -> Path:
    return settings.lib_dir / BUNDLES[name].target


def build_dir(settings: StackSettings, name: str) -> Path:
    """Where a bundle with code of its own (the Elasticsearch launcher, the Spark writers) is built."""
    return settings.lib_dir / "build" / name


def classpath(settings: StackSettings, name: str) -> str:
    return str(bundle_dir(settings, name) / "*")


def ensure(settings: StackSettings, name: str) -> Path:
    """Resolve one bundle unless the same versions were resolved before. Returns its folder."""
    return resolve(settings, BUNDLES[name])


def resolve(settings: StackSettings, bundle: JarBundle) -> Path:
    name = bundle.name
    target = settings.lib_dir / bundle.target
    props = bundle.properties(pinned())
    # The pom's content, not its modification time: a copy of the folder (the Docker image's, whose
    # copy keeps whole seconds only) stays current, and a checkout that only touches the pom resolves nothing.
    pom = hashlib.sha256(bundle.pom.read_bytes()).hexdigest()[:16]
    stamp = " ".join(f"{k}={v}" for k, v in sorted(props.items())) + f" pom={pom}"
    sources = bundle.pom.parent / "src" / "main"
    if sources.is_dir():  # a bundle with code of its own is built again when its code changes
        stamp += f" src={tree_digest(sources)}"
    marker = target / ".resolved"
    if marker.is_file() and marker.read_text() == stamp:
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError("Maven (mvn) not found: install it with `apt-get install maven` (or run `make setup`)")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    # Built from scratch: a class whose source was removed must not stay in the jar.
    shutil.rmtree(build_dir(settings, name), ignore_errors=True)
    log = settings.logs_dir / f"maven-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [mvn, "-B", "-q", "-f", str(bundle.pom), *bundle.goals, f"-DoutputDirectory={target}"]
    argv += [f"-D{key}={value}" for key, value in props.items()]
    argv.append(f"-Dtideline.build.dir={build_dir(settings, name)}")
    # A bundle's unit tests run from the test suite (tests/unit/test_jvm_writers.py), not at every fetch;
    # they are still compiled, so the fetch resolves what `mvn -o test` needs.
    argv.append("-DskipTests")
    with open(log, "wb") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=bundle.pom.parent)
    if result.returncode != 0:
        raise StackError(
            f"Maven could not resolve the {name} jars (exit {result.returncode}); see {log} "
            "- check that the Maven repository is reachable, then run `tide stack fetch` again"
        )
    marker.write_text(stamp)
    return target


def tree_digest(root: Path) -> str:
    """The files under `root`, names and content (not times), as one short hash."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def write_class_archive(settings: StackSettings, say: Callable[[str], None]) -> Path:
    """The Spark driver's class archive for the resolved Spark jars (spark_jobs/runtime/class_archive.py)."""
    try:
        return class_archive.make(bundle_dir(settings, "spark"), settings.logs_dir / "class-archive.log", say=say)
    except RuntimeError as exc:
        raise StackError(f"{exc} - drivers start without it, only slower; run `tide stack fetch` again") from None


def ensure_all(settings: StackSettings) -> None:
    for name in BUNDLES:
        ensure(settings, name)
