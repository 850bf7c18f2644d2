"""PNG plots drawn from a result's JSON alone (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # after choosing the backend

from spark_jobs.model.settings import SINKS

# The stages before the sinks have fixed colours; the declared sinks take the palette's in turn (none
# of the stages'), so a sink added to the registry is drawn without a change here.
STAGE_COLOURS = {"captured": "tab:gray", "capture": "tab:gray", "decoding": "tab:olive"}
SINK_PALETTE = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:cyan")
SINK_COLOURS: dict[str, str] = {
    **{sink: SINK_PALETTE[index % len(SINK_PALETTE)] for index, sink in enumerate(SINKS)}, **STAGE_COLOURS}


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def cdf_points(values: list[float]) -> tuple[list[float], list[float]]:
    """Sorted values and the fraction of values at or below each (the empirical CDF)."""
    ordered = sorted(values)
    return ordered, [(i + 1) / len(ordered) for i in range(len(ordered))]


def delays(phases: list[dict], path: Path, title: str) -> Path:
    """Per phase (one row): delay over time per sink, and the CDF of delays per sink."""
    figure, axes = plt.subplots(len(phases), 2, figsize=(12, 3.6 * len(phases)), squeeze=False)
    for row, phase in zip(axes, phases, strict=True):
        over_time, cdf = row
        for sink, points in phase["delays"].items():
            if not points:
                continue
            colour = SINK_COLOURS.get(sink)
            over_time.plot([p[0] for p in points], [p[1] for p in points], ".", ms=3, color=colour, label=sink)
            xs, ys = cdf_points([p[1] for p in points])
            cdf.step(xs, ys, where="post", color=colour, label=sink)
        over_time.set(title=f"{phase['label']}: delay over time", xlabel="commit time (s since start)",
                      ylabel="commit → readable (s)")
        over_time.set_yscale("log")
        cdf.set(title=f"{phase['label']}: CDF", xlabel="commit → readable (s)", ylabel="fraction of markers")
        cdf.set_xscale("log")
        for axis in row:
            axis.grid(True, alpha=0.3)
            axis.legend(loc="best", fontsize=8)
    figure.suptitle(title)
    return _save(figure, path)


def offered_vs_applied(steps: list[dict], path: Path, title: str) -> Path:
    """Rate offered (changes/s into the topics) against rate applied, per sink; y = x is keeping up.
    `steps` (throughput's steps, freshness's phases) each have captured_per_s and applied_per_s."""
    figure, axis = plt.subplots(figsize=(7, 5))
    offered = [step["captured_per_s"] for step in steps]
    for sink in steps[0]["applied_per_s"] if steps else ():
        axis.plot(offered, [step["applied_per_s"][sink] for step in steps], "o-", color=SINK_COLOURS.get(sink),
                  label=sink)
    top = max([*offered, 1.0]) * 1.1
    axis.plot([0, top], [0, top], "--", color="gray", label="keeps up (applied = offered)")
    axis.set(title=title, xlabel="changes/s offered (into Kafka)", ylabel="changes/s applied by the sink")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    return _save(figure, path)


def progress(series: list[list[float]], columns: list[str], path: Path, title: str, total: int | None,
             xlabel: str, goals: dict[str, int] | None = None) -> Path:
    """Records over time: `series` rows are [seconds, value per column]; a dashed line at `total`
    (every column's goal) or at each column's own goal in `goals`."""
    figure, axis = plt.subplots(figsize=(8, 5))
    for index, name in enumerate(columns, start=1):
        colour = SINK_COLOURS.get(name)
        axis.plot([row[0] for row in series], [row[index] for row in series], color=colour, label=name)
        if goals and name in goals:
            axis.axhline(goals[name], linestyle=":", color=colour, linewidth=0.8)
    if total:
        axis.axhline(total, linestyle="--", color="black", linewidth=0.8, label=f"source rows ({total:,})")
    axis.set(title=title, xlabel=xlabel, ylabel="records")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    return _save(figure, path)


def stage_rates(rates: dict[str, float | None], path: Path, title: str) -> Path:
    """One bar per stage (records/s), each labelled with its rate and its fraction of the first stage's."""
    figure, axis = plt.subplots(figsize=(8, 4.5))
    names = list(rates)
    values = [rates[name] or 0.0 for name in names]
    bars = axis.bar(names, values, color=[SINK_COLOURS.get(name, "tab:gray") for name in names])
    first = values[0] or None
    for bar, value in zip(bars, values, strict=True):
        label = f"{value:,.0f}/s" + (f"\n{value / first:.1%}" if first else "") if value else "not caught up"
        axis.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                      fontsize=8)
    axis.set(title=title, ylabel="records/s")
    axis.set_yscale("log" if first and min(v for v in values if v) * 20 < first else "linear")
    axis.grid(True, axis="y", alpha=0.3)
    return _save(figure, path)


def components(series: dict[str, list[list[float]]], path: Path, title: str) -> Path:
    """CPU (% of one core) and resident memory per component over the run."""
    figure, (cpu, rss) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for name, rows in sorted(series.items()):
        cpu.plot([r[0] for r in rows], [r[1] for r in rows], label=name, linewidth=0.8)
        rss.plot([r[0] for r in rows], [r[2] for r in rows], label=name, linewidth=0.8)
    cpu.set(title=title, ylabel="CPU (% of one core)")
    rss.set(xlabel="seconds since the scenario began", ylabel="resident memory (MiB)")
    for axis in (cpu, rss):
        axis.grid(True, alpha=0.3)
    cpu.legend(fontsize=7, ncol=2)
    return _save(figure, path)
