#!/bin/sh
# A container's health check (docker-compose.yml): healthy while `tide serve SERVICE` has seen the
# service's own probe pass within the last 30 seconds. `tide serve` probes every 5 s and rewrites
# the file on each pass (services/stack/runner.py: serve), so the check starts no Python.
#   usage: healthy.sh SERVICE
set -eu
find "${TIDE_STATE_DIR:?}/run/${1:?usage: healthy.sh SERVICE}.healthy" -newermt '-30 seconds' 2>/dev/null | grep -q .
