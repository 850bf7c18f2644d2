#!/bin/sh
# A Docker engine for the compose route where no init system runs one (a fresh CI machine of the
# kind Tideline is tested on has Debian's docker.io installed but no dockerd running).
#
#   docker/engine.sh start    start dockerd when no engine answers; wait until it answers
#   docker/engine.sh stop     stop the engine, but only one this script started
#   docker/engine.sh status   say whether an engine answers, and whether this script started it
#
# `start` needs root (dockerd does). The engine runs with --iptables=false because machines of this
# kind allow no iptables rules: containers then get no NAT to the internet, which they do not need
# at run time (image builds use the host's network), and ports published on 127.0.0.1 are served
# by Docker's userland proxy. An engine that already answers is used as it is and never stopped.
# What this script started is recorded in .tideline/docker/ (the pid file and dockerd's log).
set -eu

state_dir="$(cd "$(dirname "$0")/.." && pwd)/.tideline/docker"
pid_file="$state_dir/dockerd.pid"
log_file="$state_dir/dockerd.log"
start_timeout_s=60

answers() { docker info > /dev/null 2>&1; }

# The pid of the dockerd this script started, if it still runs (a recycled pid would not be dockerd).
started_pid() {
    [ -s "$pid_file" ] || return 1
    pid=$(cat "$pid_file")
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] && echo "$pid"
}

start() {
    if answers; then
        echo "engine: a Docker engine already answers; using it"
        return 0
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "engine: no Docker engine answers, and starting one needs root (sudo $0 start)" >&2
        return 1
    fi
    command -v dockerd > /dev/null || { echo "engine: dockerd not found: install Debian's docker.io (make setup)" >&2; return 1; }
    mkdir -p "$state_dir"
    # Its own session, so it outlives this script and a Ctrl-C in the terminal does not reach it.
    setsid dockerd --iptables=false > "$log_file" 2>&1 < /dev/null &
    echo $! > "$pid_file"
    waited=0
    until answers; do
        if ! started_pid > /dev/null; then
            echo "engine: dockerd exited during start-up; its log: $log_file" >&2
            tail -n 5 "$log_file" >&2
            rm -f "$pid_file"
            return 1
        fi
        if [ "$waited" -ge $((start_timeout_s * 2)) ]; then
            echo "engine: dockerd did not answer within ${start_timeout_s}s; its log: $log_file" >&2
            return 1
        fi
        sleep 0.5  # poll: dockerd answers once its API socket is up
        waited=$((waited + 1))
    done
    echo "engine: started dockerd (pid $(cat "$pid_file"), log $log_file)"
}

stop() {
    if ! pid=$(started_pid); then
        rm -f "$pid_file"
        echo "engine: no engine started by this script is running; nothing stopped"
        return 0
    fi
    kill -TERM "$pid"
    # dockerd stops its containers before it exits (Docker's default grace of 10 s each, in parallel).
    waited=0
    while [ -d "/proc/$pid" ] && [ "$waited" -lt 240 ]; do
        sleep 0.5  # poll: waiting for dockerd to exit
        waited=$((waited + 1))
    done
    if [ -d "/proc/$pid" ]; then
        echo "engine: dockerd (pid $pid) did not stop within 120 s; its log: $log_file" >&2
        return 1
    fi
    rm -f "$pid_file"
    echo "engine: stopped dockerd (pid $pid)"
}

status() {
    if answers; then state="answers"; else state="does not answer"; fi
    if pid=$(started_pid); then
        echo "engine: $state; started by this script (pid $pid)"
    else
        echo "engine: $state; not started by this script"
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
