"""The faults: each acts on the real processes of the stack (found by their pid files, started
again by the stack's own runner) and returns one line saying what it did.

- kill -9 + restart (connect, driver, kafka, redis, elasticsearch): SIGKILL to the service's whole
  process group (the driver's Spark JVM with it), wait until it is gone, start it, wait healthy;
- pause: SIGSTOP to one service's process group for a few seconds, then SIGCONT;
- postgres: an immediate restart (SIGQUIT to the postmaster: no checkpoint, crash recovery on start);
- walsender: pg_terminate_backend of the backend streaming the chaos slot to Debezium;
- stale_redelivery: produce again, into the change topics, the first change of some rows that have
  changed since (what a retried or mirrored produce can do): older than what the sinks hold;

The cluster profile's faults (a Spark worker, a Kafka broker) are in cluster_faults.py.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
from kafka import KafkaConsumer, KafkaProducer

from services.chaos import observe
from services.jobs import driver, lag
from services.settings import StackSettings
from services.stack import elasticsearch, kafka, postgres, process, redis, runner
from services.stack.service import Service, StackError
from spark_jobs.model.config import PipelineConfig


class ChaosError(StackError):
    """The chaos run cannot go on (a service did not come back, nothing to act on)."""


@dataclass
class Target:
    """What the faults act on: the stack, the chaos run's own driver and pipeline, and what the
    faults leave behind for the observations (records the runner produced, killed batches)."""

    stack: StackSettings
    jobs: StackSettings
    pipeline: PipelineConfig
    replays: observe.ReplayWatch
    injected: set[observe.Position] = field(default_factory=set)

    def service(self, name: str) -> tuple[StackSettings, Service]:
        services = {
            "postgres": postgres.SERVICE, "redis": redis.SERVICE, "kafka": kafka.BROKER,
            "connect": kafka.CONNECT, "elasticsearch": elasticsearch.SERVICE,
        }  # fmt: skip
        if name == "driver":
            return self.jobs, driver.SERVICE
        return self.stack, services[name]

    def running(self, name: str) -> process.Started:
        settings, service = self.service(name)
        started = process.running(runner.pid_file(settings, service))
        if started is None:
            raise ChaosError(f"{name} is not running before the fault: see {runner.log_file(settings, service)}")
        return started


def wait_gone(started: process.Started, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while process.is_running(started):
        if time.monotonic() > deadline:
            raise ChaosError(f"{what} (pid {started.pid}) still runs {timeout_s:.0f}s after the signal")
        time.sleep(0.2)  # poll: the kernel tears the process down asynchronously


def _restart(target: Target, name: str) -> None:
    settings, service = target.service(name)
    runner.start_and_wait(settings, [service])


def kill_and_restart(target: Target, name: str, rnd: random.Random) -> str:
    if name == "driver":
        _wait_for_a_batch(target)
    if name == "connect":
        _wait_for_streaming(target)
    started = target.running(name)
    checkpoints = target.jobs.state_dir / "checkpoints"
    in_flight = observe.in_flight(checkpoints) if name == "driver" else []
    # Real-Time Mode writes an epoch's offsets only when it commits it: its epoch in flight shows as
    # what its writers applied past the last commit, which the restarted driver applies again.
    past_epoch = observe.applied_past_epoch(target.jobs, checkpoints, driver.job_settings(target.jobs).realtime_sinks
                                            ) if name == "driver" else {}
    killed_at = time.time()
    os.killpg(started.pid, signal.SIGKILL)
    wait_gone(started, name)
    if in_flight:
        target.replays.killed(in_flight, killed_at)
    began = time.monotonic()
    _restart(target, name)
    batches = ", ".join(f"{b.sink} {b.batch}" for b in in_flight)
    epochs = ", ".join(f"{sink} {records}" for sink, records in past_epoch.items())
    return f"kill -9 pid {started.pid}, healthy again in {time.monotonic() - began:.0f}s" + (
        f"; batches in flight: {batches or 'none'}" if name == "driver" else ""
    ) + (f"; real-time records applied past the last epoch (at least): {epochs}" if past_epoch else "")


def _wait_for_a_batch(target: Target, timeout_s: float = 30.0) -> None:
    """Let the kill land while a micro-batch runs (nearly always; a quiet moment is waited out)."""
    deadline = time.monotonic() + timeout_s
    while not observe.in_flight(target.jobs.state_dir / "checkpoints") and time.monotonic() < deadline:
        time.sleep(0.2)  # poll: the driver plans its next batch within a trigger interval


def _wait_for_streaming(target: Target, timeout_s: float = 60.0) -> None:
    """Let the kill land while Debezium streams: records went out in the last second, so some are newer
    than its last offset flush (every 10 s) and go out again after the restart, a duplicate delivery.
    Killed while it waited out a retry (after a walsender or Kafka fault), it would resend nothing."""
    topics = [target.pipeline.topic(table) for table in target.pipeline.tables]
    consumer = KafkaConsumer(bootstrap_servers=target.stack.kafka_bootstrap)
    deadline = time.monotonic() + timeout_s
    try:
        before = _records(target, topics, consumer)
        while time.monotonic() < deadline:
            time.sleep(1.0)  # poll: one second of streaming
            now = _records(target, topics, consumer)
            if now > before:
                return
            before = now
    finally:
        consumer.close()


def _records(target: Target, topics: list[str], consumer: KafkaConsumer) -> int:
    return sum(sum(parts.values()) for parts in lag.end_offsets(target.stack, topics, consumer=consumer).values())


PAUSABLE = ("connect", "driver", "kafka", "redis", "elasticsearch", "postgres")


def pause(target: Target, rnd: random.Random, seconds: tuple[float, float]) -> str:
    name = rnd.choice(PAUSABLE)
    length = round(rnd.uniform(*seconds), 1)
    started = target.running(name)
    os.killpg(started.pid, signal.SIGSTOP)
    try:
        time.sleep(length)  # the pause itself
    finally:
        os.killpg(started.pid, signal.SIGCONT)
    return f"SIGSTOP {name} (pid {started.pid}) for {length}s, then SIGCONT"


def restart_postgres(target: Target) -> str:
    started = target.running("postgres")
    os.kill(started.pid, signal.SIGQUIT)  # the postmaster's "immediate" shutdown
    wait_gone(started, "postgres")
    began = time.monotonic()
    _restart(target, "postgres")
    return f"immediate shutdown (SIGQUIT pid {started.pid}), healthy again in {time.monotonic() - began:.0f}s"


def kill_walsender(target: Target, timeout_s: float = 60.0) -> str:
    slot = target.pipeline.source.slot
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(postgres.conninfo(target.stack), autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT active_pid, pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL", (slot,)
            ).fetchone()
            if row is not None:
                return f"terminated walsender pid {row[0]} of slot {slot}"
            if time.monotonic() > deadline:
                raise ChaosError(f"no walsender streamed slot {slot} for {timeout_s:.0f}s: is the connector running?")
            time.sleep(0.5)  # poll: Debezium reconnects after an earlier fault


def stale_redelivery(target: Target, rnd: random.Random, how_many: int) -> str:
    """Send again the first change of `how_many` rows that changed since, after the newer ones."""
    tables = [table for table in target.pipeline.tables if not table.startswith("chaos_")]
    records = [r for table in tables for r in observe.read_to_end(target.stack, target.pipeline.topic(table))]
    stale = observe.stale_records(records, how_many, rnd)
    producer = KafkaProducer(bootstrap_servers=target.stack.kafka_bootstrap)
    try:
        for record in stale:
            sent = producer.send(record.topic, key=record.key, value=record.value, partition=record.partition)
            target.injected.add((record.topic, record.partition, sent.get(timeout=30).offset))
    finally:
        producer.close()
    topics = ", ".join(sorted({r.topic for r in stale}))
    return f"sent again the first change of {len(stale)} rows changed since ({topics})"


def injector(
    fault: str, profile_pause_s: tuple[float, float], stale_keys: int
) -> Callable[[Target, random.Random], str]:
    """The function that injects `fault`, one of the local stack's (cluster_faults.py has the cluster profile's)."""
    if fault in ("connect", "driver", "kafka", "redis", "elasticsearch"):
        return lambda target, rnd: kill_and_restart(target, fault, rnd)
    return {
        "pause": lambda target, rnd: pause(target, rnd, profile_pause_s),
        "postgres": lambda target, rnd: restart_postgres(target),
        "walsender": lambda target, rnd: kill_walsender(target),
        "stale_redelivery": lambda target, rnd: stale_redelivery(target, rnd, stale_keys),
    }[fault]
