"""First call per head configuration: what a NEW (backend, head configuration, phase) costs to start.

Each results row carries ``first_call_s``: the runner (``runner.run_backend_case``) times, with
``timing.first_call``, ONE call of the backend on the case before anything else, on the host clock
between two device synchronisations, and keeps it out of the timing statistics. The first row run for
a (backend, preset, phase) is where kernel compilation or the on-disk cache load, autotuning and the
first execution land; later rows of the same configuration mostly reuse the kernels the process holds.
So the cell of a table here is the ``first_call_s`` of that configuration's EARLIEST row: by row
``timestamp`` (when the row finished), or by file order when a row has no timestamp.

Two things the earliest row does not show are pointed out rather than hidden:

- a phase run after another phase of the same configuration in the same file (fwdbwd after bwd) finds
  the kernels it shares already compiled: such a cell is marked ``*``;
- a backend that compiles again for a later sequence pattern (a later row's first call much longer
  than the earliest one's) gets a note with the longest such call.
"""

from __future__ import annotations

import html
import math
import statistics
import textwrap
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd

from qlabench.report.layout import html_table_body, md_table, phase_heading, text_table

TITLE = "First call per head configuration (s)"
MISSING = "-"
NO_VALUE_STATUS = ("error", "unavailable")  # a first call of these rows is not shown
MARK = "*"
# A later row of a configuration "compiled again" when its first call exceeds both of these.
RECOMPILE_MIN_S = 1.0
RECOMPILE_FACTOR = 2.0

DESCRIPTION = (
    "`first_call_s` is the first call of a backend on a case in the benchmark process, timed on the host "
    "clock between two device synchronisations and never part of the timing statistics: for fwd one "
    "forward call, for bwd and fwdbwd the forward with autograd and the backward. It includes kernel "
    "compilation or the load of compiled kernels from the on-disk caches (TileLang, Triton), autotuning, "
    "and the first execution, run eagerly (no CUDA graph); the first configuration of a process also pays "
    "one-time initialisation. Each cell is the earliest row of that (backend, head configuration, "
    "phase), by row timestamp (file order when timestamps are missing): later rows of the configuration "
    "mostly reuse the kernels compiled in the process. After `qlabench warm` or `qlabench aot` filled the "
    "caches, it measures a cache load, not a cold compilation. `-`: no row, or the row is `error` / "
    "`unavailable`."
)
MARK_NOTE = (
    f"{MARK} this file had already run the configuration in another phase ({{phases}}) before this row: "
    "the kernels the phases share were compiled then, not in this call."
)


@dataclass
class FirstCallCell:
    seconds: float | None  # None: no value (no row, error / unavailable row, or null first_call_s)
    status: str | None  # status of the earliest row; None = no row
    pattern: str | None = None
    after_phases: list[str] = field(default_factory=list)  # phases of this config run earlier in the file


@dataclass
class FirstCallRow:
    preset: str
    model: str
    h_qk: int
    h_v: int
    cells: dict[str, FirstCallCell] = field(default_factory=dict)


@dataclass
class Recompile:
    """A backend whose later rows of a configuration paid a first-call cost again."""

    backend: str
    n_configs: int
    n_total: int
    worst_s: float
    worst_config: str  # as the table labels it
    worst_pattern: str


@dataclass
class FirstCallTable:
    phase: str
    backends: list[str]
    rows: list[FirstCallRow]
    recompiles: list[Recompile]

    def label(self, row: FirstCallRow) -> str:
        return _label(self.phase, row)

    def stats(self, backend: str) -> tuple[int, float, float, str] | None:
        """(configurations with a value, median, max, label of the max) or None."""
        vals = [(r.cells[backend].seconds, self.label(r)) for r in self.rows if r.cells[backend].seconds is not None]
        if not vals:
            return None
        worst = max(vals, key=lambda v: v[0])
        return len(vals), statistics.median(v for v, _ in vals), worst[0], worst[1]

    @property
    def marked(self) -> list[str]:
        return sorted({p for r in self.rows for c in r.cells.values() if c.seconds is not None for p in c.after_phases})


def _label(phase: str, row: FirstCallRow) -> str:
    """The configuration's name as the phase tables show it (model label for fwd, preset otherwise)."""
    return (row.model or row.preset) if phase == "fwd" else row.preset


# ---- building -------------------------------------------------------------------------------------


def _parse_ts(x: Any) -> datetime | None:
    if not isinstance(x, str) or not x:
        return None
    try:
        ts = datetime.fromisoformat(x.replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts if ts.tzinfo is not None else None  # naive and aware stamps cannot be ordered together


def _order_keys(rows: pd.DataFrame) -> list[tuple]:
    """Sort keys of rows: (timestamp, file order) when every row has a timestamp, else file order."""
    stamps = [_parse_ts(x) for x in rows["timestamp"]] if "timestamp" in rows.columns else [None] * len(rows)
    if all(s is not None for s in stamps):
        return [(s.timestamp(), int(i)) for s, i in zip(stamps, rows.index)]
    return [(0.0, int(i)) for i in rows.index]


def _value(row: pd.Series) -> float | None:
    if row["status"] in NO_VALUE_STATUS:
        return None
    v = row.get("first_call_s")
    if v is None or pd.isna(v) or not math.isfinite(float(v)) or float(v) < 0:
        return None
    return float(v)


def build_first_calls(df: pd.DataFrame, phases: list[str], backends: list[str]) -> list[FirstCallTable]:
    """One table per phase of ``phases`` that has any first call of ``backends``; [] when none has.

    ``df`` is the report's frame (several files already merged by ``dedupe_latest``; the index is the
    file order)."""
    if "first_call_s" not in df.columns or df.empty:
        return []
    df = df.copy()
    df["_file"] = df["source"].fillna("").astype(str) if "source" in df.columns else ""
    cfg_cols = ["preset", "h_qk", "h_v"]
    tables = []
    for phase in phases:
        sub = df[(df["phase"] == phase) & df["backend"].astype(str).isin(backends)]
        if sub.empty or sub["first_call_s"].isna().all():
            continue
        rows: dict[tuple, FirstCallRow] = {}
        for _, r in sub.iterrows():  # configurations in run order
            key = tuple(r[c] for c in cfg_cols)
            if key not in rows:
                model = r["model"]
                rows[key] = FirstCallRow(
                    preset=str(r["preset"]),
                    model=str(model) if model is not None and not pd.isna(model) else "",
                    h_qk=int(r["h_qk"]),
                    h_v=int(r["h_v"]),
                    cells={b: FirstCallCell(None, None) for b in backends},
                )
        recompiles: dict[str, list[tuple[float, str, str]]] = {}
        for (backend, *key), grp in sub.groupby(["backend"] + cfg_cols, sort=False, dropna=False):
            keys = _order_keys(grp)
            grp = grp.iloc[sorted(range(len(grp)), key=keys.__getitem__)]
            first = grp.iloc[0]
            cell = FirstCallCell(_value(first), str(first["status"]), str(first["pattern"]))
            same = df[
                (df["backend"] == backend)
                & (df["phase"] != phase)
                & (df["_file"] == first["_file"])
                & (df["preset"] == key[0])
                & (df["h_qk"] == key[1])
                & (df["h_v"] == key[2])
            ]
            if not same.empty:  # order the first row and the other phases' rows together
                both = pd.concat([grp.iloc[:1], same])
                k = _order_keys(both)
                cell.after_phases = sorted({str(p) for p, kk in zip(same["phase"], k[1:]) if kk < k[0]})
            rows[tuple(key)].cells[str(backend)] = cell
            base = cell.seconds or 0.0
            later = [
                (v, str(r["pattern"]))
                for _, r in grp.iloc[1:].iterrows()
                if (v := _value(r)) is not None and v > max(RECOMPILE_MIN_S, RECOMPILE_FACTOR * base)
            ]
            if later:
                v, pat = max(later)
                recompiles.setdefault(str(backend), []).append((v, _label(phase, rows[tuple(key)]), pat))
        notes = []
        for b in backends:
            hits = recompiles.get(b)
            if hits:
                n_total = sum(1 for r in rows.values() if r.cells[b].status is not None)
                v, label, pat = max(hits)
                notes.append(Recompile(b, len(hits), n_total, v, label, pat))
        tables.append(FirstCallTable(phase, list(backends), list(rows.values()), notes))
    return tables


# ---- formatting ----------------------------------------------------------------------------------


def fmt_s(x: float | None) -> str:
    """`12.3 s`, `1.26 s`, `0.47 s`, `0.0047 s`; `-` for no value."""
    if x is None:
        return MISSING
    if x >= 10:
        return f"{x:.1f} s"
    if x >= 1:
        return f"{x:.2f} s"
    return f"{x:#.2g} s"


def fmt_cell(cell: FirstCallCell) -> str:
    s = fmt_s(cell.seconds)
    return s + MARK if cell.seconds is not None and cell.after_phases else s


def columns(table: FirstCallTable) -> list[str]:
    return ["Model Config", "h_qk", "h_v"] + table.backends


def cells(table: FirstCallTable, row: FirstCallRow) -> list[str]:
    return [table.label(row), str(row.h_qk), str(row.h_v)] + [fmt_cell(row.cells[b]) for b in table.backends]


def backend_lines(table: FirstCallTable) -> list[str]:
    """One line per backend (median and max over configurations), then the marker and recompile notes."""
    out = []
    for b in table.backends:
        st = table.stats(b)
        if st is None:
            out.append(f"{b}: no first call")
            continue
        n, med, mx, where = st
        out.append(
            f"{b}: median {fmt_s(med)}, max {fmt_s(mx)} ({where}) over {n} configuration{'s' if n != 1 else ''}"
        )
    marked = table.marked
    if marked:
        out.append(MARK_NOTE.format(phases=", ".join(marked)))
    for rc in table.recompiles:
        out.append(
            f"note: {rc.backend} paid a first call again on a later row in {rc.n_configs} of {rc.n_total} "
            f"configurations (up to {fmt_s(rc.worst_s)}: {rc.worst_config} {rc.worst_pattern}; over "
            f"max({RECOMPILE_MIN_S:g} s, {RECOMPILE_FACTOR:g}x its earliest row)), presumably compiling for "
            "another sequence pattern: the table shows only the earliest row"
        )
    return out


def text_lines(tables: list[FirstCallTable]) -> list[str]:
    if not tables:
        return []
    out = [">>> FIRST CALL PER HEAD CONFIGURATION (s)"]
    out += textwrap.wrap(DESCRIPTION.replace("`", ""), 100) + [""]
    for t in tables:
        out += [f"-- {phase_heading(t.phase)}"] + text_table(columns(t), [cells(t, r) for r in t.rows], {0})
        out += ["  " + ln for ln in backend_lines(t)]
        out.append("")
    return out


def md_lines(tables: list[FirstCallTable]) -> list[str]:
    if not tables:
        return []
    out = [f"## {TITLE}", "", DESCRIPTION, ""]
    for t in tables:
        escaped = [[c.replace(MARK, "\\" + MARK) for c in cells(t, r)] for r in t.rows]
        out += [f"### {phase_heading(t.phase)}", ""] + md_table(columns(t), escaped, 1)
        out.append("")
        out += ["- " + ln.replace(MARK, "\\" + MARK) for ln in backend_lines(t)]
        out.append("")
    return out


def html_lines(tables: list[FirstCallTable]) -> list[str]:
    if not tables:
        return []
    e = html.escape
    out = [f"<h2>{e(TITLE)}</h2>", f"<p>{e(DESCRIPTION.replace('`', ''))}</p>"]
    for t in tables:
        out.append(f"<h3>{e(phase_heading(t.phase))}</h3><table><tr>")
        out += html_table_body(columns(t), [cells(t, r) for r in t.rows], 1)
        out.append("</table><ul>" + "".join(f"<li>{e(ln)}</li>" for ln in backend_lines(t)) + "</ul>")
    return out
