"""Chaos profiles and the seeded fault schedule (pure: unit-tested in tests/unit/test_chaos.py).

A profile says how many writers run for how long, which faults are injected how often, and how
large the snapshot taken under load is. `schedule` turns a profile and a seed into the faults'
start times: the same seed gives the same schedule, so a failure replays with `--seed`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Every fault the runner can inject (services/chaos/faults.py says what each does).
KILLS = ("connect", "driver", "kafka", "redis", "elasticsearch")  # kill -9, then restart
FAULTS = (*KILLS, "pause", "postgres", "walsender", "stale_redelivery")
# The cluster profile's faults (docs/cluster.md): only a stack that runs it can take them.
CLUSTER_FAULTS = ("spark_worker", "kafka_broker")


@dataclass(frozen=True)
class Profile:
    name: str
    writers: int
    write_s: float  # how long the writers run; every fault starts inside this window
    faults: dict[str, int]  # fault -> times injected
    snapshot_rows: int = 0  # rows in chaos_bulk before capture starts (its snapshot then runs under load)
    writer_pause_s: float = 0.15  # between one writer's transactions (pacing, not synchronisation)
    converge_s: float = 600.0  # deadline for capture and every sink to catch up once the writers stop
    verify_gap_s: float = 30.0  # between the two verify passes
    pause_s: tuple[float, float] = (3.0, 15.0)  # how long a SIGSTOP lasts, drawn from this range
    stale_keys: int = 10  # keys one stale redelivery sends an old change of
    warm_up_s: float = field(default=20.0)  # writes before the first fault
    # The demo tables (their snapshot, views, windows and aggregates) in the run's pipeline beside the ledgers.
    demo_tables: bool = True
    # Partitions of the run's change topics (None: pipeline.yaml's).
    partitions: int | None = None

    @property
    def needs_cluster(self) -> bool:
        return any(fault in CLUSTER_FAULTS for fault in self.faults)

    def unmet(self, spark_workers: int, kafka_brokers: int) -> list[str]:
        """What a stack of `spark_workers` workers and `kafka_brokers` brokers lacks for this profile's faults:
        a worker killed needs another to take its executors, a broker killed two others holding its replicas."""
        needs = []
        if "spark_worker" in self.faults and spark_workers < 2:
            needs.append("TIDE_SPARK_WORKERS=2 (a worker to kill and one to take its executors)")
        if "kafka_broker" in self.faults and kafka_brokers < 3:
            needs.append("TIDE_KAFKA_BROKERS=3 (a broker to kill and two holding its replicas)")
        return needs

    def __post_init__(self) -> None:
        unknown = set(self.faults) - {*FAULTS, *CLUSTER_FAULTS}
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join((*FAULTS, *CLUSTER_FAULTS))}")


PROFILES = {
    # CI: a few minutes, the faults the issue names for it plus the cheap ones.
    "smoke": Profile(
        name="smoke",
        writers=3,
        write_s=150.0,
        faults={"connect": 1, "driver": 1, "kafka": 1, "walsender": 1, "pause": 1, "stale_redelivery": 2},
        converge_s=480.0,
    ),
    # CI, on the cluster profile (TIDE_SPARK_WORKERS=2, TIDE_KAFKA_BROKERS=3): a worker killed with its
    # executors and a broker killed under load, topics of 4 partitions. The local faults and the demo tables'
    # views are the smoke profile's to test: this one stays short, and its ledgers go through every sink
    # (with the demo tables' snapshot a run took 10+ minutes on the cluster).
    "cluster": Profile(
        name="cluster",
        writers=2,
        write_s=60.0,
        faults={"spark_worker": 1, "kafka_broker": 1},
        partitions=4,
        converge_s=480.0,
        verify_gap_s=10.0,
        demo_tables=False,
    ),
    # By hand: half an hour, every fault several times, a 1M-row snapshot under load.
    "full": Profile(
        name="full",
        writers=4,
        write_s=1800.0,
        faults=dict.fromkeys(FAULTS, 4),
        snapshot_rows=1_000_000,
        # The warehouse took 100,000-row snapshot batches at 230-370 s each under this load (seed
        # 968654), and every driver kill restarts one: its 1M rows alone need about 45 minutes.
        converge_s=3600.0,
        warm_up_s=60.0,
    ),
}


@dataclass(frozen=True)
class Planned:
    at_s: float  # seconds after the writers start; a fault never starts before its time
    fault: str
    draw: int  # the fault's own seed (which key, which service to pause, how long)


def schedule(profile: Profile, seed: int) -> list[Planned]:
    """Every fault of the profile at a random point of its own slot of the write window, in order.

    Slots keep faults apart (a restart takes tens of seconds); the order of faults is shuffled."""
    rnd = random.Random(seed)
    faults = [fault for fault, times in sorted(profile.faults.items()) for _ in range(times)]
    rnd.shuffle(faults)
    if not faults:
        return []
    window = profile.write_s - profile.warm_up_s
    slot = window / len(faults)
    return [
        Planned(at_s=round(profile.warm_up_s + i * slot + rnd.uniform(0, slot * 0.5), 1), fault=fault,
                draw=rnd.getrandbits(32))
        for i, fault in enumerate(faults)
    ]
