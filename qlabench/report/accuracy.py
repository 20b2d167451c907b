"""Accuracy section of a report: how far each backend's outputs are from the float64 reference.

Speed tables hide a kernel that is fast and wrong; this section shows where each backend breaks.
Every ``ok`` or ``incorrect`` row carries ``errors``, the relative L2 error of each checked tensor,

    err(x) = ||x - x_ref||_2 / ||x_ref||_2      (qlabench/check.py; null when x held NaN/Inf),

and rows of newer files ``nonfinite`` (tensor -> number of NaN/Inf elements, where any). Per phase:

- **per backend and tensor** (o, final_state, dq, dk, dv, dg, dbeta, dh0): the cases checked, the
  median and the worst error with the case named, how many cases are over the tolerance (the run's
  ``--tolerance``, 0.02 by default) and how many were non-finite. A non-finite error ranks above every
  finite one, in the worst and in the median;
- **every row over tolerance or non-finite**, with its offending tensors;
- **drift with sequence length**: for one-sequence rows (no padding tail) of one preset and input
  recipe at three or more lengths reaching 64k tokens (long-sequence drift, not the 2k-32k speed
  patterns), the error of o and of the final state at each length T.

The plots of the section (error vs case, drift vs T) are in ``accuracy_plots.py``.
"""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from qlabench.recipe import DEFAULT_GATE_PROFILE, inputs_label
from qlabench.report.layout import MISSING, PHASE_ORDER, md_row, md_rule, phase_heading, text_table
from qlabench.results import case_key, case_name

TITLE = "Accuracy (relative L2 against the float64 reference)"
TENSORS = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0")
DRIFT_TENSORS = ("o", "final_state")
DRIFT_MIN_LENGTHS = 3
DRIFT_MIN_LONGEST = 65536  # a drift group must reach this many tokens
# check.DEFAULT_TOLERANCE, for files whose run block lacks one (not imported: check.py pulls in torch)
DEFAULT_TOLERANCE = 0.02
NONFINITE = "non-finite"
CHECKED_STATUSES = ("ok", "incorrect")

DESCRIPTION = (
    "Relative L2 error ||x - ref|| / ||ref|| of each output against the float64 reference, over the rows "
    "that were checked (status ok or incorrect). Per backend and tensor: the cases checked, the median "
    "and the worst error (its case named: preset, pattern, [gate profile, beta profile and h0 scale when "
    "not the default]), the cases over the tolerance and the cases whose tensor held NaN/Inf "
    "(non-finite; ranked worst). An incorrect row keeps its time in the speed tables, marked !, but takes "
    "no part in speedups or geomeans."
)


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def as_error(x: Any) -> float:
    """A stored error as a float: null, NaN and Inf (the tensor held NaN/Inf, or was missing) -> inf."""
    if _missing(x):
        return math.inf
    x = float(x)
    return x if math.isfinite(x) else math.inf


def fmt_err(x: float | None) -> str:
    if x is None:
        return MISSING
    return NONFINITE if not math.isfinite(x) else f"{x:.2e}"


def row_inputs(row) -> str:
    """A row's input recipe in words (recipe.inputs_label); older rows lack beta_profile / h0_scale."""
    _, _, _, _, gate, _, beta, h0 = case_key(row)
    return inputs_label(gate or DEFAULT_GATE_PROFILE, beta, h0)


@dataclass
class CaseErrors:
    """One checked row: its case, backend, errors (tensor -> rel L2; inf = non-finite), NaN/Inf counts."""

    case: str
    backend: str
    errors: dict[str, float]
    nonfinite: dict[str, int]
    tolerance: float
    preset: str
    inputs: str
    total_tokens: int | None
    one_sequence: bool  # one sequence, no padding tail: a drift point

    def over(self, tensor: str) -> bool:
        e = self.errors[tensor]
        return not (math.isfinite(e) and e <= self.tolerance)

    @property
    def bad(self) -> list[str]:
        return [t for t in self.errors if self.over(t)]

    def describe(self, tensor: str) -> str:
        e = self.errors[tensor]
        if math.isfinite(e):
            return f"{tensor} {fmt_err(e)}"
        n = self.nonfinite.get(tensor)
        return f"{tensor} {NONFINITE}" + (f" ({n} NaN/Inf elements)" if n else "")


@dataclass
class TensorStats:
    """One backend's error on one tensor over the cases checked."""

    backend: str
    tensor: str
    n: int
    median: float
    worst: float
    worst_case: str
    n_over: int
    n_nonfinite: int


@dataclass
class DriftGroup:
    """One-sequence rows of one preset and input recipe at several lengths."""

    preset: str
    inputs: str
    lengths: list[int]
    errors: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)  # (backend, tensor) -> T -> err


@dataclass
class PhaseAccuracy:
    phase: str
    tolerances: list[float]  # the distinct tolerances of the rows (one, unless files differ)
    cases: list[str]  # case names in run order
    rows: list[CaseErrors]
    stats: list[TensorStats]
    drift: list[DriftGroup]

    @property
    def tolerance(self) -> float:
        return max(self.tolerances)

    @property
    def failures(self) -> list[CaseErrors]:
        return [r for r in self.rows if r.bad]

    @property
    def drift_lengths(self) -> list[int]:
        return sorted({t for g in self.drift for t in g.lengths})


def _tensor_order(names) -> list[str]:
    return [t for t in TENSORS if t in names] + sorted(set(names) - set(TENSORS))


def _stats(backend: str, tensor: str, rows: list[CaseErrors]) -> TensorStats | None:
    pts = [(r.errors[tensor], r.case, r.over(tensor)) for r in rows if tensor in r.errors]
    if not pts:
        return None
    errs = [e for e, _, _ in pts]
    worst = max(range(len(pts)), key=lambda i: (errs[i], -i))  # the first of equal worst
    return TensorStats(backend, tensor, len(pts), statistics.median(errs), errs[worst], pts[worst][1],
                       sum(o for _, _, o in pts), sum(not math.isfinite(e) for e in errs))


def _drift(rows: list[CaseErrors], backends: list[str]) -> list[DriftGroup]:
    groups: dict[tuple[str, str], DriftGroup] = {}
    for r in rows:
        if not r.one_sequence or not r.total_tokens:
            continue
        g = groups.setdefault((r.preset, r.inputs), DriftGroup(r.preset, r.inputs, []))
        if r.total_tokens not in g.lengths:
            g.lengths.append(r.total_tokens)
        for t in DRIFT_TENSORS:
            if t in r.errors:
                g.errors.setdefault((r.backend, t), {})[r.total_tokens] = r.errors[t]
    out = []
    for g in groups.values():
        if len(g.lengths) >= DRIFT_MIN_LENGTHS and max(g.lengths) >= DRIFT_MIN_LONGEST:
            g.lengths.sort()
            g.errors = {(b, t): g.errors[(b, t)] for b in backends for t in DRIFT_TENSORS if (b, t) in g.errors}
            out.append(g)
    return out


def build_accuracy(df: pd.DataFrame, phases: list[str], backends: list[str],
                   tolerances: dict[str, float] | None = None) -> list[PhaseAccuracy]:
    """One section per phase of ``phases`` with any checked row of ``backends``; [] when none has.

    ``df``: the report's frame (files merged, latest row per key); ``tolerances``: the run's tolerance per
    ``source`` (file label), DEFAULT_TOLERANCE for a file without one.
    """
    if df.empty or "errors" not in df.columns:
        return []
    tolerances = tolerances or {}
    out = []
    for phase in (p for p in PHASE_ORDER if p in phases):
        sub = df[(df["phase"] == phase) & df["status"].isin(CHECKED_STATUSES) & df["backend"].isin(backends)]
        rows: list[CaseErrors] = []
        for _, row in sub.iterrows():
            errs = row.get("errors")
            if not isinstance(errs, dict) or not errs:
                continue
            nonfinite = row.get("nonfinite") if isinstance(row.get("nonfinite"), dict) else {}
            pad = row.get("pad_tokens")
            n_seqs, total = row.get("n_seqs"), row.get("total_tokens")
            rows.append(CaseErrors(
                case=case_name(row), backend=str(row["backend"]),
                errors={t: as_error(errs[t]) for t in _tensor_order(errs)},
                nonfinite={str(k): int(v) for k, v in nonfinite.items() if not _missing(v)},
                tolerance=float(tolerances.get(row.get("source"), DEFAULT_TOLERANCE)),
                preset=str(row.get("preset")), inputs=row_inputs(row),
                total_tokens=None if _missing(total) else int(total),
                one_sequence=not _missing(n_seqs) and int(n_seqs) == 1 and (_missing(pad) or int(pad) == 0),
            ))
        if not rows:
            continue
        present = [b for b in backends if any(r.backend == b for r in rows)]
        tensors = _tensor_order({t for r in rows for t in r.errors})
        stats = [s for b in present for t in tensors
                 if (s := _stats(b, t, [r for r in rows if r.backend == b])) is not None]
        out.append(PhaseAccuracy(phase, sorted({r.tolerance for r in rows}),
                                 list(dict.fromkeys(r.case for r in rows)), rows, stats, _drift(rows, present)))
    return out


# ---- rendering ---------------------------------------------------------------------------------------

STATS_COLUMNS = ["Backend", "Tensor", "Cases", "Median", "Worst", "Worst case", "> tol", "Non-finite"]
_STATS_LEFT = {0, 1, 5}


def stats_cells(s: TensorStats) -> list[str]:
    return [s.backend, s.tensor, str(s.n), fmt_err(s.median), fmt_err(s.worst), s.worst_case, str(s.n_over),
            str(s.n_nonfinite)]


def tolerance_words(sec: PhaseAccuracy) -> str:
    tol = ", ".join(f"{t:g}" for t in sec.tolerances)
    return f"tolerance {tol}" + (" (the files differ)" if len(sec.tolerances) > 1 else "")


def failures_heading(sec: PhaseAccuracy) -> str:
    n = len(sec.failures)
    return f"Over tolerance or non-finite: {n} of {len(sec.rows)} checked rows" + (":" if n else "")


def failure_cells(r: CaseErrors) -> list[str]:
    return [r.case, r.backend, ", ".join(r.describe(t) for t in r.bad)]


def drift_heading(sec: PhaseAccuracy) -> str:
    return ("Drift with sequence length: one sequence of T tokens, relative L2 of o and of the final state "
            "at each T")


def drift_columns(sec: PhaseAccuracy) -> list[str]:
    return ["Preset", "Inputs", "Backend", "Tensor"] + [str(t) for t in sec.drift_lengths]


def drift_rows(sec: PhaseAccuracy) -> list[list[str]]:
    out = []
    for g in sec.drift:
        for (b, t), by_len in g.errors.items():
            out.append([g.preset, g.inputs, b, t] + [fmt_err(by_len.get(n)) for n in sec.drift_lengths])
    return out


def text_lines(sections: list[PhaseAccuracy]) -> list[str]:
    if not sections:
        return []
    import textwrap

    out = [f">>> {TITLE.upper()}"] + textwrap.wrap(DESCRIPTION, 100) + [""]
    for sec in sections:
        out.append(f"-- {phase_heading(sec.phase)}, {tolerance_words(sec)}")
        out += text_table(STATS_COLUMNS, [stats_cells(s) for s in sec.stats], _STATS_LEFT)
        out += ["", failures_heading(sec)]
        out += text_table(["Case", "Backend", "Tensors"], [failure_cells(r) for r in sec.failures], {0, 1, 2})[2:]
        if sec.drift:
            out += ["", drift_heading(sec)]
            out += text_table(drift_columns(sec), drift_rows(sec), {0, 1, 2, 3})
        out.append("")
    return out


def md_lines(sections: list[PhaseAccuracy], plots: dict[str, list[str]] | None = None) -> list[str]:
    """Markdown; ``plots`` maps ``accuracy_<phase>`` to image paths to embed in that phase's part."""
    if not sections:
        return []
    out = [f"## {TITLE}", "", DESCRIPTION, ""]
    for sec in sections:
        out += [f"### {phase_heading(sec.phase)}", "", f"{tolerance_words(sec).capitalize()}.", ""]
        out += [md_row(STATS_COLUMNS), md_rule(len(STATS_COLUMNS), 2)]
        out += [md_row(stats_cells(s)) for s in sec.stats]
        out += ["", failures_heading(sec), ""]
        if sec.failures:
            out += [md_row(["Case", "Backend", "Tensors"]), md_rule(3, 3)]
            out += [md_row(failure_cells(r)) for r in sec.failures] + [""]
        if sec.drift:
            cols = drift_columns(sec)
            out += [f"{drift_heading(sec)}:", "", md_row(cols), md_rule(len(cols), 4)]
            out += [md_row(c) for c in drift_rows(sec)] + [""]
        for img in (plots or {}).get(f"accuracy_{sec.phase}", []):
            out += [f"![{img}]({img})", ""]
    return out


def html_lines(sections: list[PhaseAccuracy]) -> list[str]:
    if not sections:
        return []
    e = html.escape

    def table(cols: list[str], body: list[list[str]], left: set[int]) -> str:
        head = "".join(f"<th class='{'l' if i in left else ''}'>{e(c)}</th>" for i, c in enumerate(cols))
        rows = []
        for cells in body:
            tds = []
            for i, c in enumerate(cells):
                cls = "l" if i in left else ("bad" if c == NONFINITE else "")
                tds.append(f"<td class='{cls}'>{e(c)}</td>")
            rows.append("<tr>" + "".join(tds) + "</tr>")
        return f"<table><tr>{head}</tr>" + "".join(rows) + "</table>"

    out = [f"<h2>{e(TITLE)}</h2>", f"<p>{e(DESCRIPTION)}</p>"]
    for sec in sections:
        out.append(f"<h3>{e(phase_heading(sec.phase))}</h3><p>{e(tolerance_words(sec).capitalize())}.</p>")
        out.append(table(STATS_COLUMNS, [stats_cells(s) for s in sec.stats], _STATS_LEFT))
        out.append(f"<p>{e(failures_heading(sec))}</p>")
        if sec.failures:
            out.append(table(["Case", "Backend", "Tensors"], [failure_cells(r) for r in sec.failures], {0, 1, 2}))
        if sec.drift:
            out.append(f"<p>{e(drift_heading(sec))}:</p>")
            out.append(table(drift_columns(sec), drift_rows(sec), {0, 1, 2, 3}))
    return out
