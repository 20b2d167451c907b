"""Results files -> one pandas frame that reports, comparisons and the gate all read.

A results file (schema ``qlabench.results/1``) holds ``env`` (the machine), ``run`` (the options) and
``rows`` (one per phase x case x backend). Reports may combine several files (a fwd run and a bwd
run, say); the frame keeps every row and adds, per row, the file it came from and the GPU it ran on,
so nothing downstream has to walk the nested JSON again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

# The schema, its validation and row identity live in qlabench/results.py (one definition); the
# names are re-exported here for the report modules.
from qlabench.results import (
    CASE_FIELDS,
    KEY_DEFAULTS,
    KEY_FIELDS,
    SCHEMA,  # noqa: F401 - re-exported
    TIME_FIELDS,
    ResultsError,
    load,
    validate,
)

# Row fields the report relies on; a frame missing one of them is not results rows we can read.
REQUIRED_ROW_FIELDS = ("phase", "h_qk", "h_v", "pattern", "backend", "status")

# Identity of a case within a run: two rows with the same key measure the same thing.
CASE_KEY = CASE_FIELDS


@dataclass
class Collected:
    """Several results files read together.

    Attributes:
        envs: the ``env`` block of each file, in input order.
        runs: the ``run`` block of each file, in input order.
        sources: a label per file (its path, or ``<results N>`` for in-memory dicts).
        df: every row of every file, plus ``source`` (file label), ``gpu_name`` and ``run_timestamp``.
    """

    envs: list[dict] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    df: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def env(self) -> dict:
        """The first file's env (the one a report header describes)."""
        return self.envs[0] if self.envs else {}

    @property
    def run(self) -> dict:
        return self.runs[0] if self.runs else {}


def read_results(path: str | Path) -> dict:
    """Read and check one results file with rows; raises :class:`ResultsError` naming the file and the
    problem (``qlabench.results.load``)."""
    return load(path, allow_empty=False)


def check_results(data: Any, label: str = "<results>") -> dict:
    """Check that ``data`` is a ``qlabench.results/1`` document with rows and return it."""
    return validate(data, label, allow_empty=False)


def _as_results_dict(obj: Any) -> dict | None:
    """Accept a results object from `qlabench.results` too (anything with ``to_dict``/``as_dict``)."""
    if isinstance(obj, dict):
        return obj
    for name in ("to_dict", "as_dict", "to_json_dict"):
        fn = getattr(obj, name, None)
        if callable(fn):
            out = fn()
            if isinstance(out, dict):
                return out
    return None


def collect(sources: Any) -> Collected:
    """Read results from paths, results dicts, a DataFrame, or a list of any of those.

    A DataFrame is taken as already-flattened rows (no env); it must carry the row fields.
    """
    if isinstance(sources, Collected):
        return sources
    if isinstance(sources, pd.DataFrame):
        missing = [k for k in REQUIRED_ROW_FIELDS if k not in sources.columns]
        if missing:
            raise ResultsError(f"results frame lacks columns {', '.join(missing)}")
        df = _normalise(sources.copy())
        return Collected(envs=[], runs=[], sources=["<frame>"], df=df)
    if isinstance(sources, (str, Path)) or _as_results_dict(sources) is not None:
        sources = [sources]
    out = Collected()
    frames = []
    for i, src in enumerate(sources):
        if isinstance(src, (str, Path)):
            data, label = read_results(src), str(src)
        else:
            data = _as_results_dict(src)
            label = f"<results {i}>"
            if data is None:
                raise ResultsError(f"{label}: cannot read a {type(src).__name__} as results")
            check_results(data, label)
        env = data.get("env") or {}
        out.envs.append(env)
        out.runs.append(data.get("run") or {})
        out.sources.append(label)
        frame = pd.DataFrame(data["rows"])
        frame["source"] = label
        frame["gpu_name"] = env.get("gpu_name")
        frame["run_timestamp"] = env.get("timestamp")
        frames.append(frame)
    if not frames:
        raise ResultsError("no results files given")
    out.df = _normalise(pd.concat(frames, ignore_index=True))
    return out


def _normalise(df: pd.DataFrame) -> pd.DataFrame:
    """Fill optional columns so later code can index them without guarding each access."""
    for col in ("preset", "model", "gate_profile", "dtype", "message", "timer", "l2_policy"):
        if col not in df.columns:
            df[col] = None
    for col, default in KEY_DEFAULTS.items():  # identity fields newer than some files: their default
        df[col] = df[col].where(df[col].notna(), default) if col in df.columns else default
    if "preset" in df.columns:
        missing = df["preset"].isna()
        if missing.any():
            df.loc[missing, "preset"] = [
                f"hk{int(q)}_hv{int(v)}" for q, v in zip(df.loc[missing, "h_qk"], df.loc[missing, "h_v"])
            ]
    for col in TIME_FIELDS + ("total_tokens", "n_seqs", "peak_mem_mb", "first_call_s"):
        if col not in df.columns:
            df[col] = float("nan")
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("h_qk", "h_v"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    if "seqlens" not in df.columns:
        df["seqlens"] = None

    # total_tokens / n_seqs may be absent in hand-made frames: derive them from seqlens.
    def _lens(s):
        return list(s) if isinstance(s, (list, tuple)) and len(s) > 0 else None

    lens = df["seqlens"].apply(_lens)
    derived_t = lens.apply(lambda s: float(sum(s)) if s else float("nan"))
    derived_n = lens.apply(lambda s: float(len(s)) if s else float("nan"))
    df["total_tokens"] = df["total_tokens"].astype(float).fillna(derived_t)
    df["n_seqs"] = df["n_seqs"].astype(float).fillna(derived_n)
    df["status"] = df["status"].fillna("error").astype(str)
    return df


def dedupe_latest(df: pd.DataFrame) -> pd.DataFrame:
    """When files overlap, keep the last row per (case, backend): later files win."""
    key = [c for c in KEY_FIELDS if c in df.columns]
    return df.drop_duplicates(subset=key, keep="last").reset_index(drop=True)


def backends_in_order(df: pd.DataFrame) -> list[str]:
    """Backends in order of first appearance (the order the run used)."""
    return list(dict.fromkeys(df["backend"].astype(str)))


def default_subject(df: pd.DataFrame) -> str | None:
    """`qla` when it has at least one ok row, else the first backend."""
    names = backends_in_order(df)
    if not names:
        return None
    if "qla" in names and ((df["backend"] == "qla") & (df["status"] == "ok")).any():
        return "qla"
    return names[0]
