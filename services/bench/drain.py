"""Scenario `drain`: the apply side's clean rate, beside the capture stage's and the source's, for one backlog.

1. A clean stack; the demo seed captured and applied by every sink.
2. The decoding-ceiling slots are created; every query is paused (`tide jobs pause`) and so is
   the connector (its slot then holds every change).
3. The load generator writes a backlog of `changes` row changes, the usual mix, as fast as it
   can (PostgreSQL alone is busy).
4. PostgreSQL's decoding drains the same changes, alone (pg_recvlogical, as in `baseline`): the
   decoding rate, and how many records Debezium makes of them.
5. The connector resumes: the time until the topics hold those records is Debezium's capture
   rate, alone.
6. Every query resumes: per sink, the time until it has committed everything in its topics is
   its apply rate. The sinks share the machine as they do in production, and nothing else runs.

Every rate is a backlog over the time its stage took, in the records Debezium writes (a delete is
a delete and a tombstone), so the ratios compare like with like. A slow sink does not hang the
run: past `timeout_s`, or once no sink has gained for 10 minutes, the progress so far is the result.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from services.bench import plots
from services.bench.baseline import DecodingCeiling
from services.bench.core import STALL_S, Bench, BenchError
from services.bench.measure import ratios
from services.demo import load

NAME = "drain"
DEFAULTS = {"changes": 500_000, "seed": 1, "timeout_s": 3600.0, "write_rate": 100_000.0}
SAMPLE_S = 1.0
CAPTURE_STALL_S = 120.0  # Debezium writes continuously while it has a backlog


def run(bench: Bench) -> dict:
    options = {**DEFAULTS, **bench.options}
    bench.up()
    bench.seed_demo()
    bench.capture_and_apply()
    snapshot_s = bench.wait_caught_up(600, stall_s=STALL_S)
    bench.say(f"initial snapshot applied by every sink ({snapshot_s}s after the jobs started)")
    ceiling = DecodingCeiling(bench)
    ceiling.create()
    bench.say("pausing every query and the connector")
    bench.pause_queries(True)
    bench.pause_connector(True)
    start = bench.progress()

    written = write_backlog(bench, options["changes"], options["write_rate"])
    bench.say("PostgreSQL decodes the backlog alone (pg_recvlogical)")
    decoded = ceiling.drain()
    records = decoded["debezium_records"]
    bench.say(f"  {decoded['captured_row_changes']:,} row changes of captured tables → {records:,} records; "
              f"pgoutput drained them in {decoded['pgoutput']['seconds']} s")

    capture = time_capture(bench, start["captured"] + records, options["timeout_s"])
    apply = time_sinks(bench, options["timeout_s"])
    seconds: dict[str, float | None] = {"decoding": decoded["pgoutput"]["seconds"], "capture": capture["seconds"],
                                        **{sink: apply["sinks"][sink]["seconds"] for sink in bench.sinks}}
    rates: dict[str, float | None] = {"decoding": per_s(records, seconds["decoding"]),
                                      "capture": capture["records_per_s"],
                                      **{sink: apply["sinks"][sink]["records_per_s"] for sink in bench.sinks}}
    return {
        "snapshot_catch_up_s": snapshot_s,
        "backlog": written,
        "ceiling": decoded,
        "capture": capture,
        "apply": apply,
        "records_per_s": rates,
        "seconds": seconds,
        "ratios": {"of_decoding": ratios(rates, rates["decoding"]),
                   "of_capture": ratios({sink: rates[sink] for sink in bench.sinks}, rates["capture"])},
    }


def per_s(count: int | float, seconds: float | None) -> float | None:
    return round(count / seconds, 1) if seconds else None


def write_backlog(bench: Bench, changes: int, rate: float) -> dict:
    """The mixed workload as fast as it goes until PostgreSQL has counted `changes` row changes
    (its counters lag by up to a second, so a little more is written; the result says how much)."""
    bench.say(f"writing a backlog of {changes:,} row changes (PostgreSQL alone)")
    bench.record_others()
    stop = threading.Event()
    with bench.connect() as conn:
        first = load.row_changes(conn)

        def enough(report: load.LoadReport) -> None:
            if int(report.seconds) % 5 == 0:
                bench.record_load()
            if load.row_changes(conn) - first >= changes:
                stop.set()

        report = load.run(bench.conninfo(), rate, max(60.0, changes / 200), seed=bench.options.get("seed", 1),
                          stop=stop, on_progress=enough)
    if report.row_changes is None or report.row_changes < changes:
        raise BenchError(f"the load generator wrote {report.row_changes or 0:,} row changes of {changes:,} "
                         f"({report.errors[:1] or 'it ran out of time'})")
    bench.say(f"  {report.row_changes:,} row changes in {report.seconds:.0f}s ({report.row_changes_per_s:,.0f}/s, "
              f"{report.achieved_rate:,.0f} operations/s)")
    return report.as_dict()


def time_capture(bench: Bench, target: int, timeout_s: float) -> dict:
    """Resume the connector; seconds until the topics hold `target` records (the queries stay paused).
    Gives up past `timeout_s`, or when the topics stop growing for CAPTURE_STALL_S short of it."""
    first = bench.progress(sinks=())["captured"]
    bench.say(f"resuming the connector; waiting for the topics to hold {target - first:,} more records")
    series: list[list[float]] = [[0.0, 0]]
    bench.record_others()
    bench.pause_connector(False)
    began = last_gain = time.monotonic()
    while series[-1][1] < target - first:
        time.sleep(0.5)  # poll: Debezium writes at its own pace
        now, count = time.monotonic(), bench.progress(sinks=())["captured"] - first
        last_gain = now if count > series[-1][1] else last_gain
        series.append([round(now - began, 2), count])
        if len(series) % 10 == 0:
            bench.record_load()
        if now - began > timeout_s or now - last_gain > CAPTURE_STALL_S:
            bench.say(f"  stopped waiting after {now - began:.0f}s: {count:,} of {target - first:,} records")
            break
    seconds = series[-1][0] if series[-1][1] >= target - first else None
    if seconds is not None:
        bench.say(f"  captured {target - first:,} records in {seconds} s")
    return {"records": target - first, "captured": series[-1][1], "seconds": seconds,
            "records_per_s": per_s(target - first, seconds), "series": series}


def time_sinks(bench: Bench, timeout_s: float) -> dict:
    """Resume every query; per sink, seconds until it has committed everything in its topics."""
    start, ends = bench.progress(), bench.end_offsets()  # the capture is over: the ends are fixed
    goal = {sink: sum(sum(ends.get(topic, {}).values()) for topic in bench.topics(sink)) for sink in bench.sinks}
    bench.say("resuming every query; waiting for each sink to apply its backlog: "
              + ", ".join(f"{sink} {goal[sink] - start[sink]:,}" for sink in bench.sinks))
    bench.record_others()
    bench.pause_queries(False)
    began = last_gain = time.monotonic()
    series: list[list[float]] = []
    done_at: dict[str, float] = {}
    # A sink with a follow-up query (search's nested views) has applied its backlog once that query has too.
    follow = [sink for sink in bench.sinks if sink in bench.follow_up_topics]
    views_done_at: dict[str, float] = {}
    least_behind: dict[str, int] = {}
    stopped: str | None = None
    while len(done_at) < len(bench.sinks) or len(views_done_at) < len(follow):
        now = time.monotonic()
        counts = bench.progress()
        if series and any(counts[sink] - start[sink] > series[-1][i] for i, sink in enumerate(bench.sinks, start=1)):
            last_gain = now
        series.append([round(now - began, 1), *(counts[sink] - start[sink] for sink in bench.sinks)])
        for sink in bench.sinks:
            if sink not in done_at and counts[sink] >= goal[sink]:
                done_at[sink] = round(now - began, 1)
                bench.say(f"  {sink} caught up after {done_at[sink]} s")
        for sink in (sink for sink in follow if sink in done_at and sink not in views_done_at):
            behind = bench.follow_up_behind(sink)  # its main query is done: only the follow-up's lag is left
            if behind <= 0:
                views_done_at[sink] = round(now - began, 1)
                bench.say(f"  {sink}'s follow-up query caught up after {views_done_at[sink]} s")
            elif behind < least_behind.get(sink, behind + 1):
                least_behind[sink], last_gain = behind, now
        try:
            bench.require_jobs()
        except BenchError as exc:
            stopped = str(exc)
        if stopped or now - began > timeout_s or now - last_gain > STALL_S:
            stopped = stopped or ("timeout" if now - began > timeout_s else f"no sink gained for {STALL_S:.0f}s")
            bench.say(f"  stopped waiting after {now - began:.0f}s ({stopped}): " + ", ".join(
                f"{sink} {series[-1][i]:,} of {goal[sink] - start[sink]:,}"
                for i, sink in enumerate(bench.sinks, start=1) if sink not in done_at))
            break
        if len(series) % 30 == 0:
            bench.record_load()
            bench.say("  applied: " + ", ".join(
                f"{sink} {series[-1][i]:,}" for i, sink in enumerate(bench.sinks, start=1)))
        time.sleep(SAMPLE_S)  # poll: the queries commit on their own schedule
    sinks = {}
    for i, sink in enumerate(bench.sinks, start=1):
        backlog, applied, seconds = goal[sink] - start[sink], series[-1][i], done_at.get(sink)
        sinks[sink] = {"records": backlog, "applied": applied, "seconds": seconds,
                       "records_per_s": per_s(backlog, seconds) if seconds else None,
                       "second_half_records_per_s": second_half_rate(series, i, backlog, seconds),
                       # with its follow-up query's work (the nested views), for a sink that has one
                       **({"with_follow_up_seconds": views_done_at.get(sink),
                           "with_follow_up_records_per_s": per_s(backlog, views_done_at.get(sink))}
                          if sink in follow else {}),
                       # not caught up: the rate so far, which the catch-up wait before verify uses
                       "rate_so_far": per_s(applied, series[-1][0])}
    return {"sinks": sinks, "stopped_waiting": stopped, "series_columns": ["seconds", *bench.sinks],
            "series": series}


def second_half_rate(series: list[list[float]], column: int, backlog: int, done_s: float | None) -> float | None:
    """Records per second over the second half of a sink's backlog: from the first sample at or past half
    of it to the catch-up. The drain starts on cold JVMs (the jobs' and Elasticsearch's code is compiled
    as it runs: docs/benchmarks.md, "drain, cold and warm"), so this is the warmer of the two figures."""
    half = next((row for row in series if row[column] >= backlog / 2), None)
    if done_s is None or half is None or done_s <= half[0]:
        return None
    return per_s(backlog - half[column], done_s - half[0])


def check(bench: Bench, results: dict) -> dict:
    rates = {sink: s["records_per_s"] or s["rate_so_far"] for sink, s in results["apply"]["sinks"].items()}
    return bench.verify(rates=rates)


def plot(result: dict, out_dir: Path) -> list[Path]:
    data = result["results"]
    apply = data["apply"]
    return [
        plots.stage_rates(data["records_per_s"], out_dir / "drain-rates.png",
                          f"Backlog of {data['backlog']['row_changes']:,} row changes "
                          f"({data['capture']['records']:,} records): rate per stage"),
        plots.progress(apply["series"], apply["series_columns"][1:], out_dir / "drain-progress.png",
                       "Each sink applying the backlog (queries resumed at 0)",
                       None, "seconds since the queries were resumed", goals={
                           sink: s["records"] for sink, s in apply["sinks"].items()}),
        plots.components(result["component_series"], out_dir / "components.png", "CPU and memory per component"),
    ]
