"""Results files: schema ``qlabench.results/1``, atomic save, validating load, pandas view.

A results file is one JSON object::

    {"schema": "qlabench.results/1",
     "env":  {...},   # qlabench/envinfo.py: GPU, clocks, driver, CUDA, library versions, git commit
     "run":  {...},   # how the run was asked for: argv, sweep, phases, backends, timer, ...
     "rows": [{...}]} # one per (case, backend), fields in ROW_FIELDS

Times are milliseconds per call; ``first_call_s`` is seconds; ``peak_mem_mb`` is MiB; ``errors``
holds the relative L2 error of each checked tensor against the float64 reference. Time fields are
null for ``error`` and ``unavailable`` rows. The README's "Running benchmarks" section documents
every field.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

SCHEMA = "qlabench.results/1"
STATUSES = ("ok", "incorrect", "error", "unavailable")

ENV_FIELDS = (
    "gpu_name", "gpu_uuid", "compute_capability", "sm_count", "driver", "cuda", "clocks_start",
    "clocks_end", "versions", "git_commit", "git_dirty", "timestamp", "hostname", "device",
)
RUN_FIELDS = (
    "argv", "sweep", "arch", "seed", "phases", "backends", "gate_profile", "timer", "warmup",
    "repeats", "l2_policy", "quick", "tolerance",
)
TIME_FIELDS = ("median_ms", "p20_ms", "p80_ms", "min_ms", "mean_ms", "std_ms")
ROW_FIELDS = (
    "phase", "preset", "model", "h_qk", "h_v", "pattern", "seqlens", "total_tokens", "n_seqs",
    "gate_profile", "dtype", "backend", "status", *TIME_FIELDS, "samples", "timer", "l2_policy",
    "first_call_s", "peak_mem_mb", "errors", "message", "backend_version", "timestamp",
)
# Added after the first files were written: make_row fills them, load() does not require them (older
# files lack them). gpu_index / gpu_uuid: the GPU the row ran on (index as the run numbered the visible
# GPUs); worker: the worker process of a sharded run (qlabench/shard.py), null in a one-process run.
OPTIONAL_ROW_FIELDS = ("gpu_index", "gpu_uuid", "worker")
# A row is identified by these fields (--resume, compare): one measurement per key in a file.
KEY_FIELDS = ("phase", "preset", "pattern", "gate_profile", "backend")


class ResultsError(ValueError):
    """A results file that is not valid ``qlabench.results/1``; the message names file and field."""


def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in KEY_FIELDS)


def new_results(env: dict, run: dict) -> dict:
    return {"schema": SCHEMA, "env": dict(env), "run": dict(run), "rows": []}


def make_row(**fields) -> dict:
    """A row with every ROW_FIELDS and OPTIONAL_ROW_FIELDS key present (missing ones None); extra keys
    are kept."""
    unknown_status = fields.get("status")
    if unknown_status not in STATUSES:
        raise ValueError(f"row status must be one of {STATUSES}, got {unknown_status!r}")
    row = {k: None for k in ROW_FIELDS + OPTIONAL_ROW_FIELDS}
    row["errors"] = {}
    row["message"] = ""
    row.update(fields)
    return row


def save(results: dict, path) -> Path:
    """Writes ``results`` to ``path`` atomically (temp file in the same folder + os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_finite_or_none(results), f, indent=1, allow_nan=False, default=_jsonable)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _finite_or_none(x):
    """NaN/Inf have no JSON spelling: they are stored as null (the row's message names them)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite_or_none(v) for v in x]
    return x


def _jsonable(x):
    if hasattr(x, "item"):  # numpy / torch scalars
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


def validate(results, source: str = "<results>") -> dict:
    """Checks the schema tag, the three blocks and every row's required fields and status."""
    if not isinstance(results, dict):
        raise ResultsError(f"{source}: expected a JSON object, got {type(results).__name__}")
    if results.get("schema") != SCHEMA:
        raise ResultsError(f"{source}: schema is {results.get('schema')!r}, expected {SCHEMA!r}")
    for block in ("env", "run"):
        if not isinstance(results.get(block), dict):
            raise ResultsError(f"{source}: missing or non-object '{block}' block")
    rows = results.get("rows")
    if not isinstance(rows, list):
        raise ResultsError(f"{source}: 'rows' must be a list")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ResultsError(f"{source}: rows[{i}] is not an object")
        missing = [k for k in ROW_FIELDS if k not in row]
        if missing:
            raise ResultsError(f"{source}: rows[{i}] lacks fields {missing}")
        if row["status"] not in STATUSES:
            raise ResultsError(f"{source}: rows[{i}].status = {row['status']!r}, expected one of {STATUSES}")
        if row["status"] in ("ok", "incorrect") and row["median_ms"] is None:
            raise ResultsError(f"{source}: rows[{i}] is {row['status']} but has no median_ms")
    return results


def load(path) -> dict:
    """Reads and validates a results file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such results file") from None
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON: {e}") from None
    return validate(data, str(path))


def upsert_row(results: dict, row: dict) -> None:
    """Adds ``row``, replacing an earlier row with the same key (a re-run of an error row)."""
    key = row_key(row)
    rows = results["rows"]
    for i, old in enumerate(rows):
        if row_key(old) == key:
            rows[i] = row
            return
    rows.append(row)


def to_dataframe(results_or_paths):
    """Rows of one or more results (dicts or paths) as a pandas DataFrame.

    Adds the columns ``source`` (file path or index), ``gpu_name``, ``git_commit`` and ``run_timestamp``
    from each file's env block; ``seqlens`` stays a list, ``errors`` a dict, and ``max_error`` is the
    largest per-tensor error (NaN when none was checked). Rows of files written before
    OPTIONAL_ROW_FIELDS existed get None there.
    """
    import pandas as pd

    items = results_or_paths
    if isinstance(items, (dict, str, os.PathLike)):
        items = [items]
    records = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            res, source = validate(item, f"<results {i}>"), f"<results {i}>"
        else:
            res, source = load(item), str(item)
        env = res["env"]
        for row in res["rows"]:
            rec = {k: None for k in OPTIONAL_ROW_FIELDS}
            rec.update(row)
            errs = [v for v in (row.get("errors") or {}).values() if v is not None]
            rec["max_error"] = max(errs) if errs else math.nan
            rec["source"] = source
            rec["gpu_name"] = env.get("gpu_name")
            rec["git_commit"] = env.get("git_commit")
            rec["run_timestamp"] = env.get("timestamp")
            records.append(rec)
    columns = [*ROW_FIELDS, *OPTIONAL_ROW_FIELDS, "max_error", "source", "gpu_name", "git_commit",
               "run_timestamp"]
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return pd.DataFrame(columns=columns)
    extra = [c for c in df.columns if c not in columns]
    return df[columns + extra]
