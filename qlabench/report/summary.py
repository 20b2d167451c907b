"""Summary statistics of speedup tables: geometric mean with a bootstrap 95% interval, worst and best.

Speedups are ratios, so they are averaged in log space (the geometric mean): a 2x win and a 2x loss
cancel to 1.0x. The interval is a percentile bootstrap over cases (resample the cases with
replacement, take the geomean of each resample, read the 2.5th and 97.5th percentiles), seeded so a
report is reproducible. It says how much the headline number depends on which cases were picked, not
how noisy each timing was.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive values; raises ValueError on an empty input or a value <= 0."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("geomean of no values")
    bad = [v for v in vals if not (v > 0 and math.isfinite(v))]
    if bad:
        raise ValueError(f"geomean needs positive finite values, got {bad[0]!r}")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def bootstrap_ci(
    values: Sequence[float],
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of the geometric mean; None for fewer than two values."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    vals = np.asarray([float(v) for v in values], dtype=float)
    if len(vals) < 2:
        return None
    if np.any(~(vals > 0)) or not np.all(np.isfinite(vals)):
        raise ValueError(f"bootstrap needs positive finite values, got {vals.tolist()!r}")
    logs = np.log(vals)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(logs), size=(resamples, len(logs)))
    means = logs[idx].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(math.exp(lo)), float(math.exp(hi))


@dataclass(frozen=True)
class SpeedupSummary:
    """Subject-over-peer speedup over a group of cases.

    Attributes:
        group: a preset name, or `overall`.
        peer: the peer backend.
        n: cases with an ok time on both sides.
        n_skipped: cases of the group left out (a side missing or not ok).
        geomean: geometric-mean speedup (None when n == 0).
        ci_low, ci_high: bootstrap 95% interval of the geomean (None when n < 2).
        worst, best: the smallest and largest speedup, with the case label each came from.
    """

    group: str
    peer: str
    n: int
    n_skipped: int
    geomean: float | None
    ci_low: float | None
    ci_high: float | None
    worst: float | None
    worst_case: str | None
    best: float | None
    best_case: str | None


def summarise(group: str, peer: str, cases: Sequence[tuple[str, float | None]]) -> SpeedupSummary:
    """Summarise ``(case label, speedup or None)`` pairs; None marks a case not compared."""
    pairs = [(c, s) for c, s in cases if s is not None]
    skipped = len(cases) - len(pairs)
    if not pairs:
        return SpeedupSummary(group, peer, 0, skipped, None, None, None, None, None, None, None)
    vals = [s for _, s in pairs]
    ci = bootstrap_ci(vals)
    worst = min(pairs, key=lambda p: p[1])
    best = max(pairs, key=lambda p: p[1])
    return SpeedupSummary(
        group,
        peer,
        len(pairs),
        skipped,
        geomean(vals),
        ci[0] if ci else None,
        ci[1] if ci else None,
        worst[1],
        worst[0],
        best[1],
        best[0],
    )


def summarise_table(table) -> list[SpeedupSummary]:
    """Per preset and overall, for each peer of a :class:`qlabench.report.tables.PhaseTable`."""
    out: list[SpeedupSummary] = []
    for peer in table.peers:
        everything: list[tuple[str, float | None]] = []
        for preset, lines in table.groups:
            cases = [(f"{preset} {line.pattern}", line.speedups.get(peer)) for line in lines]
            everything += cases
            if len(table.groups) > 1:
                out.append(summarise(preset, peer, cases))
        out.append(summarise("overall", peer, everything))
    return out
