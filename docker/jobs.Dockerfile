# The Tideline image: the Python package (the `tide` CLI and the Spark apply jobs), PySpark and
# the Kafka-source and Delta Lake jars, resolved ahead of time so a Spark session starts offline.
# docker-compose.yml uses it for the one-shot `migrate` and `register-connector` services and for
# the long-running `jobs` service. Versions arrive as build args from docker-compose.yml, which
# tests/unit/test_compose.py checks against [tool.tideline.versions] in pyproject.toml; they have
# no defaults here, so a missing one fails the build instead of drifting.

# --- the Spark jars: the same pom and the same -D properties as `tide stack fetch` (services/stack/jars.py)
FROM maven:3.9-eclipse-temurin-17 AS spark-jars
ARG SPARK_VERSION
ARG SCALA_BINARY_VERSION
ARG DELTA_VERSION
COPY spark_jobs/jars/pom.xml /src/pom.xml
RUN test -n "$SPARK_VERSION" && test -n "$SCALA_BINARY_VERSION" && test -n "$DELTA_VERSION" \
 && mvn -B -q -f /src/pom.xml dependency:copy-dependencies -DoutputDirectory=/jars \
      -Dspark.version="$SPARK_VERSION" -Dscala.binary.version="$SCALA_BINARY_VERSION" \
      -Ddelta.version="$DELTA_VERSION"

# --- the runtime: Python 3.11 (requires-python) and Debian's Java 17 (PySpark 4 needs 17+)
FROM python:3.11-slim-bookworm
ARG SPARK_VERSION
ARG DELTA_VERSION
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/tideline
# The whole locked tree first (a layer that changes only with requirements.lock), then the package.
COPY requirements.lock ./
RUN pip install --no-cache-dir -r requirements.lock
# The wheel versions must equal the jars' versions (same check as tests/unit/test_versions.py).
RUN python -c "import sys, importlib.metadata as m; \
v = {n: m.version(n) for n in ('pyspark', 'delta-spark')}; \
sys.exit(0 if v == {'pyspark': '$SPARK_VERSION', 'delta-spark': '$DELTA_VERSION'} else f'pin mismatch: {v}')"

COPY pyproject.toml README.md pipeline.yaml ./
COPY connectors ./connectors
COPY migrations ./migrations
COPY services ./services
COPY spark_jobs ./spark_jobs
# Editable (as `make python` does): the code finds the pin file, connectors/tideline-postgres.json
# and pipeline.yaml next to the source tree (services/versions.py PROJECT_ROOT); a plain
# `pip install .` would put the modules in site-packages, away from those files.
RUN pip install --no-cache-dir --no-deps -e .

COPY --from=spark-jars /jars /opt/tideline/lib/spark

# Run as a plain user; the state folders exist in the image so fresh named volumes inherit the owner.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin tideline \
 && mkdir -p /var/lib/tideline/checkpoints /var/lib/tideline/warehouse /var/lib/tideline/jobs \
 && chown -R tideline:tideline /var/lib/tideline
USER tideline
CMD ["python", "-m", "spark_jobs"]
