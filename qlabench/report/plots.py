"""Plots of a report (matplotlib, PNG), each readable without the table beside it.

Per phase:
  * ``speedup_<phase>.png``: speedup of the subject over each peer as grouped bars per seqlen
    pattern, one panel per preset, a dashed line at 1.0x; cases not compared are marked by status.
  * ``latency_<phase>.png``: median latency vs total tokens per backend, log-log, for the
    single-sequence patterns (`1xT`), one panel per preset.
  * ``heatmap_<phase>_vs_<peer>.png``: speedup over one peer, presets x patterns, colour on a log
    scale centred on 1.0x, each cell labelled.
Titles name the GPU, the phase and the subject; axes carry units. The accuracy section's plots
(``accuracy_<phase>.png``, ``drift_<phase>.png``) are drawn by accuracy_plots.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.ticker import FuncFormatter

from qlabench.report.accuracy_plots import PHASE_WORD, save_figure, write_accuracy_plots
from qlabench.report.tables import PHASE_TITLE, PhaseTable, Report


def _gpu(report: Report) -> str:
    return report.collected.env.get("gpu_name") or "unknown GPU"


def _panels(n: int, width: float, height: float):
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def plot_speedup_bars(report: Report, table: PhaseTable, path: Path) -> Path | None:
    """Grouped bars: subject speedup over each peer, per pattern, one panel per preset."""
    fig = speedup_figure(report, table)
    return None if fig is None else save_figure(fig, path)


def speedup_figure(report: Report, table: PhaseTable):
    """The figure of plot_speedup_bars (None without peers). The title and one legend for every
    panel sit in a band above the panels, so neither covers a panel's title or its bars."""
    if not table.peers:
        return None
    fig, axes = _panels(len(table.groups), 6.4, 3.8)
    colours = plt.get_cmap("tab10")
    for ax, (preset, lines) in zip(axes, table.groups):
        x = np.arange(len(lines))
        width = 0.8 / len(table.peers)
        for k, peer in enumerate(table.peers):
            vals = [line.speedups.get(peer) for line in lines]
            pos = x - 0.4 + width * (k + 0.5)
            heights = [v if v is not None else 0.0 for v in vals]
            bars = ax.bar(pos, heights, width, label=f"vs {peer}", color=colours(k % 10))
            for bar, v, line in zip(bars, vals, lines):
                if v is None:
                    why = line.status.get(table.subject) or "missing"
                    if why == "ok":
                        why = line.status.get(peer) or "missing"
                    ax.text(
                        bar.get_x() + bar.get_width() / 2,
                        0.05,
                        why,
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        color="0.3",
                    )
                else:
                    ax.text(
                        bar.get_x() + bar.get_width() / 2,
                        v,
                        f"{v:.2f}",
                        ha="center",
                        va="bottom",
                        fontsize=6.5,
                    )
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_xticks(x, [line.pattern for line in lines], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"speedup of {table.subject} (x, higher is better)")
        ax.set_xlabel("sequence-length pattern")
        model = lines[0].model if lines and lines[0].model and lines[0].model != preset else ""
        ax.set_title(f"{preset}" + (f" ({model})" if model else ""), fontsize=10)
        ax.set_ylim(0, max(1.2, ax.get_ylim()[1] * 1.12))  # room for the value labels over the bars
    height = fig.get_figheight()  # inches; the band above the panels: two title lines, one legend row
    fig.suptitle(
        f"{_gpu(report)}: {PHASE_WORD[table.phase]} speedup of {table.subject}\n"
        f"(peer median time / {table.subject} median time)",
        fontsize=11, y=1 - 0.06 / height, va="top",
    )
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.55 / height), ncol=len(labels),
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.9 / height))
    return fig


def plot_latency(report: Report, table: PhaseTable, path: Path) -> Path | None:
    """Median latency vs total tokens per backend (log-log), single-sequence patterns only."""
    fig = latency_figure(report, table)
    return None if fig is None else save_figure(fig, path)


def latency_figure(report: Report, table: PhaseTable):
    """The figure of plot_latency (None without two single-sequence lengths); the title in a band above
    the panels."""
    groups = []
    for preset, lines in table.groups:
        single = [ln for ln in lines if ln.n_seqs == 1 and ln.total_tokens]
        if len({ln.total_tokens for ln in single}) >= 2:
            groups.append((preset, sorted(single, key=lambda ln: ln.total_tokens)))
    if not groups:
        return None
    fig, axes = _panels(len(groups), 6.0, 4.0)
    markers = "osD^v<>"
    for ax, (preset, lines) in zip(axes, groups):
        for k, backend in enumerate(table.backends):
            pts = [(ln.total_tokens, ln.times[backend]) for ln in lines if ln.times.get(backend)]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker=markers[k % len(markers)], label=backend)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel("total tokens (one sequence)")
        ax.set_ylabel("median latency (ms)")
        ax.set_title(f"{preset} (h_qk={lines[0].h_qk}, h_v={lines[0].h_v})", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    height = fig.get_figheight()
    fig.suptitle(f"{_gpu(report)}: {PHASE_WORD[table.phase]} latency vs sequence length", fontsize=11,
                 y=1 - 0.06 / height, va="top")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / height))
    return fig


def plot_heatmap(report: Report, table: PhaseTable, peer: str, path: Path) -> Path | None:
    """Speedup over ``peer``: presets (rows) x patterns (columns), log colour scale centred on 1.0x."""
    presets = [p for p, _ in table.groups]
    patterns = list(dict.fromkeys(ln.pattern for _, lines in table.groups for ln in lines))
    if not presets or not patterns:
        return None
    grid = np.full((len(presets), len(patterns)), np.nan)
    words: dict[tuple[int, int], str] = {}
    for i, (_, lines) in enumerate(table.groups):
        for ln in lines:
            j = patterns.index(ln.pattern)
            v = ln.speedups.get(peer)
            if v is not None:
                grid[i, j] = v
            else:
                st = ln.status.get(table.subject)
                words[(i, j)] = st if st and st != "ok" else (ln.status.get(peer) or "missing")
    if np.all(np.isnan(grid)):
        return None
    logs = np.log2(grid)
    span = max(float(np.nanmax(np.abs(logs))), 0.1)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.0 * len(patterns) + 2.5), max(2.6, 0.55 * len(presets) + 1.8)))
    cmap = plt.get_cmap("RdBu").with_extremes(bad="0.85")
    im = ax.imshow(np.ma.masked_invalid(logs), cmap=cmap, norm=TwoSlopeNorm(0.0, -span, span), aspect="auto")
    for i in range(len(presets)):
        for j in range(len(patterns)):
            if not np.isnan(grid[i, j]):
                dark = abs(logs[i, j]) > 0.6 * span
                ax.text(
                    j,
                    i,
                    f"{grid[i, j]:.2f}x",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if dark else "black",
                )
            elif (i, j) in words:
                ax.text(j, i, words[(i, j)], ha="center", va="center", fontsize=7, color="0.25")
    ax.set_xticks(range(len(patterns)), patterns, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(presets)), presets, fontsize=8)
    ax.set_xlabel("sequence-length pattern")
    ax.set_ylabel("head preset")
    cbar = fig.colorbar(im, ax=ax)
    if span >= 1:
        ticks = [t for t in (-3, -2, -1, 0, 1, 2, 3) if abs(t) <= span]
        cbar.set_ticks(ticks, labels=[f"{2.0**t:g}x" for t in ticks])
    else:  # small spread: label a few fractional steps instead of powers of two
        ticks = list(np.linspace(-span, span, 5))
        cbar.set_ticks(ticks, labels=[f"{2.0**t:.2f}x" for t in ticks])
    cbar.set_label(f"speedup of {table.subject} over {peer} (x)")
    ax.set_title(
        f"{_gpu(report)}: {PHASE_WORD[table.phase]} speedup, {table.subject} vs {peer}", fontsize=10
    )
    fig.tight_layout()
    return save_figure(fig, path)


def safe_name(text: str) -> str:
    """``text`` as one file-name component: characters other than letters, digits, ``_``, ``+`` and ``-``
    become ``_`` (backend names come from results files: ``x/../../escaped`` must not leave the folder)."""
    return re.sub(r"[^A-Za-z0-9_+-]", "_", str(text)) or "_"


def write_plots(report: Report, outdir: str | Path, protect=()) -> dict[str, list[str]]:
    """Write every plot of ``report`` into ``outdir``; returns file names (relative) per phase, and the
    accuracy plots per ``accuracy_<phase>``.

    File names built from phase and backend names are sanitised (``safe_name``) and made unique, every
    file lands directly in ``outdir``, and a path in ``protect`` (the report's input files) is never
    written: ValueError instead.
    """
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    root = out.resolve()
    protected = {Path(x).resolve() for x in protect}
    used: set[str] = set()

    def target(*parts: str) -> Path:
        stem = "_".join(safe_name(x) for x in parts)
        name, k = f"{stem}.png", 1
        while name in used:
            k += 1
            name = f"{stem}_{k}.png"
        used.add(name)
        path = out / name
        if path.resolve().parent != root:
            raise ValueError(f"plot file {name!r} would land outside {str(out)!r}")
        if path.resolve() in protected:
            raise ValueError(f"plot file {str(path)!r} is one of the report's inputs; refusing to overwrite it")
        return path

    made: dict[str, list[str]] = {}
    for table in report.tables:
        files = [
            plot_speedup_bars(report, table, target("speedup", table.phase)),
            plot_latency(report, table, target("latency", table.phase)),
        ]
        files += [
            plot_heatmap(report, table, p, target("heatmap", table.phase, "vs", p)) for p in table.peers
        ]
        made[table.phase] = [f.name for f in files if f is not None]
    made.update(write_accuracy_plots(_gpu(report), report.accuracy, target))  # keys accuracy_<phase>
    return made


__all__ = ["PHASE_TITLE", "plot_heatmap", "plot_latency", "plot_speedup_bars", "safe_name", "write_plots"]
