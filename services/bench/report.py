"""A result as Markdown (summary.md next to result.json): the machine, its load, the numbers, verify."""

from __future__ import annotations

from pathlib import Path


def _row(*cells: object) -> str:
    return "| " + " | ".join("–" if cell is None else str(cell) for cell in cells) + " |"


def machine_table(result: dict) -> list[str]:
    machine, versions, knobs = result["machine"], result["versions"], result["knobs"]
    during = [entry[1] for entry in result.get("load_during", [])]
    others = {p["command"].split()[0].rsplit("/", 1)[-1] + " " + _worktree(p["command"])
              for entry in result.get("other_processes_during", []) for p in entry["busiest"] if p["cpu_percent"] >= 5}
    return [
        _row("machine", f"{machine['cores']} cores ({machine['cpu_model']}), {machine['memory_gib']} GiB, "
                        f"Linux {machine['kernel']}, Python {machine['python']}"),
        _row("versions", ", ".join(f"{name} {version}" for name, version in versions.items())),
        _row("knobs", ", ".join(f"{name}={value}" for name, value in knobs.items())),
        _row("load average (1 min)", f"before {result['load_before']['loadavg'][0]}, during "
             + (f"{min(during)}–{max(during)}" if during else "not sampled") + f", after {result['load_after'][0]}"),
        _row("other busy processes seen during the run (≥ 5% of a core over 2 s)", "; ".join(sorted(others)) or "none seen"),
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


def freshness_lines(data: dict) -> list[str]:
    lines = [_row("rate asked", "achieved ops/s", "row changes/s", "sink", "markers", "p50 s", "p95 s", "p99 s", "max s",
                  "never seen"), _row(*["---"] * 10)]
    for phase in data["phases"]:
        for sink, d in phase["delay_s"].items():
            lines.append(_row(phase["rate"], phase["load"]["achieved_rate"], phase["source_row_changes_per_s"], sink,
                              d["count"], d["p50"], d["p95"], d["p99"], d["max"], phase["markers_never_seen"][sink]))
    return lines


def snapshot_lines(data: dict) -> list[str]:
    lines = [_row("stage", "rows", "seconds to all rows", "mean rows/s", "peak rows/s (10 s)"), _row(*["---"] * 5)]
    for name, done in data["completion"].items():
        lines.append(_row(name, done["rows"], done["seconds_to_all_rows"], done["rows_per_s"], done["peak_rows_per_s"]))
    return lines


def throughput_lines(data: dict) -> list[str]:
    lines = [_row("rate asked", "achieved ops/s", "row changes/s", "records/s into Kafka", "search", "cache",
                  "warehouse", "keeps up", "busiest component"), _row(*["---"] * 9)]
    for step in data["steps"]:
        applied = step["applied_per_s"]
        lines.append(_row(step["rate"], step["load"]["achieved_rate"], step["source_row_changes_per_s"],
                          step["captured_per_s"], applied["search"], applied["cache"], applied["warehouse"],
                          ", ".join(s for s, ok in step["keeps_up"].items() if ok) or "none",
                          step["busiest_component"]))
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
    return lines + [""]


def markdown(result: dict) -> str:
    data, scenario = result["results"], result["scenario"]
    lines = [f"### {scenario} — {result['started_at']}", "", _row("", ""), _row("---", "---"), *machine_table(result), ""]
    if scenario == "freshness":
        lines += freshness_lines(data)
    elif scenario == "snapshot":
        lines += [f"{data['rows']:,} rows ({data['products_written']:,} products written, the rest the demo seed), "
                  f"{data['source']['description_mean_bytes']} B mean description, "
                  f"{data['source']['table_bytes'] / 2**20:,.0f} MiB in PostgreSQL; jobs running "
                  f"{data['jobs_ready_s']} s after the connector was registered.", "", *snapshot_lines(data)]
    elif scenario == "throughput":
        lines += throughput_lines(data)
    elif scenario == "baseline":
        lines += [f"Workload: {data['load']['achieved_rate']} ops/s achieved, {data['source_row_changes_per_s']} "
                  "row changes/s written."]
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
