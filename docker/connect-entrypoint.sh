#!/bin/sh
# Render the worker config from the template the local stack uses
# (services/connect/connect-distributed.properties), then run Kafka Connect in distributed mode.
# The template's placeholders are filled from the environment set in docker-compose.yml;
# an unfilled one stops the container (like services/stack/templates.py, which refuses them).
set -eu

: "${CONNECT_BOOTSTRAP_SERVERS:?set CONNECT_BOOTSTRAP_SERVERS (e.g. kafka:9092)}"
: "${CONNECT_GROUP_ID:=tideline-connect}"
: "${CONNECT_REST_PORT:=8083}"
: "${CONNECT_REST_ADVERTISED_HOST:?set CONNECT_REST_ADVERTISED_HOST (a name other containers resolve)}"

template=/opt/tideline/connect-distributed.properties.template
config=/opt/kafka/config/tideline-connect-distributed.properties

# Listen on every interface of the container; advertise a resolvable name.
sed -e "s|\${KAFKA_BOOTSTRAP_SERVERS}|${CONNECT_BOOTSTRAP_SERVERS}|g" \
    -e "s|\${CONNECT_GROUP_ID}|${CONNECT_GROUP_ID}|g" \
    -e "s|\${CONNECT_REST_HOST}|0.0.0.0|g" \
    -e "s|\${CONNECT_REST_PORT}|${CONNECT_REST_PORT}|g" \
    -e "s|\${CONNECT_PLUGIN_PATH}|/opt/tideline/connect-plugins|g" \
    "$template" > "$config"
if grep -n '\${[A-Z0-9_]*}' "$config" >&2; then
    echo "connect-entrypoint: placeholders above have no value" >&2
    exit 1
fi
# Later keys win in a Java properties file: advertise the name, not 0.0.0.0.
printf '\n# docker: advertised name (set by docker/connect-entrypoint.sh)\nrest.advertised.host.name=%s\n' \
    "$CONNECT_REST_ADVERTISED_HOST" >> "$config"

exec /opt/kafka/bin/connect-distributed.sh "$config"
