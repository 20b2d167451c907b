"""The per-kernel split section: each backend's time per kernel, side by side, for every case whose
rows carry a ``kernel_split`` (``qlabench run --kernel-split``: {kernel name: us per call}).

One table per case: a row per kernel name (the union over the backends, largest first; past
``MAX_KERNELS`` the rest are summed into one "other" row), a column per backend, then the sum of the
split and the row's timed median for comparison (the split is profiled outside the timed calls, one
call at a time, so the two differ by launch gaps and graph replay).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd

from qlabench.report.layout import MISSING, PHASE_ORDER, html_table_body, md_table, phase_heading, text_table
from qlabench.results import case_name

TITLE = "Per-kernel split (us per call)"
DESCRIPTION = ("Device time of each kernel per call (`run --kernel-split`: a few calls under torch.profiler, "
               "summed per kernel name), backends side by side; `sum` is the split's total, `median` the "
               "row's timed median. A kernel a backend did not launch is `-`.")
MAX_KERNELS = 12
MAX_NAME = 60


@dataclass
class SplitTable:
    phase: str
    case: str  # results.case_name: `hk16_hv16 1x32768 [bench]`
    backends: list[str]
    kernels: list[str]  # row labels, largest first; may end with the "other" row
    us: dict[tuple[str, str], float] = field(default_factory=dict)  # (kernel, backend) -> us per call
    sums: dict[str, float] = field(default_factory=dict)  # backend -> sum of its split
    medians: dict[str, float | None] = field(default_factory=dict)  # backend -> timed median, us


def _split(value) -> dict | None:
    return value if isinstance(value, dict) and value else None


def _median_us(row) -> float | None:
    ms = row.get("median_ms")
    return None if ms is None or pd.isna(ms) else float(ms) * 1e3


def build_kernel_split(df: pd.DataFrame, phases: list[str], backends: list[str]) -> list[SplitTable]:
    """One SplitTable per case (phases in ``phases`` order, then the cases' order in ``df``) that has a
    kernel split from at least one of ``backends``; [] when none has."""
    if "kernel_split" not in df.columns or df.empty:
        return []
    has = df["kernel_split"].apply(lambda v: _split(v) is not None) & df["backend"].astype(str).isin(backends)
    sub = df[has]
    tables = []
    for phase in [p for p in PHASE_ORDER if p in phases]:
        rows = sub[sub["phase"] == phase]
        cases: dict[str, list] = {}
        for _, row in rows.iterrows():
            cases.setdefault(case_name(row), []).append(row)
        for name, case_rows in cases.items():
            by_backend = {str(r["backend"]): r for r in case_rows}
            cols = [b for b in backends if b in by_backend]
            splits = {b: _split(by_backend[b]["kernel_split"]) for b in cols}
            largest: dict[str, float] = {}
            for s in splits.values():
                for k, us in s.items():
                    largest[k] = max(largest.get(k, 0.0), float(us))
            order = sorted(largest, key=lambda k: (-largest[k], k))
            shown, rest = order[:MAX_KERNELS], order[MAX_KERNELS:]
            t = SplitTable(phase, name, cols, list(shown))
            for b, s in splits.items():
                for k in shown:
                    if k in s:
                        t.us[(k, b)] = float(s[k])
                t.sums[b] = float(sum(s.values()))
                t.medians[b] = _median_us(by_backend[b])
            if rest:
                other = f"(other {len(rest)} kernels)"
                t.kernels.append(other)
                for b, s in splits.items():
                    left = [float(s[k]) for k in rest if k in s]
                    if left:
                        t.us[(other, b)] = sum(left)
            tables.append(t)
    return tables


def _name(kernel: str) -> str:
    return kernel if len(kernel) <= MAX_NAME else kernel[: MAX_NAME - 3] + "..."


def _us(x: float | None) -> str:
    return MISSING if x is None else f"{x:.1f}"


def columns(t: SplitTable) -> list[str]:
    return ["kernel", *t.backends]


def body(t: SplitTable) -> list[list[str]]:
    rows = [[_name(k)] + [_us(t.us.get((k, b))) for b in t.backends] for k in t.kernels]
    rows.append(["sum"] + [_us(t.sums.get(b)) for b in t.backends])
    rows.append(["median"] + [_us(t.medians.get(b)) for b in t.backends])
    return rows


def text_lines(tables: list[SplitTable]) -> list[str]:
    if not tables:
        return []
    out = [f">>> {TITLE.upper()}", DESCRIPTION.replace("`", ""), ""]
    for t in tables:
        out += [f"{t.phase} {t.case}"] + text_table(columns(t), body(t), {0}) + [""]
    return out


def md_lines(tables: list[SplitTable]) -> list[str]:
    if not tables:
        return []
    out = [f"## {TITLE}", "", DESCRIPTION, ""]
    for t in tables:
        out += [f"### {phase_heading(t.phase)}: {t.case}", ""] + md_table(columns(t), body(t), 1) + [""]
    return out


def html_lines(tables: list[SplitTable]) -> list[str]:
    if not tables:
        return []
    e = html.escape
    out = [f"<h2>{e(TITLE)}</h2>", f"<p>{e(DESCRIPTION.replace('`', ''))}</p>"]
    for t in tables:
        out.append(f"<h3>{e(phase_heading(t.phase))}: {e(t.case)}</h3><table><tr>")
        out += html_table_body(columns(t), body(t), 1)
        out.append("</table>")
    return out
