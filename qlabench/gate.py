"""Run-to-run comparison with noise-aware verdicts, and the CI performance gate.

Compare: rows of BASE and CURRENT are matched by their identity (``qlabench.results.row_key``: phase,
h_qk, h_v, pattern, gate profile, dtype, backend).
For a pair that is ok on both sides, ratio = current median / base median (above 1 = slower) and

    SAME    |ratio - 1| < min_effect                                  (too small to matter)
    FASTER  ratio < 1 - min_effect and the p20-p80 ranges do not overlap
    SLOWER  ratio > 1 + min_effect and the p20-p80 ranges do not overlap
    NOISY   a change of at least min_effect whose p20-p80 ranges overlap (not confirmed)

A row without recorded percentiles is taken at its median (a zero-width range). Rows whose status
changed (ok -> incorrect, say) and rows only one side has are listed apart. Like nvbench's robust
compare, a change must clear both the effect size and the dispersion before it is called.

Gate exit codes: 0 nothing regressed; 1 a confirmed regression beyond --max-regression, a non-ok row
of a gated backend, a baseline row of a gated backend missing from CURRENT, or an in-run requirement not met
inside CURRENT (--min-speedup: a geomean ratio; --min-case-speedup: the ratio of every case; --max-memory: the peak
memory ratio of every case); 2 the inputs cannot be compared (not a valid results file: qlabench.results.validate
rejects non-finite, non-positive or non-numeric times, empty files and untyped key fields; a different
GPU model, no common rows, a backend not in the file). In-run ratios
against peers are the primary gate because absolute times drift between machines; the absolute
comparison against a baseline of the same GPU model is the secondary one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from qlabench import results as R
from qlabench.report.frame import (
    Collected,
    ResultsError,
    backends_in_order,
    collect,
    dedupe_latest,
    default_subject,
)
from qlabench.report.summary import geomean
from qlabench.report.tables import fmt_geomean

MATCH_KEY = R.KEY_FIELDS
VERDICTS = ("FASTER", "SLOWER", "SAME", "NOISY")
DEFAULT_MIN_EFFECT = 0.02
DEFAULT_MAX_REGRESSION = 0.05

EXIT_OK, EXIT_FAIL, EXIT_INPUT = 0, 1, 2


class CompareError(ValueError):
    """The inputs cannot be compared (maps to exit code 2)."""


# ---- verdicts ------------------------------------------------------------------------------------


def _range(row: pd.Series) -> tuple[float, float]:
    m = float(row["median_ms"])
    lo, hi = row.get("p20_ms"), row.get("p80_ms")
    lo = m if lo is None or pd.isna(lo) else float(lo)
    hi = m if hi is None or pd.isna(hi) else float(hi)
    return min(lo, m), max(hi, m)


def verdict(base: pd.Series, cur: pd.Series, min_effect: float = DEFAULT_MIN_EFFECT) -> tuple[float, str]:
    """Ratio (current / base median) and verdict of two ok rows."""
    if not min_effect >= 0:
        raise ValueError(f"min_effect must be >= 0, got {min_effect!r}")
    b, c = float(base["median_ms"]), float(cur["median_ms"])
    if not (b > 0 and c > 0):
        raise ValueError(f"medians must be positive, got base {b!r} ms, current {c!r} ms")
    ratio = c / b
    if abs(ratio - 1) < min_effect:
        return ratio, "SAME"
    (b_lo, b_hi), (c_lo, c_hi) = _range(base), _range(cur)
    overlap = b_hi >= c_lo and c_hi >= b_lo
    if overlap:
        return ratio, "NOISY"
    return ratio, "SLOWER" if ratio > 1 else "FASTER"


# ---- compare -------------------------------------------------------------------------------------


@dataclass
class Pair:
    key: tuple  # qlabench.results.row_key: the case fields, then the backend
    label: str  # qlabench.results.row_label
    base_status: str
    cur_status: str
    base_ms: float | None
    cur_ms: float | None
    ratio: float | None
    verdict: str  # a VERDICTS word, or STATUS for a status change, or "-" when neither side is ok


@dataclass
class Comparison:
    base_gpu: str | None
    cur_gpu: str | None
    pairs: list[Pair] = field(default_factory=list)
    only_base: list[str] = field(default_factory=list)
    only_current: list[str] = field(default_factory=list)
    geomean_ratio: dict[str, tuple[float, int]] = field(default_factory=dict)  # backend -> (ratio, n)

    @property
    def status_changes(self) -> list[Pair]:
        return [p for p in self.pairs if p.base_status != p.cur_status]


def _gpu_name(col: Collected) -> str | None:
    names = {str(e.get("gpu_name")).strip() for e in col.envs if e.get("gpu_name")}
    if len(names) > 1:
        raise CompareError(
            f"one side mixes GPUs ({', '.join(sorted(names))}); compare one GPU model at a time"
        )
    return names.pop() if names else None


def _norm_gpu(name: str | None) -> str:
    return re.sub(r"\s+", " ", (name or "").strip().lower())


def check_same_gpu(base: Collected, cur: Collected) -> tuple[str | None, str | None]:
    """Refuse to compare absolute times across GPU models (raises CompareError)."""
    bg, cg = _gpu_name(base), _gpu_name(cur)
    if _norm_gpu(bg) != _norm_gpu(cg):
        raise CompareError(
            f"different GPU models: baseline {bg or 'unknown'!s} vs current {cg or 'unknown'!s}; "
            "absolute times only compare on the same model (use in-run --min-speedup ratios instead)"
        )
    return bg, cg


def _label_of(row: pd.Series) -> str:
    return R.row_label(row)


def _keyed(df: pd.DataFrame) -> dict[tuple, pd.Series]:
    out: dict[tuple, pd.Series] = {}
    for _, row in df.iterrows():
        out[R.row_key(row)] = row  # later rows win, as in reports
    return out


def compare(
    base: Any,
    current: Any,
    min_effect: float = DEFAULT_MIN_EFFECT,
    backends: list[str] | None = None,
    allow_different_gpu: bool = False,
) -> Comparison:
    """Match rows of ``base`` and ``current`` (paths, dicts or Collected) and give each a verdict."""
    try:
        b, c = collect(base), collect(current)
    except ResultsError as exc:
        raise CompareError(str(exc)) from exc
    if allow_different_gpu:
        bg, cg = _gpu_name(b), _gpu_name(c)
    else:
        bg, cg = check_same_gpu(b, c)
    bdf, cdf = b.df, c.df
    if backends:
        bdf, cdf = bdf[bdf["backend"].isin(backends)], cdf[cdf["backend"].isin(backends)]
    bk, ck = _keyed(bdf), _keyed(cdf)
    out = Comparison(bg, cg)
    for key, crow in ck.items():
        brow = bk.get(key)
        if brow is None:
            out.only_current.append(_label_of(crow))
            continue
        bs, cs = str(brow["status"]), str(crow["status"])
        bms = float(brow["median_ms"]) if bs == "ok" and not pd.isna(brow["median_ms"]) else None
        cms = float(crow["median_ms"]) if cs == "ok" and not pd.isna(crow["median_ms"]) else None
        if bms and cms:
            ratio, v = verdict(brow, crow, min_effect)
        else:
            ratio, v = None, ("STATUS" if bs != cs else "-")
        out.pairs.append(Pair(key, _label_of(crow), bs, cs, bms, cms, ratio, v))
    out.only_base = [_label_of(row) for key, row in bk.items() if key not in ck]
    by_backend: dict[str, list[float]] = {}
    for p in out.pairs:
        if p.ratio is not None:
            by_backend.setdefault(p.key[-1], []).append(p.ratio)
    out.geomean_ratio = {k: (geomean(v), len(v)) for k, v in by_backend.items()}
    return out


def format_comparison(cmp: Comparison, only_changes: bool = False) -> str:
    lines = [
        f"baseline GPU: {cmp.base_gpu or 'unknown'} | current GPU: {cmp.cur_gpu or 'unknown'}",
        "ratio = current / baseline median (above 1.00 = slower)",
        "",
    ]
    rows = [p for p in cmp.pairs if not only_changes or p.verdict not in ("SAME", "-")]
    labels = [p.label for p in rows]
    w = max([len(x) for x in labels] + [4])
    lines.append(f"{'case':<{w}}  {'base ms':>9}  {'cur ms':>9}  {'ratio':>7}  verdict")
    lines.append("-" * (w + 42))
    for p, label in zip(rows, labels):
        bms = f"{p.base_ms:.3f}" if p.base_ms else p.base_status
        cms = f"{p.cur_ms:.3f}" if p.cur_ms else p.cur_status
        ratio = f"{p.ratio:.3f}" if p.ratio is not None else "-"
        v = f"{p.base_status} -> {p.cur_status}" if p.verdict == "STATUS" else p.verdict
        lines.append(f"{label:<{w}}  {bms:>9}  {cms:>9}  {ratio:>7}  {v}")
    counts = {v: sum(p.verdict == v for p in cmp.pairs) for v in VERDICTS + ("STATUS",)}
    lines += ["", "verdicts: " + ", ".join(f"{k} {n}" for k, n in counts.items())]
    if cmp.status_changes:
        lines.append("status changes:")
        lines += [f"  {p.label}: {p.base_status} -> {p.cur_status}" for p in cmp.status_changes]
    if cmp.only_base:
        lines.append(f"only in baseline ({len(cmp.only_base)}):")
        lines += [f"  {x}" for x in cmp.only_base]
    if cmp.only_current:
        lines.append(f"only in current ({len(cmp.only_current)}):")
        lines += [f"  {x}" for x in cmp.only_current]
    if cmp.geomean_ratio:
        lines.append("geomean ratio (current / baseline) per backend:")
        lines += [f"  {k}: {r:.3f} over {n} cases" for k, (r, n) in cmp.geomean_ratio.items()]
    return "\n".join(lines) + "\n"


# ---- gate ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedupRequirement:
    """``subject/peer=ratio``, an in-run requirement inside CURRENT: peer time / subject time must reach ``ratio``
    (--min-speedup: the geomean; --min-case-speedup: every case), or subject peak memory / peer peak memory must stay
    at or under it (--max-memory)."""

    subject: str
    peer: str
    ratio: float

    def __str__(self) -> str:
        return f"{self.subject}/{self.peer}={self.ratio:g}"


def parse_min_speedup(text: str, option: str = "--min-speedup") -> SpeedupRequirement:
    """Parse `qla/fla=2.5` (also `2.5x`) for ``option`` (--min-speedup, --min-case-speedup, --max-memory: the same
    form); raises ValueError naming the option and the bad text."""
    m = re.fullmatch(r"\s*([\w.-]+)\s*/\s*([\w.-]+)\s*=\s*([0-9]*\.?[0-9]+)\s*x?\s*", text)
    if not m:
        raise ValueError(f"{option} must look like SUBJECT/PEER=RATIO (e.g. qla/fla=2.5), got {text!r}")
    ratio = float(m.group(3))
    if not ratio > 0:
        raise ValueError(f"{option} ratio must be positive, got {text!r}")
    if m.group(1) == m.group(2):
        raise ValueError(f"{option} needs two different backends, got {text!r}")
    return SpeedupRequirement(m.group(1), m.group(2), ratio)


def parse_percent(text: str) -> float:
    """`5%` -> 0.05, `0.05` -> 0.05; raises ValueError naming the bad text."""
    s = str(text).strip()
    try:
        val = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise ValueError(f"expected a percentage like 5% or a fraction like 0.05, got {text!r}") from None
    if not (0 <= val < 10) or math.isnan(val):
        raise ValueError(f"threshold out of range: {text!r}")
    return val


@dataclass
class GateResult:
    code: int
    failures: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    comparison: Comparison | None = None

    def render(self) -> str:
        out = []
        if self.comparison is not None:
            out.append(format_comparison(self.comparison, only_changes=True))
        out += [f"  ok   {c}" for c in self.checks]
        out += [f"  FAIL {f}" for f in self.failures]
        out.append(f"GATE: {'PASS' if self.code == EXIT_OK else 'FAIL'}")
        return "\n".join(out) + "\n"


def gate(
    current: Any,
    baseline: Any | None = None,
    max_regression: float = DEFAULT_MAX_REGRESSION,
    min_speedups: list[SpeedupRequirement] | None = None,
    backends: list[str] | None = None,
    min_effect: float = DEFAULT_MIN_EFFECT,
    min_case_speedups: list[SpeedupRequirement] | None = None,
    max_memory: list[SpeedupRequirement] | None = None,
) -> GateResult:
    """Decide pass/fail. Raises CompareError for inputs that cannot be compared (exit 2).

    ``current`` may be several results files of one GPU model (a list): they are merged into one run
    (a row present in two files: the later file's wins), so peers measured in another file take part
    in the in-run requirements: ``min_speedups`` (the geomean of peer time / subject time over the cases
    both ran ok), ``min_case_speedups`` (the same ratio in every such case) and ``max_memory`` (subject peak
    memory / peer peak memory in every such case that recorded both)."""
    min_speedups = list(min_speedups or [])
    min_case_speedups = list(min_case_speedups or [])
    max_memory = list(max_memory or [])
    in_run = min_speedups + min_case_speedups + max_memory
    if baseline is None and not in_run:
        raise CompareError("nothing to gate: give --baseline and/or at least one --min-speedup, --min-case-speedup "
                           "or --max-memory")
    try:
        cur = collect(current)
    except ResultsError as exc:
        raise CompareError(str(exc)) from exc
    if len(cur.sources) > 1:  # one run from several files: one GPU model, one row per identity
        _gpu_name(cur)
        cur = Collected(envs=cur.envs, runs=cur.runs, sources=cur.sources, df=dedupe_latest(cur.df))
    where = " + ".join(cur.sources)
    names = backends_in_order(cur.df)
    if not names:
        raise CompareError(f"{where}: no rows")
    gated = list(backends) if backends else [default_subject(cur.df)]
    for name in gated + [b for r in in_run for b in (r.subject, r.peer)]:
        if name not in names:
            raise CompareError(f"backend {name!r} is not in {where} (have: {', '.join(names)})")

    result = GateResult(EXIT_OK)
    df = cur.df
    # Correctness (and "did it run at all") of the gated backends, inside CURRENT.
    bad = df[df["backend"].isin(gated) & (df["status"] != "ok")]
    for _, row in bad.iterrows():
        msg = f" ({row['message']})" if row.get("message") else ""
        result.failures.append(f"{_label_of(row)}: status {row['status']}{msg}")
    n_ok = int((df["backend"].isin(gated) & (df["status"] == "ok")).sum())
    if bad.empty:
        result.checks.append(f"all {n_ok} rows of {', '.join(gated)} are ok")

    # Primary gate: in-run ratios against peers.
    for option, reqs in (("--min-speedup", min_speedups), ("--min-case-speedup", min_case_speedups)):
        for req in reqs:
            both = _ok_pairs(df, req)
            if both.empty:
                result.failures.append(f"{option} {req}: no case where both {req.subject} and {req.peer} are ok")
                continue
            ratios = (both["median_ms_p"] / both["median_ms_s"]).reset_index(drop=True)
            worst_i = int(ratios.idxmin())
            worst = f"{ratios[worst_i]:.2f}x at {_case_of(both.iloc[worst_i])}"
            if option == "--min-speedup":
                g = geomean(ratios.tolist())
                text = f"{option} {req}: geomean {fmt_geomean(g)} over {len(ratios)} cases (worst {worst})"
                passed = g >= req.ratio
            else:
                under = int((ratios < req.ratio).sum())
                text = f"{option} {req}: worst {worst}, {under} of {len(ratios)} cases under {req.ratio:g}x"
                passed = under == 0
            (result.checks if passed else result.failures).append(text)
    for req in max_memory:
        both = _ok_pairs(df, req)
        mem_s, mem_p = both["peak_mem_mb_s"], both["peak_mem_mb_p"]
        both = both[mem_s.notna() & mem_p.notna() & (mem_s > 0) & (mem_p > 0)]
        if both.empty:
            result.failures.append(f"--max-memory {req}: no case where both {req.subject} and {req.peer} are ok "
                                   "and recorded their peak memory")
            continue
        ratios = (both["peak_mem_mb_s"] / both["peak_mem_mb_p"]).reset_index(drop=True)
        top_i = int(ratios.idxmax())
        top = both.iloc[top_i]
        over = int((ratios > req.ratio).sum())
        text = (f"--max-memory {req}: largest {ratios[top_i]:.3f}x at {_case_of(top)} ({top['peak_mem_mb_s']:.1f} "
                f"against {top['peak_mem_mb_p']:.1f} MiB), {over} of {len(ratios)} cases over {req.ratio:g}x")
        (result.checks if over == 0 else result.failures).append(text)

    # Secondary gate: absolute times against a baseline of the same GPU model.
    if baseline is not None:
        cmp = compare(baseline, cur, min_effect=min_effect, backends=gated)
        result.comparison = cmp
        if not cmp.pairs:
            raise CompareError(
                f"no common rows between the baseline and {where} for {', '.join(gated)} "
                f"(matched on {', '.join(R.KEY_FIELDS)})"
            )
        # A baseline row the current run lacks was not measured: it cannot pass by being absent.
        for label in cmp.only_base:
            result.failures.append(f"{label}: in the baseline, missing from {where}")
        limit = 1 + max_regression
        regressions = [p for p in cmp.pairs if p.verdict == "SLOWER" and p.ratio > limit]
        for p in regressions:
            result.failures.append(
                f"{p.label}: {p.base_ms:.3f} -> {p.cur_ms:.3f} ms ({p.ratio - 1:+.1%}), "
                f"beyond --max-regression {max_regression:.1%}"
            )
        if not regressions:
            noisy = sum(p.verdict == "NOISY" for p in cmp.pairs)
            result.checks.append(
                f"no confirmed regression beyond {max_regression:.1%} in {len(cmp.pairs)} "
                f"matched rows ({noisy} noisy)"
            )
    result.code = EXIT_FAIL if result.failures else EXIT_OK
    return result


def _ok_pairs(df: pd.DataFrame, req: SpeedupRequirement) -> pd.DataFrame:
    """The cases where both backends of ``req`` ran ok with positive times: one row each, the subject's columns
    suffixed _s and the peer's _p."""
    s = df[(df["backend"] == req.subject) & (df["status"] == "ok")]
    p = df[(df["backend"] == req.peer) & (df["status"] == "ok")]
    both = s.merge(p, on=list(R.CASE_FIELDS), suffixes=("_s", "_p"))
    return both[(both["median_ms_s"] > 0) & (both["median_ms_p"] > 0)]


def _case_of(row) -> str:
    return f"{row['phase']} {row['preset_s']} {row['pattern']}"


# ---- baselines -------------------------------------------------------------------------------------

BASELINE_SUBJECT = "qla"  # a baseline is refused unless every row of ours in the run is ok
_GPU_SLUG = re.compile(r"[a-z0-9][a-z0-9-]*")


def baseline_path(gpu: str, root: str = "results/baselines") -> str:
    """``results/baselines/<gpu>.json``; ValueError for a name that is not a GPU slug (`h200`)."""
    if not isinstance(gpu, str) or not _GPU_SLUG.fullmatch(gpu):
        raise ValueError(f"--gpu must be a GPU slug like h200 (lower-case letters, digits, '-'), got {gpu!r}")
    return f"{root}/{gpu}.json"


def make_baseline(results: dict, source: str, gpu: str, backends: list[str] | None = None) -> dict:
    """A baseline document from one run: its env and run blocks, and only the ok rows of ``backends``
    (default: every backend of the run). ValueError (ResultsError for an invalid file) when the run is
    not valid, was measured on another GPU than ``gpu``, names a backend it lacks, or has a row of
    BASELINE_SUBJECT that is not ok (a baseline must not enshrine a wrong or missing result)."""
    from qlabench.envinfo import gpu_slug, utc_now

    R.validate(results, source, allow_empty=False)
    baseline_path(gpu)
    measured = gpu_slug(results["env"].get("gpu_name"))
    if measured != gpu:
        raise ValueError(f"{source} was measured on {results['env'].get('gpu_name') or 'the CPU'} ({measured}), "
                         f"not {gpu}")
    rows = results["rows"]
    have = list(dict.fromkeys(r["backend"] for r in rows))
    backends = list(dict.fromkeys(backends or have))
    missing = [b for b in backends if b not in have]
    if missing:
        raise ValueError(f"backend {missing[0]!r} is not in {source} (have: {', '.join(have)})")
    ours = [r for r in rows if r["backend"] == BASELINE_SUBJECT]
    if not ours:
        raise ValueError(f"{source} has no {BASELINE_SUBJECT} rows: a baseline gates {BASELINE_SUBJECT}")
    bad = [r for r in ours if r["status"] != "ok"]
    if bad:
        listed = "; ".join(f"{R.row_label(r)}: {r['status']}" for r in bad[:3])
        raise ValueError(f"refusing {source}: {len(bad)} of its {len(ours)} {BASELINE_SUBJECT} rows are not ok "
                         f"({listed}{'; ...' if len(bad) > 3 else ''})")
    kept = [r for r in rows if r["backend"] in backends and r["status"] == "ok"]
    run = {**results["run"], "baseline": {"source": source, "gpu": gpu, "backends": backends, "made": utc_now()}}
    doc = {"schema": R.SCHEMA, "env": dict(results["env"]), "run": run, "rows": kept}
    return R.validate(doc, f"baseline of {source}", allow_empty=False)
