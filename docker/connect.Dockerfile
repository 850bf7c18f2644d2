# Kafka Connect with the Debezium PostgreSQL plugin, built from the official apache/kafka image.
# Debezium's own Connect image is not published on Docker Hub for 3.x, and this way the plugin
# folder is exactly the one the local stack uses: services/connect/pom.xml resolved by Maven with
# the pinned versions (Debezium's jars plus Tideline's KeyTruncateEvents transform), and the
# worker runs from services/connect/connect-distributed.properties.
# Versions arrive as build args from docker-compose.yml (checked against the pin file by
# tests/unit/test_compose.py); they have no defaults, so a missing one fails the build.
ARG KAFKA_VERSION

# --- the plugin folder: the same goals and -D properties as `tide stack fetch` (services/stack/jars.py)
FROM maven:3.9-eclipse-temurin-17 AS plugin
ARG KAFKA_VERSION
ARG DEBEZIUM_VERSION
COPY services/connect /src/connect
RUN test -n "$KAFKA_VERSION" && test -n "$DEBEZIUM_VERSION" \
 && mvn -B -q -f /src/connect/pom.xml package dependency:copy-dependencies \
      -DoutputDirectory=/plugins/debezium-connector-postgres -Dtideline.build.dir=/tmp/build \
      -Dkafka.version="$KAFKA_VERSION" -Ddebezium.version="$DEBEZIUM_VERSION"

# --- the worker: Kafka's own distribution, same version as the broker
FROM apache/kafka:${KAFKA_VERSION}
USER root
# curl for the health check (the base image removes its wget after installing Kafka).
RUN apk add --no-cache curl
COPY --from=plugin --chown=appuser:appuser /plugins /opt/tideline/connect-plugins
COPY --chown=appuser:appuser services/connect/connect-distributed.properties /opt/tideline/connect-distributed.properties.template
COPY --chown=appuser:appuser docker/connect-entrypoint.sh /opt/tideline/connect-entrypoint.sh
RUN chmod 0755 /opt/tideline/connect-entrypoint.sh
USER appuser
ENTRYPOINT ["/opt/tideline/connect-entrypoint.sh"]
