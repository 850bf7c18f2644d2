# The one Tideline image. Every service in docker-compose.yml runs from it with `tide serve SERVICE`,
# the same code, jars and Debian packages as the local process stack (docs/stack.md): PostgreSQL
# and Redis from Debian, Kafka, Connect + Debezium and Elasticsearch from the jars `tide stack fetch`
# resolved from Maven Central, the Spark jobs, the query API and the `tide` one-shots.
#
# Built FROM the Debian base docker/base-image.sh makes with debootstrap. Nothing is resolved here
# that the host has resolved already: the jars come from .tideline/lib and the Python wheels from
# .tideline/wheels (both made by `make images`, docs/docker.md). Versions arrive as build args from
# docker-compose.yml, which tests/unit/test_compose.py checks against the pin file; they have no
# defaults, so a build without them fails instead of drifting. Layers go from the least to the most
# often changed: Debian packages, the locked Python environment, the jars, the project's source.

# --- Debian's packages, the ones `make setup` installs for the local stack (JRE instead of JDK: no Maven here)
FROM tideline-debian:bookworm AS debian-packages
ARG POSTGRESQL_VERSION
ARG REDIS_VERSION
# No default cluster: `tide serve postgres` runs initdb on its own volume.
RUN mkdir -p /etc/postgresql-common/createcluster.d \
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/tideline.conf \
 && apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-venv openjdk-17-jre-headless \
      "postgresql-${POSTGRESQL_VERSION:?}" redis-server \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
# Debian's Redis must be the pinned one (the suite fixes it; this says so if the suite changes).
RUN redis-server --version | grep -q " v=${REDIS_VERSION:?}\." \
 || { echo "redis-server is not ${REDIS_VERSION}: $(redis-server --version)" >&2; exit 1; }

# --- the locked Python environment, installed from the host's wheelhouse (no index is asked)
FROM debian-packages AS python-environment
ARG SPARK_VERSION
ARG DELTA_VERSION
COPY requirements.lock /tmp/requirements.lock
COPY .tideline/wheels /tmp/wheels
RUN python3 -m venv /opt/tideline/venv \
 && /opt/tideline/venv/bin/pip install -q --no-index --find-links /tmp/wheels -r /tmp/requirements.lock
# The wheels must match the jars' versions (the check tests/unit/test_versions.py makes locally).
RUN /opt/tideline/venv/bin/python -c "import sys, importlib.metadata as m; \
v = {n: m.version(n) for n in ('pyspark', 'delta-spark')}; \
sys.exit(0 if v == {'pyspark': '${SPARK_VERSION:?}', 'delta-spark': '${DELTA_VERSION:?}'} else f'pin mismatch: {v}')"

# --- the runtime: only the environment is taken from the stage above, not the wheelhouse
FROM debian-packages
# Every service runs as this user; its state folders exist in the image so that a fresh named
# volume mounted on one takes the owner.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin tideline \
 && for folder in postgres redis kafka kafka-2 kafka-3 elasticsearch checkpoints warehouse jobs; do \
      mkdir -p "/var/lib/tideline/$folder"; done \
 && chown -R tideline:tideline /var/lib/tideline
COPY --from=python-environment /opt/tideline/venv /opt/tideline/venv
COPY .tideline/lib /opt/tideline/lib
WORKDIR /opt/tideline
COPY pyproject.toml pipeline.yaml ./
COPY connectors ./connectors
COPY migrations ./migrations
COPY services ./services
COPY spark_jobs ./spark_jobs
COPY docker/healthy.sh ./docker/healthy.sh
# The source tree is on the environment's path, as `make setup`'s editable install puts it: the code
# finds the pin file, connectors/ and pipeline.yaml beside itself (services/versions.py PROJECT_ROOT).
# `tide` is the console script pip would write for [project.scripts].
RUN echo /opt/tideline > /opt/tideline/venv/lib/python3.11/site-packages/tideline.pth \
 && printf '#!/opt/tideline/venv/bin/python\nfrom services.cli import app\napp()\n' > /opt/tideline/venv/bin/tide \
 && chmod 0755 /opt/tideline/venv/bin/tide
ENV PATH=/opt/tideline/venv/bin:$PATH \
    TIDE_LIB_DIR=/opt/tideline/lib \
    TIDE_STATE_DIR=/var/lib/tideline
# The copied jars must be the ones resolved for these pins: with every bundle's marker current this
# does nothing, and otherwise it fails, as there is no Maven here (run `make images` again). No Spark class
# archive in the image: it would add about 200 MB and a minute of build for ~6 s off each driver start.
RUN tide stack fetch --no-class-archive
USER tideline
CMD ["tide", "--help"]
