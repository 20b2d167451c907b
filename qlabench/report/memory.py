"""The peak-memory section: each backend's peak extra device memory per case, the subject's ratio to each
peer, and per phase and peer the largest ratio and the cases over ``RATIO_LIMIT``.

A row's ``peak_mem_mb`` is what one call held at its peak beyond what was allocated before it (MiB,
timing.peak_memory_mb): for ``bwd`` the backward alone (the forward's saved tensors are in the base), for
``fwdbwd`` the whole training step. Rows that ran (ok or incorrect) carry it; a backend without a value for
a case shows ``-`` and takes no part in that case's ratio.

One table per phase: a row per case (the results' order), a column per backend (MiB), then ``<subject> /
<peer>`` per peer. Under it, per peer: the cases compared, the largest ratio and its case, and how many
cases are over RATIO_LIMIT (1.25x: the bar issue #16 sets the backward against upstream flash-qla).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd

from qlabench.report.layout import MISSING, PHASE_ORDER, html_table_body, md_table, phase_heading, text_table
from qlabench.results import case_name

TITLE = "Peak memory (MiB)"
RATIO_LIMIT = 1.25
DESCRIPTION = ("Extra device memory one call holds at its peak, beyond what was allocated before it (MiB; "
               "`bwd`: the backward alone, the forward's saved tensors excluded; `fwdbwd`: the training step), "
               f"per backend, and the subject's ratio to each peer (over {RATIO_LIMIT:.2f}x is counted below "
               "each table).")


@dataclass
class MemoryTable:
    phase: str
    subject: str
    peers: list[str]  # peers with a value in at least one case
    cases: list[str] = field(default_factory=list)  # results.case_name, the results' order
    mib: dict[tuple[str, str], float] = field(default_factory=dict)  # (case, backend) -> MiB

    @property
    def backends(self) -> list[str]:
        return [self.subject, *self.peers]

    def ratio(self, case: str, peer: str) -> float | None:
        a, b = self.mib.get((case, self.subject)), self.mib.get((case, peer))
        return a / b if a is not None and b else None

    def summary(self, peer: str) -> tuple[int, float | None, str | None, int]:
        """(cases compared, largest ratio, its case, cases over RATIO_LIMIT) against ``peer``."""
        ratios = [(r, c) for c in self.cases if (r := self.ratio(c, peer)) is not None]
        if not ratios:
            return 0, None, None, 0
        worst, case = max(ratios)
        return len(ratios), worst, case, sum(r > RATIO_LIMIT for r, _ in ratios)


def _mib(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if pd.isna(x) or x < 0 else x


def build_memory(df: pd.DataFrame, phases: list[str], subject: str, peers: list[str]) -> list[MemoryTable]:
    """One MemoryTable per phase (``phases`` in PHASE_ORDER) where the subject has a peak in some case;
    [] when no row has one."""
    if "peak_mem_mb" not in df.columns or df.empty:
        return []
    tables = []
    for phase in [p for p in PHASE_ORDER if p in phases]:
        rows = df[(df["phase"] == phase) & df["status"].isin(["ok", "incorrect"])]
        t = MemoryTable(phase, subject, [])
        for _, row in rows.iterrows():
            value = _mib(row.get("peak_mem_mb"))
            backend = str(row["backend"])
            if value is None or backend not in (subject, *peers):
                continue
            name = case_name(row)
            if name not in t.cases:
                t.cases.append(name)
            t.mib[(name, backend)] = value
        t.cases = [c for c in t.cases if (c, subject) in t.mib]
        t.peers = [p for p in peers if any((c, p) in t.mib for c in t.cases)]
        if t.cases:
            tables.append(t)
    return tables


def _x(r: float | None) -> str:
    return MISSING if r is None else f"{r:.2f}x"


def columns(t: MemoryTable) -> list[str]:
    return ["case", *t.backends, *(f"{t.subject} / {p}" for p in t.peers)]


def body(t: MemoryTable) -> list[list[str]]:
    out = []
    for c in t.cases:
        mib = [MISSING if (c, b) not in t.mib else f"{t.mib[(c, b)]:.0f}" for b in t.backends]
        out.append([c, *mib, *(_x(t.ratio(c, p)) for p in t.peers)])
    return out


def summary_lines(t: MemoryTable) -> list[str]:
    out = []
    for p in t.peers:
        n, worst, case, over = t.summary(p)
        if n:
            out.append(f"{t.subject} vs {p}: {n} cases, largest {_x(worst)} ({case}), "
                       f"{over} over {RATIO_LIMIT:.2f}x")
    return out


def text_lines(tables: list[MemoryTable]) -> list[str]:
    if not tables:
        return []
    out = [f">>> {TITLE.upper()}", DESCRIPTION.replace("`", ""), ""]
    for t in tables:
        out += [t.phase] + text_table(columns(t), body(t), {0}) + summary_lines(t) + [""]
    return out


def md_lines(tables: list[MemoryTable]) -> list[str]:
    if not tables:
        return []
    out = [f"## {TITLE}", "", DESCRIPTION, ""]
    for t in tables:
        out += [f"### {phase_heading(t.phase)}", ""] + md_table(columns(t), body(t), 1) + [""]
        out += [f"- {s}" for s in summary_lines(t)] + [""]
    return out


def html_lines(tables: list[MemoryTable]) -> list[str]:
    if not tables:
        return []
    e = html.escape
    out = [f"<h2>{e(TITLE)}</h2>", f"<p>{e(DESCRIPTION.replace('`', ''))}</p>"]
    for t in tables:
        out.append(f"<h3>{e(phase_heading(t.phase))}</h3><table><tr>")
        out += html_table_body(columns(t), body(t), 1)
        out.append("</table>")
        out += [f"<p>{e(s)}</p>" for s in summary_lines(t)]
    return out
