"""Plots of the accuracy section (matplotlib, PNG), each readable without the table beside it.

Per phase with checked rows:
  * ``accuracy_<phase>.png``: relative L2 error against the float64 reference vs case (the cases in run
    order on x), one panel per tensor, one marker and colour per backend, log scale, a dashed line at
    the tolerance; a non-finite error is an x in the backend's colour in a band above the finite ones.
Per phase with drift rows (accuracy.DriftGroup: one sequence of three or more lengths up to 64k+):
  * ``drift_<phase>.png``: error of o and of the final state vs T (log-log), one line per backend and
    (preset, inputs), the same tolerance line and non-finite band.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from qlabench.report.accuracy import PhaseAccuracy

DPI = 110  # every report plot (plots.py saves through save_figure)
PHASE_WORD = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward+backward"}


def save_figure(fig, path: Path) -> Path:
    """Writes ``fig`` to ``path`` at the reports' DPI and closes it."""
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
_MARKERS = "os^Dv<>P"
_STYLES = ("-", "--", ":", "-.")
MAX_CASE_LABELS = 80  # more cases than this: label every k-th on the x axis


def _band(values: list[float], tolerance: float) -> tuple[float, float, float]:
    """(y of the non-finite band, bottom, top) of a log axis holding ``values`` and the tolerance."""
    finite = [v for v in values if math.isfinite(v) and v > 0] + [tolerance]
    lo, hi = min(finite), max(finite)
    band = hi * 10
    return band, lo / 3, band * 3


def _nonfinite_band(ax, band: float) -> None:
    ax.axhline(band / 3.2, color="0.6", linewidth=0.6, linestyle=":")
    ax.text(1.0, band, " non-finite", transform=ax.get_yaxis_transform(), va="center", ha="left",
            fontsize=7, color="#b00")


def _legend(fig, backends: list[str], tolerance: float, colours, top: float) -> None:
    """One legend for the figure, above the panels: a marker per backend, the non-finite x, the tolerance."""
    handles = [Line2D([], [], linestyle="", marker=_MARKERS[k % len(_MARKERS)], color=colours(k % 10), label=b)
               for k, b in enumerate(backends)]
    handles += [Line2D([], [], linestyle="", marker="x", color="0.2", markeredgewidth=1.6,
                       label="non-finite (NaN/Inf; backend's colour)"),
                Line2D([], [], color="#b00", linestyle="--", label=f"tolerance {tolerance:g}")]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, top), ncol=len(handles), fontsize=8,
               frameon=False)


def plot_errors(gpu: str, sec: PhaseAccuracy, path: Path) -> Path | None:
    """Error vs case, one panel per tensor (shared x: the cases in run order)."""
    tensors = list(dict.fromkeys(s.tensor for s in sec.stats))
    backends = list(dict.fromkeys(s.backend for s in sec.stats))
    if not tensors:
        return None
    index = {c: i for i, c in enumerate(sec.cases)}
    n = len(sec.cases)
    width = min(40.0, max(9.0, 0.14 * n + 3.5))
    fig, axes = plt.subplots(len(tensors), 1, figsize=(width, 1.9 * len(tensors) + 2.6), sharex=True,
                             squeeze=False)
    colours = plt.get_cmap("tab10")
    for ax, tensor in zip(axes[:, 0], tensors):
        vals = [r.errors[tensor] for r in sec.rows if tensor in r.errors]
        band, bottom, top = _band(vals, sec.tolerance)
        for k, backend in enumerate(backends):
            pts = [(index[r.case], r.errors[tensor]) for r in sec.rows if r.backend == backend and tensor in r.errors]
            ok = [(x, y) for x, y in pts if math.isfinite(y) and y > 0]
            bad = [x for x, y in pts if not math.isfinite(y)]
            offset = (k - (len(backends) - 1) / 2) * 0.12  # side by side within a case
            if ok:
                xs, ys = zip(*ok)
                ax.scatter([x + offset for x in xs], ys, s=14, marker=_MARKERS[k % len(_MARKERS)],
                           color=colours(k % 10), label=backend, zorder=3)
            if bad:
                ax.scatter([x + offset for x in bad], [band] * len(bad), s=40, marker="x", color=colours(k % 10),
                           linewidths=1.6, zorder=4)
        ax.axhline(sec.tolerance, color="#b00", linestyle="--", linewidth=1)
        _nonfinite_band(ax, band)
        ax.set_yscale("log")
        ax.set_ylim(bottom, top)
        ax.set_ylabel(f"{tensor}\nrel. L2 error", fontsize=8)
        ax.grid(True, axis="y", which="major", alpha=0.3)
    ax = axes[-1, 0]
    step = max(1, math.ceil(n / MAX_CASE_LABELS))
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks, [sec.cases[i] for i in ticks], rotation=90, fontsize=6)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_xlabel("case (preset, pattern, [input recipe]) in run order"
                  + (f", every {step}th labelled" if step > 1 else ""))
    height = fig.get_figheight()
    fig.suptitle(f"{gpu}: {PHASE_WORD[sec.phase]} error against the float64 reference per case "
                 f"(relative L2, log scale; lower is better)", fontsize=11, y=1 - 0.15 / height)
    _legend(fig, backends, sec.tolerance, colours, 1 - 0.45 / height)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / height))
    return save_figure(fig, path)


def plot_drift(gpu: str, sec: PhaseAccuracy, path: Path) -> Path | None:
    """Error of o and of the final state vs sequence length T, per backend and (preset, inputs)."""
    if not sec.drift:
        return None
    tensors = [t for t in ("o", "final_state") if any(t == tt for g in sec.drift for _, tt in g.errors)]
    backends = list(dict.fromkeys(b for g in sec.drift for b, _ in g.errors))
    fig, axes = plt.subplots(1, len(tensors), figsize=(6.4 * len(tensors), 4.4), squeeze=False)
    colours = plt.get_cmap("tab10")
    for ax, tensor in zip(axes[0], tensors):
        vals = [e for g in sec.drift for (_, t), by in g.errors.items() if t == tensor for e in by.values()]
        band, bottom, top = _band(vals, sec.tolerance)
        for gi, g in enumerate(sec.drift):
            for (backend, t), by in g.errors.items():
                if t != tensor:
                    continue
                k = backends.index(backend)
                lengths = sorted(by)
                ys = [by[n] if math.isfinite(by[n]) else band for n in lengths]
                ax.plot(lengths, ys, linestyle=_STYLES[gi % len(_STYLES)], marker=_MARKERS[k % len(_MARKERS)],
                        markersize=4, color=colours(k % 10), label=f"{backend} {g.preset} [{g.inputs}]")
                bad = [n for n in lengths if not math.isfinite(by[n])]
                if bad:
                    ax.scatter(bad, [band] * len(bad), s=40, marker="x", color="#b00", zorder=4)
        ax.axhline(sec.tolerance, color="#b00", linestyle="--", linewidth=1, label=f"tolerance {sec.tolerance:g}")
        _nonfinite_band(ax, band)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(bottom, top)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1024:g}k" if v >= 1024 else f"{v:g}"))
        ax.set_xlabel("tokens T (one sequence)")
        ax.set_ylabel("relative L2 error vs float64")
        ax.set_title(tensor, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper left")
    fig.suptitle(f"{gpu}: {PHASE_WORD[sec.phase]} error drift with sequence length (lower is better)",
                 fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path)


def write_accuracy_plots(gpu: str, sections: list[PhaseAccuracy],
                         target: Callable[..., Path]) -> dict[str, list[str]]:
    """Both plots per section; ``target(*parts)`` gives each file's path (plots.write_plots' naming).
    Returns file names per ``accuracy_<phase>`` key (the key accuracy.md_lines embeds)."""
    made: dict[str, list[str]] = {}
    for sec in sections:
        files = [plot_errors(gpu, sec, target("accuracy", sec.phase)),
                 plot_drift(gpu, sec, target("drift", sec.phase)) if sec.drift else None]
        made[f"accuracy_{sec.phase}"] = [f.name for f in files if f is not None]
    return made
