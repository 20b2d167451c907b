"""Speedup tables in FlashQLA's H200 layout, as text, markdown, CSV or HTML.

Layout (text):

    GPU: NVIDIA H200 (132 SMs, cc 9.0) | driver ... | CUDA ...
    Config: Timer=cudagraph, Warmup=10, Repeats=100, L2=flush
    Library Versions:
      torch: ... | triton: ... | tilelang: ... | fla: ... | flash_qla: ... | qlabench: ...
    =====...
    >>> FORWARD BENCHMARKS
    Model Config   Seqlens   h_qk  h_v   qla [fwd]   fla [fwd]   vs fla   TFLOP/s   x floor
    -----...
    2B/0.8B TP1    1x32768     16   16     0.378ms     1.231ms    3.26x     230.1     2.99x
    (blank line between presets)
    >>> BACKWARD BENCHMARKS
    Model Config   SeqLen   h_qk  h_v  #seq   qla [bwd]   fla [bwd]   Speedup ...

Speedup `vs <peer>` = peer time / subject time (median ms); above 1.0x the subject is faster. An
`incorrect` row (an output over the tolerance or non-finite against the float64 reference) keeps its
time, flagged `!` (`0.050ms!`), so a kernel that is fast and wrong shows; a row that is `error` or
`unavailable` shows that word. Neither takes part in any speedup, summary or geomean, and a note under
the table says so. Tables of cases with more than the default input recipe get an `Inputs` column
(gate profile, beta profile, h0 scale). After the tables, the accuracy section (accuracy.py), the peak
memory section (memory.py), the per-kernel split (kernelsplit.py) and the first calls (firstcall.py).
"""

from __future__ import annotations

import csv
import html
import io
import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from qlabench import roofline
from qlabench.report import accuracy, firstcall, kernelsplit, memory
from qlabench.report.frame import Collected, backends_in_order, collect, dedupe_latest, default_subject
from qlabench.report.layout import (
    MISSING,
    PHASE_ORDER,
    PHASE_TITLE,
    html_cells,
    md_row,
    phase_heading,
    ran_pattern,
)

FORMATS = ("text", "md", "csv", "html")
_N_LABEL_COLS = 2  # label columns are left-aligned, numbers right-aligned, like FlashQLA's file


# ---- the table model, shared by every format -------------------------------------------------------


@dataclass
class Line:
    """One case (phase x preset x pattern x gate x dtype) across backends."""

    preset: str
    model: str
    pattern: str
    h_qk: int
    h_v: int
    n_seqs: int | None
    total_tokens: int | None
    seqlens: list[int] | None
    gate_profile: str | None
    times: dict[str, float | None] = field(default_factory=dict)  # ok median ms per backend
    status: dict[str, str | None] = field(default_factory=dict)  # status per backend, None = no row
    speedups: dict[str, float | None] = field(default_factory=dict)  # per peer
    tflops: float | None = None  # subject, implemented FLOPs
    x_floor: float | None = None  # subject time / floor
    inputs: str = "bench"  # the input recipe in words (recipe.inputs_label)
    flagged: dict[str, float] = field(default_factory=dict)  # median ms of incorrect rows, per backend


@dataclass
class PhaseTable:
    phase: str
    subject: str
    peers: list[str]
    backends: list[str]  # subject first, then peers
    groups: list[tuple[str, list[Line]]]  # (preset, lines), in run order
    roofline: bool

    @property
    def lines(self) -> list[Line]:
        return [line for _, lines in self.groups for line in lines]

    @property
    def show_inputs(self) -> bool:
        """An Inputs column when any case's recipe is not the default one."""
        return any(line.inputs != "bench" for line in self.lines)

    @property
    def has_flagged(self) -> bool:
        return any(line.flagged for line in self.lines)


@dataclass
class Report:
    collected: Collected
    subject: str
    peers: list[str]
    tables: list[PhaseTable]
    peak: roofline.GpuPeak | None
    notes: list[str]
    first_calls: list[firstcall.FirstCallTable] = field(default_factory=list)  # [] when no row has one
    accuracy: list[accuracy.PhaseAccuracy] = field(default_factory=list)  # [] when no row has errors
    kernel_split: list[kernelsplit.SplitTable] = field(default_factory=list)  # [] when no row has one
    memory: list[memory.MemoryTable] = field(default_factory=list)  # [] when no row has a peak


def _int_or_none(x: Any) -> int | None:
    try:
        if x is None or (isinstance(x, float) and math.isnan(x)) or pd.isna(x):
            return None
    except (TypeError, ValueError):
        pass
    return int(x)


def _ok_time(row: pd.Series) -> float | None:
    if row["status"] != "ok":
        return None
    return _timed(row)


def _timed(row: pd.Series) -> float | None:
    ms = row.get("median_ms")
    if ms is None or pd.isna(ms) or not ms > 0:
        return None
    return float(ms)


def build_report(
    results_or_df: Any,
    subject: str | None = None,
    peers: list[str] | None = None,
    phases: list[str] | None = None,
) -> Report:
    """Turn results (paths, dicts, a frame) into the per-phase tables every format renders."""
    col = collect(results_or_df)
    df = dedupe_latest(col.df)
    all_backends = backends_in_order(df)
    if not all_backends:
        raise ValueError("no rows in the results: nothing to report")
    subject = subject or default_subject(df)
    if subject not in all_backends:
        raise ValueError(
            f"subject backend {subject!r} is not in the results (have: {', '.join(all_backends)})"
        )
    if peers is None:
        peers = [b for b in all_backends if b != subject]
    else:
        bad = [p for p in peers if p not in all_backends]
        if bad:
            raise ValueError(
                f"peer backend {bad[0]!r} is not in the results (have: {', '.join(all_backends)})"
            )
        peers = [p for p in peers if p != subject]
    if phases:
        bad = [p for p in phases if p not in PHASE_ORDER]
        if bad:
            raise ValueError(f"phase must be one of {', '.join(PHASE_ORDER)}, got {bad[0]!r}")
    present = [p for p in PHASE_ORDER if p in set(df["phase"])]
    wanted = [p for p in present if not phases or p in phases]

    notes: list[str] = []
    gpu_names = sorted({str(e.get("gpu_name")) for e in col.envs if e.get("gpu_name")})
    if len(gpu_names) > 1:
        notes.append(
            f"note: these files come from different GPUs ({', '.join(gpu_names)}); rows are not comparable"
        )
    gpu_name = gpu_names[0] if gpu_names else None
    peak = roofline.find_gpu(gpu_name)
    if peak is None:
        notes.append(roofline.unknown_gpu_note(gpu_name))

    backends = [subject] + peers
    tables = [_phase_table(df, phase, subject, peers, backends, peak) for phase in wanted]
    first_calls = firstcall.build_first_calls(df, wanted, backends)
    tolerances = {src: run["tolerance"] for src, run in zip(col.sources, col.runs) if run.get("tolerance")}
    acc = accuracy.build_accuracy(df, wanted, backends, tolerances)
    split = kernelsplit.build_kernel_split(df, wanted, backends)
    mem = memory.build_memory(df, wanted, subject, peers)
    return Report(col, subject, peers, tables, peak, notes, first_calls, acc, split, mem)


def _phase_table(df, phase, subject, peers, backends, peak) -> PhaseTable:
    sub = df[df["phase"] == phase]
    case_cols = ["preset", "pattern", "h_qk", "h_v", "dtype"]
    groups: dict[str, list[Line]] = {}
    by_case: dict[tuple, Line] = {}
    for _, row in sub.iterrows():
        inputs = accuracy.row_inputs(row)
        key = (*(None if pd.isna(row[c]) else row[c] for c in case_cols), inputs)
        line = by_case.get(key)
        if line is None:
            seqlens = row.get("seqlens")
            line = Line(
                preset=str(row["preset"]),
                model=str(row["model"]) if row["model"] is not None and not pd.isna(row["model"]) else "",
                pattern=ran_pattern(str(row["pattern"]), seqlens, row.get("pad_tokens")),
                h_qk=int(row["h_qk"]),
                h_v=int(row["h_v"]),
                n_seqs=_int_or_none(row.get("n_seqs")),
                total_tokens=_int_or_none(row.get("total_tokens")),
                seqlens=list(seqlens) if isinstance(seqlens, (list, tuple)) else None,
                gate_profile=row["gate_profile"],
                times={b: None for b in backends},
                status={b: None for b in backends},
                inputs=inputs,
            )
            by_case[key] = line
            groups.setdefault(line.preset, []).append(line)
        b = str(row["backend"])
        if b in line.status:
            line.status[b] = row["status"]
            line.times[b] = _ok_time(row)
            if row["status"] == "incorrect" and _timed(row) is not None:
                line.flagged[b] = _timed(row)
    for line in by_case.values():
        s = line.times[subject]
        for p in peers:
            t = line.times[p]
            line.speedups[p] = t / s if (s and t) else None
        if peak is not None and s and line.seqlens:
            w = roofline.work(phase, line.h_qk, line.h_v, [int(n) for n in line.seqlens])
            line.tflops = roofline.achieved_tflops(w, s)
            line.x_floor = roofline.x_of_floor(w, peak, s)
    return PhaseTable(phase, subject, peers, backends, list(groups.items()), peak is not None)


# ---- cell formatting ------------------------------------------------------------------------------


FLAG = "!"
FLAG_NOTE = (
    f"{FLAG} incorrect: an output over the tolerance or non-finite against the float64 reference (see "
    "Accuracy); its time is shown, but it takes no part in speedups, summaries or geomeans"
)


def fmt_ms(line: Line, backend: str, unit: bool = True, flag: bool = True) -> str:
    """A backend's median time in a table cell; an incorrect row's time ends in FLAG (``flag=False``: the
    bare number, for CSV), other statuses show their word."""
    status = line.status.get(backend)
    if status is None:
        return MISSING
    if status == "incorrect" and backend in line.flagged:
        t = line.flagged[backend]
        return (f"{t:.3f}ms" if unit else f"{t:.3f}") + (FLAG if flag else "")
    if status != "ok":
        return status
    t = line.times.get(backend)
    if t is None:  # ok status but no time recorded: say so rather than invent a number
        return "no time"
    return f"{t:.3f}ms" if unit else f"{t:.3f}"


def fmt_x(x: float | None) -> str:
    return MISSING if x is None else f"{x:.2f}x"


def fmt_geomean(x: float | None) -> str:
    """A summary's geomean to three places: criteria are set on it (2.9966 must not read as 3.00x)."""
    return MISSING if x is None else f"{x:.3f}x"


def fmt_tflops(x: float | None) -> str:
    return MISSING if x is None else f"{x:.1f}"


def _speedup_headers(table: PhaseTable) -> list[str]:
    if table.phase != "fwd" and len(table.peers) == 1:
        return ["Speedup"]
    return [f"vs {p}" for p in table.peers]


def table_columns(table: PhaseTable) -> list[str]:
    tag = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}[table.phase]
    if table.phase == "fwd":
        head = ["Model Config", "Seqlens", "h_qk", "h_v"]
    else:
        head = ["Model Config", "SeqLen", "h_qk", "h_v", "#seq"]
    if table.show_inputs:
        head.insert(2, "Inputs")
    cols = head + [f"{b} [{tag}]" for b in table.backends] + _speedup_headers(table)
    if table.roofline:
        cols += ["TFLOP/s", "x floor"]
    return cols


def table_cells(table: PhaseTable, line: Line, unit: bool = True) -> list[str]:
    if table.phase == "fwd":
        head = [line.model or line.preset, line.pattern, str(line.h_qk), str(line.h_v)]
    else:
        head = [line.preset, line.pattern, str(line.h_qk), str(line.h_v), str(line.n_seqs or MISSING)]
    if table.show_inputs:
        head.insert(2, line.inputs)
    cells = head + [fmt_ms(line, b, unit) for b in table.backends]
    cells += [fmt_x(line.speedups.get(p)) for p in table.peers]
    if table.roofline:
        cells += [fmt_tflops(line.tflops), fmt_x(line.x_floor)]
    return cells


# ---- header ----------------------------------------------------------------------------------------


def _resumes(env: dict) -> list[dict]:
    """The env block's ``resumes`` entries (each resume's commit and versions; older files have none)."""
    return [r for r in env.get("resumes") or [] if isinstance(r, dict)]


def header_lines(report: Report) -> list[str]:
    env, run = report.collected.env, report.collected.run
    gpu = env.get("gpu_name") or (f"none (device {env['device']})" if env.get("device") else "unknown GPU")
    bits = []
    if env.get("sm_count"):
        bits.append(f"{env['sm_count']} SMs")
    if env.get("compute_capability"):
        bits.append(f"cc {env['compute_capability']}")
    gpu_line = f"GPU: {gpu}" + (f" ({', '.join(bits)})" if bits else "")
    for k in ("driver", "cuda"):
        if env.get(k):
            gpu_line += f" | {k}: {env[k]}"
    start = (env.get("clocks_start") or {}).get("sm_mhz")
    end = (env.get("clocks_end") or {}).get("sm_mhz")
    if start and end:  # the start reading is usually the idle clock; the end one was under load
        gpu_line += f" | SM clock {start} MHz at start, {end} MHz at end"
    elif start or end:
        gpu_line += f" | SM clock {start or end} MHz at {'start' if start else 'end'}"
    out = [gpu_line]

    def config_of(r: dict) -> str:
        cfg = [f"{label}={r[key]}" for label, key in (("Timer", "timer"), ("Warmup", "warmup"),
                                                        ("Repeats", "repeats"), ("L2", "l2_policy"))
               if r.get(key) is not None]
        if r.get("gate_profile"):
            cfg.append(f"Gate={r['gate_profile']}")
        if r.get("quick"):
            cfg.append("quick")
        return ", ".join(cfg) if cfg else "unknown (rows carry no run block)"

    runs, sources = report.collected.runs, report.collected.sources
    configs = [config_of(r) for r in runs] or [config_of(run)]
    if len(set(configs)) > 1:  # files measured under different settings: say which is which
        out.append("Config: " + "; ".join(f"{c} ({src})" for c, src in zip(configs, sources)))
    else:
        out.append("Config: " + configs[0])
    if report.peers:
        out.append(f"Subject: {report.subject}; speedup = peer time / {report.subject} time (median)")
    else:  # one backend: times only, nothing to divide by
        out.append(f"Backend: {report.subject} (no peer backend in the results: no speedups)")
    versions = {}  # every file's (and resume's) library versions; where they disagree, each value once
    for e in report.collected.envs or [env]:
        for part in [e] + _resumes(e):
            for k, v in (part.get("versions") or {}).items():
                if v is not None and str(v) not in versions.setdefault(k, []):
                    versions[k].append(str(v))
    if versions:
        out.append("Library Versions:")
        out.append("  " + " | ".join(f"{k}: {' / '.join(v)}" for k, v in versions.items()))
    def one_commit(e: dict) -> str:
        return f"{e.get('git_commit') or 'unknown'}" + (" (dirty)" if e.get("git_dirty") else "")

    def commit_of(e: dict) -> str:
        """The file's commit, and those of its resumes where they differ (rows of one file, two trees)."""
        first = one_commit(e)
        later = [c for c in dict.fromkeys(one_commit(r) for r in _resumes(e)) if c != first]
        return first + (f" (resumed at {', '.join(later)})" if later else "")

    envs, sources = report.collected.envs, report.collected.sources
    if len(sources) > 1 and len({commit_of(e) for e in envs}) > 1:  # each file at its own commit
        out.append("Commits: " + ", ".join(f"{commit_of(e)} ({src})" for e, src in zip(envs, sources)))
    elif env.get("git_commit"):
        out.append(f"Commit: {commit_of(env)}")
    if len(sources) > 1:
        out.append("Files: " + ", ".join(sources))
    if report.peak is not None:
        p = report.peak
        out.append(f"Roofline: {p.name} {p.tflops:g} TFLOP/s bf16 dense, {p.tbps:g} TB/s ({p.source})")
    out.extend(report.notes)
    return out


# ---- text ------------------------------------------------------------------------------------------


def render_text(report: Report) -> str:
    out = header_lines(report)
    rule_w = 100
    for table in report.tables:
        cols = table_columns(table)
        body = [[table_cells(table, line) for line in lines] for _, lines in table.groups]
        widths = [len(c) for c in cols]
        for group in body:
            for cells in group:
                widths = [max(w, len(c)) for w, c in zip(widths, cells)]

        n_label = _N_LABEL_COLS + table.show_inputs

        def fmt(cells: list[str], widths: list[int] = widths, n_label: int = n_label) -> str:
            parts = [c.ljust(w) if i < n_label else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
            return "  ".join(parts).rstrip()

        head = fmt(cols)
        rule_w = max(rule_w, len(head))
        out += ["=" * rule_w, "", f">>> {PHASE_TITLE[table.phase]} BENCHMARKS", head, "-" * len(head)]
        for gi, group in enumerate(body):
            if gi:
                out.append("")
            out += [fmt(cells) for cells in group]
        if table.has_flagged:
            out.append(FLAG_NOTE)
        out.append("")
    if report.accuracy:
        out += ["=" * rule_w, ""] + accuracy.text_lines(report.accuracy)
    if report.memory:
        out += ["=" * rule_w, ""] + memory.text_lines(report.memory)
    if report.kernel_split:
        out += ["=" * rule_w, ""] + kernelsplit.text_lines(report.kernel_split)
    if report.first_calls:
        out += ["=" * rule_w, ""] + firstcall.text_lines(report.first_calls)
    if not report.tables:
        out.append("(no rows for the selected phases)")
    return "\n".join(out).rstrip() + "\n"


# ---- markdown --------------------------------------------------------------------------------------


def render_markdown(report: Report, plots: dict[str, list[str]] | None = None) -> str:
    """Markdown: header as a list, one table per phase (a preset column instead of blank lines), then
    the summary per preset and overall. ``plots`` maps a phase to image paths to embed after its table."""
    from qlabench.report.summary import summarise_table

    env = report.collected.env
    out = [f"# qlabench report: {env.get('gpu_name') or 'unknown GPU'}", ""]
    for h in header_lines(report):
        if h.startswith("  ") and out[-1].startswith("- "):
            out[-1] += " " + h.strip()
        else:
            out.append(f"- {h}")
    out.append("")
    for table in report.tables:
        out += [f"## {phase_heading(table.phase)}", ""]
        cols = table_columns(table)
        out.append(md_row(cols))
        n_label = _N_LABEL_COLS + table.show_inputs
        out.append("|" + "|".join("---" if i < n_label else "---:" for i in range(len(cols))) + "|")
        for _, lines in table.groups:
            for line in lines:
                out.append(md_row(table_cells(table, line)))
        out.append("")
        if table.has_flagged:
            out += [FLAG_NOTE + ".", ""]
        summary = summarise_table(table)
        if summary:
            out += [f"### Summary: {table.subject} vs peers ({table.phase})", ""]
            out.append(
                md_row(["Group", "Peer", "Cases", "Geomean", "95% CI", "Worst", "Best", "Not compared"])
            )
            out.append("|---|---|---:|---:|---:|---|---|---:|")
            for s in summary:
                out.append(
                    md_row(
                        [
                            s.group,
                            s.peer,
                            str(s.n),
                            fmt_geomean(s.geomean),
                            f"{fmt_x(s.ci_low)} - {fmt_x(s.ci_high)}" if s.ci_low is not None else MISSING,
                            f"{fmt_x(s.worst)} ({s.worst_case})" if s.worst is not None else MISSING,
                            f"{fmt_x(s.best)} ({s.best_case})" if s.best is not None else MISSING,
                            str(s.n_skipped),
                        ]
                    )
                )
            out.append("")
        for img in (plots or {}).get(table.phase, []):
            out += [f"![{img}]({img})", ""]
    out += accuracy.md_lines(report.accuracy, plots)
    out += memory.md_lines(report.memory)
    out += kernelsplit.md_lines(report.kernel_split)
    out += firstcall.md_lines(report.first_calls)
    for img in (plots or {}).get("all", []):
        out += [f"![{img}]({img})", ""]
    if not report.tables:
        out.append("(no rows for the selected phases)")
    return "\n".join(out).rstrip() + "\n"


# ---- csv -------------------------------------------------------------------------------------------


def render_csv(report: Report) -> str:
    """One CSV row per phase x case, plain numbers (ms without unit) and status words in time cells."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    backends = [report.subject] + report.peers
    head = ["phase", "preset", "model", "pattern", "h_qk", "h_v", "n_seqs", "total_tokens", "gate_profile"]
    head += [f"{b}_ms" for b in backends] + [f"vs_{p}" for p in report.peers]
    roof = report.peak is not None
    if roof:
        head += ["tflops", "x_floor"]
    head += ["inputs"] + [f"{b}_status" for b in backends]  # an incorrect row's _ms is its (flagged) time
    w.writerow(head)
    for table in report.tables:
        for line in table.lines:
            row = [table.phase, line.preset, line.model, line.pattern, line.h_qk, line.h_v]
            row += [
                line.n_seqs if line.n_seqs is not None else "",
                line.total_tokens or "",
                line.gate_profile or "",
            ]
            row += [fmt_ms(line, b, unit=False, flag=False) if line.status.get(b) else "" for b in backends]
            row += [f"{line.speedups[p]:.4f}" if line.speedups.get(p) else "" for p in report.peers]
            if roof:
                row += [
                    f"{line.tflops:.2f}" if line.tflops else "",
                    f"{line.x_floor:.4f}" if line.x_floor else "",
                ]
            row += [line.inputs] + [line.status.get(b) or "" for b in backends]
            w.writerow(row)
    return buf.getvalue()


# ---- html ------------------------------------------------------------------------------------------


_HTML_STYLE = (
    "<style>body{font-family:sans-serif}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #bbb;padding:2px 8px;text-align:right}td.l,th.l{text-align:left}"
    "td.bad{color:#b00}tr.sep td{border:none;height:.6em}</style></head><body>"
)


def render_html(report: Report) -> str:
    from qlabench.report.summary import summarise_table

    e = html.escape
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>qlabench report</title>",
        _HTML_STYLE,
        f"<h1>qlabench report: {e(report.collected.env.get('gpu_name') or 'unknown GPU')}</h1><ul>",
    ]
    out += [f"<li>{e(h)}</li>" for h in header_lines(report)]
    out.append("</ul>")
    for table in report.tables:
        out.append(f"<h2>{e(PHASE_TITLE[table.phase])}</h2><table><tr>")
        cols = table_columns(table)
        out += html_cells("th", cols, _N_LABEL_COLS) + ["</tr>"]
        for gi, (_, lines) in enumerate(table.groups):
            if gi:
                out.append(f"<tr class='sep'><td colspan='{len(cols)}'></td></tr>")
            for line in lines:
                out.append("<tr>")
                for i, c in enumerate(table_cells(table, line)):
                    bad = c in ("incorrect", "error", "unavailable") or c.endswith(FLAG)
                    cls = "l" if i < 2 + table.show_inputs else ("bad" if bad else "")
                    out.append(f"<td class='{cls}'>{e(c)}</td>")
                out.append("</tr>")
        out.append("</table>")
        if table.has_flagged:
            out.append(f"<p>{e(FLAG_NOTE)}.</p>")
        summary = summarise_table(table)
        if summary:
            out.append(
                "<table><tr><th class='l'>Group</th><th class='l'>Peer</th><th>Cases</th>"
                "<th>Geomean</th><th>95% CI</th><th>Worst</th><th>Best</th></tr>"
            )
            for s in summary:
                ci = f"{fmt_x(s.ci_low)} - {fmt_x(s.ci_high)}" if s.ci_low is not None else MISSING
                out.append(
                    f"<tr><td class='l'>{e(s.group)}</td><td class='l'>{e(s.peer)}</td><td>{s.n}</td>"
                    f"<td>{fmt_geomean(s.geomean)}</td><td>{ci}</td><td>{fmt_x(s.worst)}</td><td>{fmt_x(s.best)}</td></tr>"
                )
            out.append("</table>")
    out += accuracy.html_lines(report.accuracy)
    out += memory.html_lines(report.memory)
    out += kernelsplit.html_lines(report.kernel_split)
    out += firstcall.html_lines(report.first_calls)
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# ---- entry points ------------------------------------------------------------------------------------


def render(report: Report, fmt: str = "text", plots: dict[str, list[str]] | None = None) -> str:
    if fmt == "text":
        return render_text(report)
    if fmt == "md":
        return render_markdown(report, plots)
    if fmt == "csv":
        return render_csv(report)
    if fmt == "html":
        return render_html(report)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def format_h200_tables(results_or_df: Any, subject: str | None = None, peers: list[str] | None = None) -> str:
    """The text report (FlashQLA's H200 layout) of a results dict, path(s), or rows frame.

    Args:
        results_or_df: a results dict (schema `qlabench.results/1`), a path, a list of those, or a
            DataFrame of rows.
        subject: the backend the speedups are about; default `qla` when it has ok rows, else the
            first backend.
        peers: the backends to compare against; default every other backend.
    """
    return render_text(build_report(results_or_df, subject=subject, peers=peers))
