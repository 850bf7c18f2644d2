"""The cluster profile's faults (docs/cluster.md), on the real processes of its Spark workers and Kafka brokers:

- spark_worker: kill -9 one Spark worker with the executors it runs, wait until the master has started them
  again on the others, then start the worker again;
- kafka_broker: kill -9 one Kafka broker that leads partitions of the run's change topics, wait until
  every partition has a leader among the others, start it again and wait until it is back in sync.

Each refuses a run where it would prove nothing: executors that never ran on every worker, topics with one
replica, a broker that leads nothing.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable

from services.chaos.faults import ChaosError, Target, wait_gone
from services.settings import StackSettings
from services.stack import kafka, process, runner, spark
from services.stack.service import Service, Unhealthy


def _kill(stack: StackSettings, victim: Service) -> process.Started:
    """kill -9 the victim's process group (a worker takes the executors it started with it); once it is gone."""
    started = process.running(runner.pid_file(stack, victim))
    if started is None:
        raise ChaosError(f"{victim.name} is not running before the fault: see {runner.log_file(stack, victim)}")
    os.killpg(started.pid, signal.SIGKILL)
    wait_gone(started, victim.name)
    return started


def _poll(check: Callable[[], bool], timeout_s: float, failure: Callable[[], str]) -> float:
    """Seconds until `check` holds (a check that finds a service not answering does not); ChaosError with
    `failure()` after `timeout_s`."""
    began = time.monotonic()
    while not _holds(check):
        if time.monotonic() - began > timeout_s:
            raise ChaosError(failure())
        time.sleep(0.5)  # poll: the master or the controller acts within seconds
    return time.monotonic() - began


def _holds(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except Unhealthy:
        return False  # e.g. a metadata request that went to the broker just killed: ask again


def kill_spark_worker(stack: StackSettings, rnd: random.Random, timeout_s: float = 120.0) -> str:
    """kill -9 one worker and the executors it runs; wait until the master has started as many again on the
    other workers, then start the worker again. Before the kill every worker must run an executor: the
    jobs ran spread over the cluster, in executors of their own, not in the driver."""
    workers = [service for service in spark.members(stack) if service.name != spark.MASTER]
    if not workers:
        raise ChaosError("the spark_worker fault needs the cluster profile: set TIDE_SPARK_WORKERS (docs/cluster.md)")
    before = executors_by_worker(stack, workers)
    if idle := [name for name, executors in before.items() if not executors]:
        raise ChaosError(f"{', '.join(idle)} ran no executor before the fault: the jobs did not spread over the "
                         f"cluster ({before})")
    victim = rnd.choice(workers)
    started = _kill(stack, victim)
    began = time.monotonic()
    survivors = [worker for worker in workers if worker is not victim]
    after = before

    def moved() -> bool:
        nonlocal after
        after = executors_by_worker(stack, survivors)
        return _count(after) >= _count(before)

    moved_s = _poll(moved, timeout_s, lambda: f"the executors {victim.name} ran were not started again within "
                                              f"{timeout_s:.0f}s: {after}")
    runner.start_and_wait(stack, [victim])
    return (f"kill -9 {victim.name} (pid {started.pid}) with its executors {', '.join(before[victim.name])} "
            f"(before: {_listed(before)}); executors again on the others in {moved_s:.0f}s ({_listed(after)}); "
            f"{victim.name} healthy again in {time.monotonic() - began:.0f}s")


def executors_by_worker(stack: StackSettings, workers: list[Service], timeout_s: float = 60.0) -> dict[str, list[str]]:
    """The executors (application/executor id) each worker runs, as the worker itself reports them; asked
    again while a worker is slow to answer (its web UI shares the loaded machine's two cores)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return {worker.name: [f"{executor['appid']}/{executor['id']}" for executor in
                                  spark.read_worker(stack, spark.worker_number(worker)).get("executors", [])]
                    for worker in workers}
        except Unhealthy as exc:
            if time.monotonic() > deadline:
                raise ChaosError(f"{exc}, for {timeout_s:.0f}s") from exc
            time.sleep(1.0)  # poll: the worker answers once it gets the CPU


def _count(executors: dict[str, list[str]]) -> int:
    return sum(len(ids) for ids in executors.values())


def _listed(executors: dict[str, list[str]]) -> str:
    return "; ".join(f"{worker}: {', '.join(ids) or 'none'}" for worker, ids in executors.items())


def kill_kafka_broker(target: Target, rnd: random.Random, timeout_s: float = 120.0) -> str:
    """kill -9 one broker after the first (the first is the KRaft controller: docs/cluster.md) that leads
    partitions of the run's change topics; wait until each of them has a leader among the others, start the
    broker again and wait until it is in sync on every partition again. Before the kill every partition
    must have a replica on each of three brokers, all in sync: the one killed holds nothing the others lack."""
    stack, topics = target.stack, [target.pipeline.topic(table) for table in target.pipeline.tables]
    before = kafka.partitions(stack, topics)
    if thin := [f"{p.topic}/{p.number}" for p in before if len(p.in_sync) < 3]:
        raise ChaosError(f"the kafka_broker fault needs every partition on three in-sync replicas "
                         f"(TIDE_KAFKA_BROKERS=3, docs/cluster.md); these have fewer: {', '.join(thin)}")
    leaders = {p.leader for p in before}
    candidates = [number for number in range(2, stack.kafka_brokers + 1) if number in leaders]
    if not candidates:
        raise ChaosError(f"no broker but the first leads a partition of {', '.join(topics)}: nothing to fail over")
    number = rnd.choice(candidates)
    victim = kafka.broker(number)
    started = _kill(stack, victim)
    led = sum(p.leader == number for p in before)
    moved_s = _poll(lambda: all(p.leader not in (number, -1) for p in kafka.partitions(stack, topics)), timeout_s,
                    lambda: f"partitions {victim.name} led had no other leader {timeout_s:.0f}s after the kill")
    began = time.monotonic()
    runner.start_and_wait(stack, [victim])
    synced_s = _poll(lambda: all(number in p.in_sync for p in kafka.partitions(stack, topics)), timeout_s,
                     lambda: f"{victim.name} was not in sync on every partition {timeout_s:.0f}s after its restart")
    return (f"kill -9 {victim.name} (pid {started.pid}), leader of {led} of {len(before)} partitions; other "
            f"leaders in {moved_s:.0f}s; healthy again in {time.monotonic() - began - synced_s:.0f}s and in sync "
            f"on every partition {synced_s:.0f}s later")


def injector(fault: str) -> Callable[[Target, random.Random], str]:
    """The function that injects `fault`, one of profiles.CLUSTER_FAULTS."""
    return {
        "spark_worker": lambda target, rnd: kill_spark_worker(target.stack, rnd),
        "kafka_broker": kill_kafka_broker,
    }[fault]
