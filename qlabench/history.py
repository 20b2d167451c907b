"""History of results across runs, with step detection and attribution.

Every results file under a directory is one run; runs are ordered by their timestamp (then commit).
For each case (phase, preset, pattern, gate profile) the subject's median time and its ratio over
each peer form series across runs. A step is a *sustained* shift: starting at run k, at least
`min_run` consecutive runs (default 2) all lie beyond the threshold on the same side of the level
of the runs before k. The threshold is the larger of a minimum effect (default 5%) and `k_noise`
times the runs' own dispersion (median relative half-width of p20-p80). A lone outlier never makes a
step; a shift seen only in the newest run is reported as unconfirmed.

Attribution, per step: if a peer's time stepped at the same run and that peer's version changed
there, the ratio moved because the *baseline moved*; if the subject's time stepped, *we regressed*
(or improved), noting any environment change (torch, tilelang, driver, ...) at that run.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from qlabench import results as R
from qlabench.report.frame import backends_in_order, collect, default_subject

DEFAULT_MIN_EFFECT = 0.05
DEFAULT_K_NOISE = 3.0
DEFAULT_MIN_RUN = 2
COMMIT_WIDTH = 7
# A results file named *.ab.json is an A/B run of a kernel variant under switches its rows do not record
# (files from before rows carried `options`): kept out of the timeline, like rows with kernel options.
AB_SUFFIX = ".ab.json"

# Row backend -> env.versions key (the library whose version change moves that backend's times).
BACKEND_VERSION_KEY = {"qla": "qlabench", "fla": "fla", "flash_qla": "flash_qla", "torch": "torch"}
ENV_KEYS = ("torch", "triton", "tilelang", "driver", "cuda")


# ---- step detection ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """A sustained change starting at ``index`` (position in the series)."""

    index: int
    before: float
    after: float
    confirmed: bool  # False: only the newest run(s), fewer than min_run of them

    @property
    def change(self) -> float:
        return self.after / self.before - 1


def detect_steps(
    values: list[float | None],
    noise: list[float | None] | None = None,
    min_effect: float = DEFAULT_MIN_EFFECT,
    k_noise: float = DEFAULT_K_NOISE,
    min_run: int = DEFAULT_MIN_RUN,
) -> list[Step]:
    """Find sustained level shifts in a positive series (None entries are skipped).

    Args:
        values: the series, oldest first (times in ms, or ratios).
        noise: relative dispersion per point (e.g. (p80 - p20) / 2 / median); None = unknown.
        min_effect: smallest relative change called a step.
        k_noise: the threshold is at least this many times the median dispersion.
        min_run: how many consecutive runs must agree before a step is confirmed.
    """
    if min_run < 1:
        raise ValueError(f"min_run must be >= 1, got {min_run!r}")
    idx = [i for i, v in enumerate(values) if v is not None and v > 0]
    vals = [float(values[i]) for i in idx]
    rel = [float(noise[i]) for i in idx if noise and noise[i] is not None] if noise else []
    thresh = max(min_effect, k_noise * statistics.median(rel)) if rel else min_effect
    steps: list[Step] = []
    start = 0  # first point of the current segment (positions in vals)
    i = 1
    while i < len(vals):
        level = statistics.median(vals[start:i])
        side = _side(vals[i], level, thresh)
        if side == 0:
            i += 1
            continue
        run = 1
        while i + run < len(vals) and _side(vals[i + run], level, thresh) == side:
            run += 1
        if run >= min_run:
            after = statistics.median(vals[i : i + run])
            steps.append(Step(idx[i], level, after, True))
            start, i = i, i + run
        elif i + run == len(vals):  # the shift reaches the newest run but is too short to confirm
            steps.append(Step(idx[i], level, statistics.median(vals[i:]), False))
            break
        else:  # an outlier: skip it, keep the level
            i += 1
    return steps


def _side(v: float, level: float, thresh: float) -> int:
    r = v / level - 1
    return 1 if r > thresh else (-1 if r < -thresh else 0)


# ---- runs ------------------------------------------------------------------------------------------


@dataclass
class Run:
    path: str
    timestamp: str
    commit: str
    env: dict
    df: pd.DataFrame
    # (case label, backend) -> the row's (status, median_ms, p20_ms, p80_ms); built once per run, so a
    # history is linear in rows
    index: dict = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        # commits are stored full or short (7): always 7 hex digits
        return f"{self.timestamp[:19]} {self.commit[:COMMIT_WIDTH]}"


def load_runs(results_dir: str | Path, skipped: list[tuple[str, str]] | None = None) -> list[Run]:
    """Every results file under ``results_dir`` (recursively), oldest first. JSON of another schema is
    passed over; a results file that is invalid or has no rows (``qlabench.results.validate``) is left
    out and, when ``skipped`` is a list, appended to it as (path, reason)."""
    root = Path(results_dir)
    if not root.is_dir():
        raise ValueError(f"not a directory: {str(root)!r}")
    runs = []
    for path in sorted(root.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            continue
        if not isinstance(data, dict) or data.get("schema") != R.SCHEMA:
            continue
        try:
            R.validate(data, str(path), allow_empty=False)
        except R.ResultsError as exc:
            if skipped is not None:
                skipped.append((str(path), str(exc)))
            continue
        col = collect(data)
        env = col.env
        runs.append(
            Run(str(path), str(env.get("timestamp") or ""), str(env.get("git_commit") or ""), env, col.df)
        )
    if not runs:
        raise ValueError(f"no qlabench results files with rows (schema {R.SCHEMA}) under {str(root)!r}")
    runs.sort(key=lambda r: (r.timestamp, r.commit, r.path))
    return runs


def timeline(runs: list[Run], variants: bool = False) -> tuple[list[Run], list[str]]:
    """The runs a history follows, and one note per file or row set left out. Rules:

    * a run without a GPU name (a CPU smoke run) is left out: its times are not GPU figures;
    * unless ``variants``, an A/B run is left out: rows whose backend carries kernel options
      (``qla:bwd_dh=ws``, ``results.backend_key``), and whole files named ``*.ab.json``;
    * a copy is counted once: a file whose rows (identity and median) all appear in another file of
      the same GPU, commit and timestamp (``results/baselines/h200.json`` after ``baseline update``)
      is dropped in favour of that file.
    """
    notes, kept = [], []
    for run in runs:
        if not run.env.get("gpu_name"):
            notes.append(f"left out {run.path}: no GPU (a CPU run)")
            continue
        if not variants and run.path.endswith(AB_SUFFIX):
            notes.append(f"left out {run.path}: an A/B variant file (*{AB_SUFFIX}; --variants keeps it)")
            continue
        if not variants and len(run.df):
            keys = [R.backend_key(r) for r in run.df.to_dict("records")]
            plain = [":" not in k for k in keys]
            if not all(plain):
                names = sorted({k for k, p in zip(keys, plain) if not p})
                notes.append(f"left out {len(plain) - sum(plain)} rows of {run.path}: kernel variants "
                             f"{', '.join(names)} (--variants keeps them)")
                run.df = run.df[plain].reset_index(drop=True)
                if not len(run.df):
                    continue
        kept.append(run)
    prints = {id(r): _fingerprint(r) for r in kept}
    out = []
    for run in kept:
        same = [o for o in kept if o is not run and _same_run(o, run) and prints[id(run)] <= prints[id(o)]]
        # keep the larger file; between equal ones, the one outside a baselines/ folder, then by path
        better = [o for o in same if (len(prints[id(o)]), "baselines" not in Path(o.path).parts, o.path)
                  > (len(prints[id(run)]), "baselines" not in Path(run.path).parts, run.path)
                  or prints[id(o)] != prints[id(run)]]
        if better:
            notes.append(f"left out {run.path}: a copy of {better[0].path} (same commit, timestamp and rows)")
            continue
        out.append(run)
    return out, notes


def _same_run(a: Run, b: Run) -> bool:
    return (a.timestamp, a.commit[:COMMIT_WIDTH], a.env.get("gpu_name")) == \
        (b.timestamp, b.commit[:COMMIT_WIDTH], b.env.get("gpu_name"))


def _fingerprint(run: Run) -> frozenset:
    """(row identity, status, median) of every row: two files holding the same measurements match."""
    recs = run.df.to_dict("records")
    return frozenset((R.row_key(r), r.get("status"), None if pd.isna(r.get("median_ms")) else float(r["median_ms"]))
                     for r in recs)


def _version(run: Run, backend: str) -> str | None:
    rows = run.df[run.df["backend"] == backend]
    if "backend_version" in rows.columns:
        vals = [v for v in rows["backend_version"] if isinstance(v, str) and v]
        if vals:
            return vals[0]
    key = BACKEND_VERSION_KEY.get(backend, backend)
    return (run.env.get("versions") or {}).get(key)


def _env_changes(prev: Run, run: Run) -> list[str]:
    out = []
    pv, cv = prev.env.get("versions") or {}, run.env.get("versions") or {}
    for k in ENV_KEYS:
        a = pv.get(k, prev.env.get(k))
        b = cv.get(k, run.env.get(k))
        if a != b:
            out.append(f"{k} {a} -> {b}")
    return out


# ---- per-case history ----------------------------------------------------------------------------------


@dataclass
class CaseHistory:
    case: str  # "fwd hk16_hv16 1x32768 [default]"
    runs: list[str]  # run labels, oldest first
    subject: str
    times: list[float | None]
    noise: list[float | None]
    ratios: dict[str, list[float | None]]  # peer -> peer time / subject time per run
    peer_times: dict[str, list[float | None]]
    events: list[str] = field(default_factory=list)
    step_runs: list[int] = field(default_factory=list)


def _case_labels(df: pd.DataFrame) -> list[str]:
    """``qlabench.results.case_label`` per row (`fwd hk16_hv16 1x32768 [bench]`), in one pass."""
    fields = [c for c in (*R.CASE_FIELDS, "preset") if c in df.columns]
    return [R.case_label(dict(zip(fields, vals))) for vals in zip(*(df[c].tolist() for c in fields))]


def _index(df: pd.DataFrame) -> dict:
    """(case label, backend) -> (status, median, p20, p80) in one pass; later rows win, as in reports."""
    cols = [df[c].tolist() for c in ("_case", "backend", "status", "median_ms", "p20_ms", "p80_ms")]
    return {(case, str(b)): (st, m, lo, hi) for case, b, st, m, lo, hi in zip(*cols)}


def _series(runs: list[Run], case: str, backend: str) -> tuple[list[float | None], list[float | None]]:
    times, noise = [], []
    for run in runs:
        row = run.index.get((case, backend))
        if row is None or row[0] != "ok" or pd.isna(row[1]) or not row[1] > 0:
            times.append(None)
            noise.append(None)
            continue
        _, m, lo, hi = row
        m = float(m)
        times.append(m)
        noise.append((float(hi) - float(lo)) / 2 / m if not (pd.isna(lo) or pd.isna(hi)) else None)
    return times, noise


def build_history(
    runs: list[Run],
    subject: str | None = None,
    cfg: list[str] | None = None,
    phases: list[str] | None = None,
    min_effect: float = DEFAULT_MIN_EFFECT,
    k_noise: float = DEFAULT_K_NOISE,
    min_run: int = DEFAULT_MIN_RUN,
) -> list[CaseHistory]:
    """Series and steps per case. ``cfg`` entries are substrings matched against the case label
    (e.g. `hk16_hv16`, `1x32768`); a case is kept when it matches every entry."""
    for run in runs:
        run.df = run.df.copy()
        run.df["_case"] = _case_labels(run.df) if len(run.df) else []
        run.index = _index(run.df)
    all_df = pd.concat([r.df for r in runs], ignore_index=True)
    subject = subject or default_subject(all_df)
    backends = backends_in_order(all_df)
    if subject not in backends:
        raise ValueError(f"subject backend {subject!r} is not in any run (have: {', '.join(backends)})")
    peers = [b for b in backends if b != subject]
    cases = list(dict.fromkeys(all_df["_case"]))
    if phases:
        cases = [c for c in cases if c.split(" ", 1)[0] in phases]
    for pat in cfg or []:
        cases = [c for c in cases if pat in c]
    labels = [r.label for r in runs]
    out = []
    for case in cases:
        times, noise = _series(runs, case, subject)
        if all(t is None for t in times):
            continue
        peer_times = {p: _series(runs, case, p)[0] for p in peers}
        ratios = {p: [(pt / t if (pt and t) else None) for pt, t in zip(peer_times[p], times)] for p in peers}
        h = CaseHistory(case, labels, subject, times, noise, ratios, peer_times)
        kw = {"min_effect": min_effect, "k_noise": k_noise, "min_run": min_run}
        own_steps = detect_steps(times, noise, **kw)
        for s in own_steps:
            prev = runs[s.index - 1] if s.index else runs[s.index]
            word = (
                ("we regressed" if s.change > 0 else "we improved") if s.confirmed else "unconfirmed change"
            )
            env = _env_changes(prev, runs[s.index])
            extra = f"; environment changed: {', '.join(env)}" if env else ""
            h.events.append(
                (
                    s.index,
                    (f"{labels[s.index]}: {subject} {s.before:.3f} -> {s.after:.3f} ms "
                    f"({s.change:+.1%}) {word}{extra}"),
                )
            )
            h.step_runs.append(s.index)
        own = {s.index for s in own_steps}
        for p in peers:
            for s in detect_steps(peer_times[p], None, **kw):
                if s.index in own:
                    continue
                prev = runs[s.index - 1] if s.index else runs[s.index]
                va, vb = _version(prev, p), _version(runs[s.index], p)
                why = (
                    f"baseline moved ({p} {va} -> {vb})"
                    if va != vb
                    else f"{p} changed with no version change"
                )
                if not s.confirmed:
                    why = "unconfirmed: " + why
                h.events.append(
                    (
                        s.index,
                        (f"{labels[s.index]}: {p} {s.before:.3f} -> {s.after:.3f} ms ({s.change:+.1%}), "
                        f"ratio {subject}/{p} moved: {why}"),
                    )
                )
                h.step_runs.append(s.index)
        order = sorted(range(len(h.events)), key=lambda j: h.events[j][0])
        h.events = [h.events[j][1] for j in order]
        out.append(h)
    return out


def format_history(hist: list[CaseHistory]) -> str:
    if not hist:
        return "no cases match\n"
    out = []
    for h in hist:
        peers = list(h.ratios)
        out.append(
            f"== {h.case}: {h.subject} median ms" + (f", ratio vs {', '.join(peers)}" if peers else "")
        )
        for i, label in enumerate(h.runs):
            t = f"{h.times[i]:.3f}" if h.times[i] else "-"
            rs = "  ".join(f"{h.ratios[p][i]:.2f}x" if h.ratios[p][i] else "-" for p in peers)
            mark = "  <- step" if i in h.step_runs else ""
            out.append(f"  {label:<28} {t:>9}  {rs}{mark}")
        out += [f"  * {e}" for e in h.events] or ["  no sustained change"]
        out.append("")
    return "\n".join(out)


def plot_history(hist: list[CaseHistory], path: str | Path, gpu: str | None = None) -> Path:
    """Subject time (top) and ratio over each peer (bottom) per case across runs, steps marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not hist:
        raise ValueError("no cases to plot")
    fig, (ax_t, ax_r) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    x = list(range(len(hist[0].runs)))
    for k, h in enumerate(hist):
        colour = plt.get_cmap("tab10")(k % 10)
        ax_t.plot(x, [t if t else float("nan") for t in h.times], marker="o", color=colour, label=h.case)
        for p, rs in h.ratios.items():
            ax_r.plot(
                x,
                [r if r else float("nan") for r in rs],
                marker="s",
                linestyle="--",
                color=colour,
                label=f"{h.case} vs {p}",
            )
        for i in h.step_runs:
            ax_t.axvline(i - 0.5, color=colour, alpha=0.5, linestyle=":")
            ax_r.axvline(i - 0.5, color=colour, alpha=0.5, linestyle=":")
    ax_t.set_ylabel(f"{hist[0].subject} median latency (ms)")
    ax_r.set_ylabel("peer time / subject time (x)")
    ax_r.axhline(1.0, color="black", linewidth=0.8)
    ax_r.set_xticks(x, hist[0].runs, rotation=30, ha="right", fontsize=7)
    ax_r.set_xlabel("run (timestamp, commit); dotted line = detected step")
    ax_t.legend(fontsize=7)
    ax_r.legend(fontsize=7)
    ax_t.grid(alpha=0.3)
    ax_r.grid(alpha=0.3)
    fig.suptitle(f"{gpu or 'GPU unknown'}: history of {hist[0].subject}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def history(results_dir: str | Path, variants: bool = False, **kw: Any) -> tuple[list[Run], list[CaseHistory]]:
    runs, _ = timeline(load_runs(results_dir), variants=variants)
    return runs, build_history(runs, **kw)
