"""A result as Markdown (summary.md next to result.json): the machine, its load, the numbers, verify."""

from __future__ import annotations

from pathlib import Path

from spark_jobs.model.settings import SINKS


def _row(*cells: object) -> str:
    return "| " + " | ".join("–" if cell is None else str(cell) for cell in cells) + " |"


DEFAULT_SETTING = "worker or Debezium default"  # what runs.knobs records for a setting the config leaves out


def machine_table(result: dict) -> list[str]:
    machine, versions, knobs = result["machine"], result["versions"], result["knobs"]
    during = [entry[1] for entry in result.get("load_during", [])]
    others = {p["command"].split()[0].rsplit("/", 1)[-1] + " " + _worktree(p["command"])
              for entry in result.get("other_processes_during", []) for p in entry["busiest"]
              if p["cpu_percent"] >= 5 and p["command"].strip()}
    return [
        _row("machine", f"{machine['cores']} cores ({machine['cpu_model']}), {machine['memory_gib']} GiB, "
                        f"Linux {machine['kernel']}, Python {machine['python']}"),
        _row("versions", ", ".join(f"{name} {version}" for name, version in versions.items())),
        _row("knobs", ", ".join(f"{name}={value}" for name, value in knobs.items() if not isinstance(value, dict))),
        _row("connector (capture settings)", ", ".join(
            f"{name}={value}" for name, value in knobs.get("connector", {}).items() if value != DEFAULT_SETTING)
            or "all at the worker's or Debezium's defaults"),
        _row("load average (1 min)", f"before {result['load_before']['loadavg'][0]}, during "
             + (f"{min(during)}–{max(during)}" if during else "not sampled") + f", after {result['load_after'][0]}"),
        _row("other busy processes seen during the run (≥ 5% of a core over 2 s)",
             "; ".join(sorted(others)) or "none seen"),
        _row("wall time", f"{result['wall_s']:.0f} s"),
    ]


def _worktree(command: str) -> str:
    """Whose process it was: the checkout folder named in its command line, if any."""
    marker = "/work/"
    if marker not in command:
        return ""
    return "(" + command[command.index(marker):].split("/")[2] + ")"


def verify_line(result: dict) -> str:
    check = result["verify"]
    if "error" in check:
        return f"verify could not run: {check['error']}"
    if "views" not in check:
        return f"check: {'clean' if check['clean'] else 'FAILED'} ({check})"
    bad = [f"{v['table']}→{v['sink']} {v['divergences']}" for v in check["views"] if v["divergences"]]
    return (f"tide verify: {'clean' if check['clean'] else 'DIVERGES: ' + '; '.join(bad)} "
            f"({len(check['views'])} views, {check['seconds']} s)")


def _ratio(value: float | None) -> str | None:
    return None if value is None else f"{value:.1%}" if value >= 0.001 else f"{value:.2%}"


def freshness_lines(data: dict) -> list[str]:
    lines = [_row("rate asked", "achieved ops/s", "row changes/s", "sink", "markers", "p50 s", "p95 s", "p99 s",
                  "max s", "never seen"), _row(*["---"] * 10)]
    for phase in data["phases"]:
        for sink, d in phase["delay_s"].items():
            lines.append(_row(phase["rate"], phase["load"]["achieved_rate"], phase["source_row_changes_per_s"], sink,
                              d["count"], d["p50"], d["p95"], d["p99"], d["max"], phase["markers_never_seen"][sink]))
    lines += ["", "`captured`: commit → in the marker table's change topic (the capture stage alone).", "",
              warm_up_line(data.get("warm_up")), ""]
    return lines + offered_lines(data["phases"])


def warm_up_line(warm_up: dict | None) -> str:
    """What ran before the first measured phase (results written before 2026-12-05 09:00 UTC have none)."""
    if not warm_up or not warm_up["seconds"]:
        return "Measured from the cold start: no warm-up."
    return (f"Warm-up, not measured: {warm_up['rate']:g} operations/s for {warm_up['seconds']:.0f} s, then every "
            f"sink caught up in {warm_up['catch_up_s']} s.")


def offered_lines(steps: list[dict]) -> list[str]:
    """Per step or phase: records/s into Kafka, each sink's applied rate and its fraction of it."""
    sinks = list(steps[0]["applied_per_s"]) if steps else []
    if not sinks:
        return []
    lines = [_row("rate asked", "records/s into Kafka", *(f"{sink} applied/s (of offered)" for sink in sinks)),
             _row(*["---"] * (2 + len(sinks)))]
    for step in steps:
        lines.append(_row(step["rate"], step["captured_per_s"], *(
            f"{step['applied_per_s'][sink]} ({_ratio(step['applied_of_captured'][sink])})" for sink in sinks)))
    return lines


def snapshot_lines(data: dict) -> list[str]:
    read = data["read_ceiling"]
    lines = [f"Read ceiling (PostgreSQL alone, COPY of every captured table, same run): {read['rows']:,} rows in "
             f"{read['seconds']} s, {read['rows_per_s']:,.0f} rows/s.", "",
             _row("stage", "rows", "seconds to all rows", "mean rows/s", "of read ceiling", "of capture",
                  "peak rows/s (10 s)"), _row(*["---"] * 7)]
    for name, done in data["completion"].items():
        lines.append(_row(name, done["rows"], done["seconds_to_all_rows"], done["rows_per_s"],
                          _ratio(data["ratios"]["of_read_ceiling"][name]),
                          _ratio(data["ratios"]["of_capture"].get(name)), done["peak_rows_per_s"]))
    if cpu := data.get("capture_cpu"):
        lines += ["", f"CPU while the snapshot was captured: {cpu['total_ms_per_1000_rows']} ms per 1,000 rows ("
                  + ", ".join(f"{name} {ms}" for name, ms in cpu["ms_per_1000_rows"].items()) + ")."]
    return lines


def throughput_lines(data: dict) -> list[str]:
    lines = [_row("rate asked", "achieved ops/s", "row changes/s", "records/s into Kafka", *SINKS, "keeps up",
                  "busiest component"), _row(*["---"] * (6 + len(SINKS)))]
    for step in data["steps"]:
        applied = step["applied_per_s"]
        lines.append(_row(step["rate"], step["load"]["achieved_rate"], step["source_row_changes_per_s"],
                          step["captured_per_s"], *(applied[sink] for sink in SINKS),
                          ", ".join(s for s, ok in step["keeps_up"].items() if ok) or "none",
                          step["busiest_component"]))
    lines += ["", _row("sink", "highest sustained row changes/s", "of decoding ceiling"), _row(*["---"] * 3)]
    for sink, best in data["summary"].items():
        lines.append(_row(sink, best["highest_sustained_row_changes_per_s"], _ratio(best["of_decoding_ceiling"])))
    return ["", *lines, "", *offered_lines(data["steps"])]


def drain_lines(data: dict) -> list[str]:
    backlog, capture = data["backlog"], data["capture"]
    lines = [f"Backlog: {backlog['row_changes']:,} row changes written in {backlog['seconds']:.0f} s "
             f"({backlog['row_changes_per_s']:,.0f} /s, {backlog['achieved_rate']:,.0f} operations/s, "
             f"{backlog['workers']} connections), {capture['records']:,} records in the change topics.", "",
             _row("stage", "records", "seconds", "records/s", "of decoding", "of capture"), _row(*["---"] * 6)]
    records = {"decoding": capture["records"], "capture": capture["records"],
               **{sink: s["records"] for sink, s in data["apply"]["sinks"].items()}}
    for stage, rate in data["records_per_s"].items():
        seconds = data["seconds"][stage]
        lines.append(_row(stage, records[stage], seconds if seconds is not None else "not caught up", rate,
                          _ratio(data["ratios"]["of_decoding"][stage]),
                          _ratio(data["ratios"]["of_capture"].get(stage))))
    for sink, s in data["apply"]["sinks"].items():
        if "with_follow_up_seconds" in s:
            done = s["with_follow_up_seconds"]
            lines += ["", f"{sink} with its follow-up query (the nested views): "
                      + (f"caught up after {done} s, {s['with_follow_up_records_per_s']:,.0f} records/s."
                         if done else "not caught up.")]
    warmer = {sink: s["second_half_records_per_s"] for sink, s in data["apply"]["sinks"].items()
              if s.get("second_half_records_per_s")}
    if warmer:
        lines += ["", "Over the second half of each backlog (the JVMs warmer): "
                  + ", ".join(f"{sink} {rate:,.0f} records/s" for sink, rate in warmer.items()) + "."]
    return lines


def ceiling_line(ceiling: dict) -> str:
    return (f"Decoding ceiling (pg_recvlogical, same run): {ceiling['row_changes']:,} row changes drained in "
            f"{ceiling['pgoutput']['seconds']} s with pgoutput ({ceiling['pgoutput']['row_changes_per_s']:,} /s), "
            f"{ceiling['test_decoding']['seconds']} s with test_decoding "
            f"({ceiling['test_decoding']['row_changes_per_s']:,} /s).")


def components_lines(components: dict, title: str) -> list[str]:
    lines = [_row(title, "mean CPU % of a core", "peak CPU %", "peak RSS MiB"), _row(*["---"] * 4)]
    for name, c in sorted(components.items()):
        lines.append(_row(name, c["cpu_mean_percent"], c["cpu_peak_percent"], c["rss_peak_mb"]))
    return [*lines, ""]


def markdown(result: dict) -> str:
    data, scenario = result["results"], result["scenario"]
    lines = [f"### {scenario} — {result['started_at']}", "", _row("", ""), _row("---", "---"),
             *machine_table(result), ""]
    if scenario == "freshness":
        lines += freshness_lines(data)
    elif scenario == "snapshot":
        jobs = ("capture only (no Spark jobs)" if data.get("capture_only")
                else f"jobs running {data['jobs_ready_s']} s after the connector was registered")
        lines += [f"{data['rows']:,} rows ({data['products_written']:,} products written, the rest the demo seed), "
                  f"{data['source']['description_mean_bytes']} B mean description, "
                  f"{data['source']['table_bytes'] / 2**20:,.0f} MiB in PostgreSQL; {jobs}.", "", *snapshot_lines(data)]
    elif scenario == "throughput":
        lines += throughput_lines(data)
    elif scenario == "drain":
        lines += drain_lines(data)
    elif scenario == "baseline":
        load = data["load"]
        lines += [f"Workload: {load['achieved_rate']:,} operations/s achieved ({load['target_rate']:,g} asked, "
                  f"{load['workers']} connections in {load['processes']} processes), "
                  f"{data['source_row_changes_per_s']:,} row changes/s written: "
                  f"{_ratio(data['ratios']['written'])} of pgoutput's decoding rate."]
    if "ceiling" in data:
        lines += ["", ceiling_line(data["ceiling"])]
    lines.append("")
    for phase in data.get("phases", []):  # freshness: CPU while each rate ran
        lines += components_lines(phase["components"], f"component, during {phase['label']}")
    lines += [*components_lines(result.get("components", {}), "component, whole run"), verify_line(result), ""]
    return "\n".join(lines)


def write(result: dict, out_dir: Path) -> Path:
    path = out_dir / "summary.md"
    path.write_text(markdown(result))
    return path
