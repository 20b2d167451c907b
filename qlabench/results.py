"""Results files: schema ``qlabench.results/1``, atomic save, validating load, pandas view.

A results file is one JSON object::

    {"schema": "qlabench.results/1",
     "env":  {...},   # qlabench/envinfo.py: GPU, clocks, driver, CUDA, library versions, git commit
     "run":  {...},   # how the run was asked for: argv, sweep, phases, backends, timer, ...
     "rows": [{...}]} # one per (case, backend), fields in ROW_FIELDS

Times are milliseconds per call; ``first_call_s`` is seconds; ``peak_mem_mb`` is MiB; ``errors``
holds the relative L2 error of each checked tensor against the float64 reference. Time fields are
null for ``error``, ``unavailable`` and ``timeout`` rows. docs/results-format.md documents every field.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path

from .recipe import DEFAULT_BETA_PROFILE, DEFAULT_H0_SCALE, inputs_label

SCHEMA = "qlabench.results/1"
STATUSES = ("ok", "incorrect", "error", "unavailable", "timeout")
TIMED_STATUSES = ("ok", "incorrect")  # rows that carry a measured time (an incorrect row is still timed)
PHASES = ("fwd", "bwd", "fwdbwd")

ENV_FIELDS = (
    "gpu_name", "gpu_uuid", "compute_capability", "sm_count", "driver", "cuda", "clocks_start",
    "clocks_end", "versions", "git_commit", "git_dirty", "timestamp", "hostname", "device",
)
RUN_FIELDS = (
    "argv", "sweep", "arch", "seed", "phases", "backends", "gate_profile", "timer", "warmup",
    "repeats", "l2_policy", "quick", "tolerance",
)
# Settings of the `run` block that change what a row measures: `--resume` refuses a file recorded with
# other values (rows measured under two settings must not share one file).
MEASUREMENT_SETTINGS = ("device", "seed", "with_h0", "tolerance", "warmup", "repeats", "timer",
                        "l2_policy", "quick", "cpu_max_tokens", "option_defaults")
TIME_FIELDS = ("median_ms", "p20_ms", "p80_ms", "min_ms", "mean_ms", "std_ms")
# A time outside [1 ns, 1 h] per call is not a measurement this suite makes: the file is corrupt.
MIN_TIME_MS, MAX_TIME_MS = 1e-6, 3.6e6
ROW_FIELDS = (
    "phase", "preset", "model", "h_qk", "h_v", "pattern", "seqlens", "total_tokens", "n_seqs",
    "gate_profile", "dtype", "backend", "status", *TIME_FIELDS, "samples", "timer", "l2_policy",
    "first_call_s", "peak_mem_mb", "errors", "message", "backend_version", "timestamp",
)
# Added after the first files were written: make_row fills them, load() does not require them (older
# files lack them). gpu_index / gpu_uuid: the GPU the row ran on (index as the run numbered the visible
# GPUs); worker: the worker process of a sharded run (qlabench/shard.py), null in a one-process run.
# options: the kernel options of a `qla` row (qlabench.kernels.KernelOptions as a dict; null for other
# backends; a qla row without it ran the default kernels of its commit). kernel_split: `run --kernel-split`'s device
# time per kernel name, microseconds per call ({kernel: us}), null when not asked for.
OPTIONAL_ROW_FIELDS = ("gpu_index", "gpu_uuid", "worker", "options", "kernel_split")
# Row identity, the one definition (resume, report, compare, gate, history): a case is these fields,
# a row is a case and a backend; a file holds at most one row per key. The preset name is not part of
# it: presets are named hk<h_qk>_hv<h_v> (config.load_presets checks), so h_qk and h_v say the same.
# beta_profile and h0_scale (the input recipe beyond the gate, qlabench/workload.py) came later: a row
# without them has the default recipe, KEY_DEFAULTS (qlabench/recipe.py). The backend field of the key
# is the name the run gave the row (backend_key): `qla` = the default kernels of the run's commit, a
# variant `qla:cp=on` = the options that differ from those defaults, so rows of two variants never match.
# A file records the defaults its names are relative to (run.option_defaults); files written before
# that (before cp's default became auto) are relative to LEGACY_OPTION_DEFAULTS. A retired option
# (kernels.options.RETIRED: kkt) is read out of both: `qla` of an old file is `qla` of a new one.
KEY_DEFAULTS = {"beta_profile": DEFAULT_BETA_PROFILE, "h0_scale": DEFAULT_H0_SCALE}
CASE_FIELDS = ("phase", "h_qk", "h_v", "pattern", "gate_profile", "dtype", *KEY_DEFAULTS)
KEY_FIELDS = (*CASE_FIELDS, "backend")
_INT_KEYS = ("h_qk", "h_v")


LEGACY_OPTION_DEFAULTS = {"cp": "off", "fwd_kernel": "auto", "bwd_dh": "auto", "bwd_cp": "auto",
                          "bwd_masks": "forward"}


class ResultsError(ValueError):
    """A results file that is not valid ``qlabench.results/1``; the message names file and field."""


def options_label(options, defaults: dict | None = None) -> str:
    """``cp=on+bwd_dh=ws`` for a row's ``options`` dict (the kernel options that differ from
    ``defaults``, None: today's; a retired one as stored: kernels.options.stored_label), ``""`` for the
    defaults or none. ValueError for an unknown option or value."""
    if not isinstance(options, dict) or not options:
        return ""
    from .kernels.options import stored_label  # only rows with options pay for this import

    return stored_label(options, defaults)


def option_defaults(run: dict | None) -> dict:
    """The kernel-option defaults a file's backend names are relative to: its ``run.option_defaults``
    without the retired options (kernels.options.RETIRED), options added after the file at today's
    defaults, else (files written before it was recorded) LEGACY_OPTION_DEFAULTS."""
    recorded = (run or {}).get("option_defaults")
    if not isinstance(recorded, dict):
        return dict(LEGACY_OPTION_DEFAULTS)
    from .kernels.options import (  # only files that record their defaults pay for this import
        DEFAULTS,
        RETIRED,
    )

    # an option added after the file was written (bwd_masks, session 21) is read at today's default: the
    # file's `qla` is still the default kernels of its commit
    return {**{k: v for k, v in DEFAULTS.items() if k not in recorded},
            **{k: v for k, v in recorded.items() if k not in RETIRED}}


def backend_key(row) -> str:
    """The backend a row measured, as its run named it: ``qla`` (the default kernels of the run's
    commit), ``qla:cp=on+bwd_dh=ws`` (a variant). ``check_row`` makes sure the name agrees with the row's
    ``options`` and its file's defaults."""
    return str(row.get("backend"))


def _key(row, fields) -> tuple:
    out = []
    for k in fields:
        if k == "backend":
            out.append(backend_key(row))
            continue
        v = row.get(k)
        if v is None or (isinstance(v, float) and math.isnan(v)):  # NaN: a pandas cell without a value
            v = KEY_DEFAULTS.get(k)
        if v is not None:
            v = int(v) if k in _INT_KEYS else (float(v) if k == "h0_scale" else str(v))
        out.append(v)
    return tuple(out)


def case_key(row) -> tuple:
    """The case a row (dict or pandas row) measured: CASE_FIELDS, h_qk / h_v as int, h0_scale as float,
    the rest str, KEY_DEFAULTS where a field is absent."""
    return _key(row, CASE_FIELDS)


def row_key(row) -> tuple:
    """A row's identity (KEY_FIELDS): its case and backend, the backend with its kernel options
    (backend_key)."""
    return _key(row, KEY_FIELDS)


def case_label(row) -> str:
    """`fwd hk16_hv16 1x32768 [bench]`; a dtype other than bfloat16 and a recipe other than the default
    are added (`[qwen beta=near1 h0x100] float16`)."""
    phase = case_key(row)[0]
    return f"{phase} {case_name(row)}"


def case_name(row) -> str:
    """case_label without the phase: `hk16_hv16 1x32768 [qwen beta=near1]`."""
    _, h_qk, h_v, pattern, gate, dtype, beta, h0 = case_key(row)
    preset = row.get("preset") or f"hk{h_qk}_hv{h_v}"
    return f"{preset} {pattern} [{inputs_label(gate, beta, h0)}]" + (f" {dtype}" if dtype != "bfloat16" else "")


def row_label(row) -> str:
    """`fwd hk16_hv16 1x32768 [bench] qla`: case_label and the backend."""
    return f"{case_label(row)} {row.get('backend')}"


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


def write_atomic(path, text: str) -> Path:
    """Writes ``text`` to ``path`` atomically (temp file in the same folder, fsync, os.replace), creating the
    folder if it is missing: a reader sees the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save(results: dict, path) -> Path:
    """Writes ``results`` to ``path`` atomically (write_atomic)."""
    return write_atomic(path, json.dumps(as_stored(results), indent=1, allow_nan=False, default=_jsonable) + "\n")


class OutputLock:
    """An exclusive lock on a results file for the length of a run: ``fcntl.flock`` on the sidecar
    ``<out>.lock`` (holding our PID). A second run on the same file is refused (ResultsError naming the
    holder) instead of both writing it and one losing its rows. The sidecar is removed on release.

    POSIX advisory lock: it binds qlabench processes (sharded runs: the parent holds it for its
    workers); a file system without flock support (some network mounts) raises OSError on acquire.
    """

    def __init__(self, out):
        self.out = Path(out)
        self.path = self.out.with_name(self.out.name + ".lock")
        self.fd: int | None = None

    def acquire(self) -> OutputLock:
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise ResultsError(f"{self.out} is being written by another qlabench run (pid {holder}, lock "
                                   f"{self.path}); wait for it to finish or choose another --out") from None
            except BaseException:
                os.close(fd)
                raise
            try:  # a holder that just finished unlinked the file we opened: lock the current one
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.fd = fd
                return self
            os.close(fd)

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still locked: a waiter re-checks the inode
        os.close(self.fd)
        self.fd = None


def as_stored(x):
    """``x`` as the results file holds it: NaN/Inf have no JSON spelling, so they are stored as null
    (the row's message names them). Readers of in-memory rows (the end-of-run table) use this view."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: as_stored(v) for k, v in x.items()}
    if isinstance(x, list):
        return [as_stored(v) for v in x]
    return x


def _jsonable(x):
    if hasattr(x, "item"):  # numpy / torch scalars
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_row(row, where: str = "row", defaults: dict | None = None) -> dict:
    """Checks one row: required fields, typed key fields, status, (for ok / incorrect rows) finite
    times inside [MIN_TIME_MS, MAX_TIME_MS], and that a row with ``options`` is named after the options
    that differ from ``defaults`` (its file's `option_defaults`; None: today's). Raises ResultsError
    naming ``where``, field and value."""
    if not isinstance(row, dict):
        raise ResultsError(f"{where} is not an object, got {type(row).__name__}: {row!r:.80}")
    missing = [k for k in ROW_FIELDS if k not in row]
    if missing:
        raise ResultsError(f"{where} lacks fields {missing}")

    def bad(field: str, why: str):
        return ResultsError(f"{where}.{field} = {row[field]!r:.80}: {why}")

    status = row["status"]
    if not isinstance(status, str) or status not in STATUSES:
        raise bad("status", f"expected one of {', '.join(STATUSES)}")
    if row["phase"] not in PHASES or not isinstance(row["phase"], str):
        raise bad("phase", f"expected one of {', '.join(PHASES)}")
    for k in ("preset", "pattern", "gate_profile", "dtype", "backend"):
        if not isinstance(row[k], str) or not row[k].strip():
            raise bad(k, "expected a non-empty string")
    for k in _INT_KEYS:
        if not _is_int(row[k]) or row[k] < 1:
            raise bad(k, "expected an int >= 1")
    timed = status in TIMED_STATUSES
    for k in TIME_FIELDS:
        v = row[k]
        if v is None:
            if k == "median_ms" and timed:
                raise ResultsError(f"{where} is {status} but has no median_ms")
            continue
        if not _is_num(v) or not math.isfinite(v):
            raise bad(k, "expected a finite number of milliseconds or null")
        lo = 0.0 if k == "std_ms" else MIN_TIME_MS
        if not lo <= v <= MAX_TIME_MS:
            raise bad(k, f"outside [{lo:g}, {MAX_TIME_MS:g}] ms per call (not a measurement)")
    for k in ("first_call_s", "peak_mem_mb"):
        v = row[k]
        if v is not None and not (_is_num(v) and math.isfinite(v) and v >= 0):
            raise bad(k, "expected a finite number >= 0 or null")
    for k in ("samples", "total_tokens", "n_seqs"):
        if row[k] is not None and not (_is_int(row[k]) and row[k] >= 0):
            raise bad(k, "expected an int >= 0 or null")
    lens = row["seqlens"]
    if lens is not None and not (isinstance(lens, list) and all(_is_int(n) and n >= 0 for n in lens)):
        raise bad("seqlens", "expected a list of token counts or null")
    errs = row["errors"]
    if errs is not None and not (isinstance(errs, dict)
                                 and all(e is None or (_is_num(e) and not math.isnan(e)) for e in errs.values())):
        raise bad("errors", "expected an object of relative errors (numbers or null)")
    for k in ("model", "message", "backend_version", "timestamp"):
        if row[k] is not None and not isinstance(row[k], str):
            raise bad(k, "expected a string or null")
    if row.get("beta_profile") is not None and not (isinstance(row["beta_profile"], str) and row["beta_profile"]):
        raise bad("beta_profile", "expected a non-empty string or null")
    h0 = row.get("h0_scale")
    if h0 is not None and not (_is_num(h0) and math.isfinite(h0) and h0 >= 0):
        raise bad("h0_scale", "expected a finite number >= 0 or null")
    options = row.get("options")
    if options is not None:
        if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
            raise bad("options", "expected an object of kernel options (strings) or null")
        try:
            label = options_label(options, defaults)
        except ValueError as e:
            raise bad("options", str(e)) from None
        base = str(row["backend"]).partition(":")[0]
        named = f"{base}:{label}" if label else base
        if named != row["backend"]:
            raise bad("backend", f"its options say {named!r} (a variant's name carries its options)")
    split = row.get("kernel_split")
    if split is not None and not (isinstance(split, dict) and all(
            isinstance(k, str) and _is_num(v) and math.isfinite(v) and v >= 0 for k, v in split.items())):
        raise bad("kernel_split", "expected an object {kernel name: microseconds >= 0} or null")
    return row


def validate(results, source: str = "<results>", allow_empty: bool = True) -> dict:
    """Checks the schema tag, the three blocks, every row (``check_row``) and that no two rows share a
    key (``row_key``). ``allow_empty=False``: a file without rows (a run stopped before its first row)
    is an error too, for readers that need rows."""
    if not isinstance(results, dict):
        raise ResultsError(f"{source}: expected a JSON object, got {type(results).__name__}")
    if results.get("schema") != SCHEMA:
        raise ResultsError(f"{source}: schema is {results.get('schema')!r}, expected {SCHEMA!r}")
    for block in ("env", "run"):
        if not isinstance(results.get(block), dict):
            raise ResultsError(f"{source}: missing or non-object '{block}' block")
    for k in ("gpu_name", "timestamp", "git_commit"):
        v = results["env"].get(k)
        if v is not None and not isinstance(v, str):
            raise ResultsError(f"{source}: env.{k} = {v!r:.80}: expected a string or null")
    rows = results.get("rows")
    if not isinstance(rows, list):
        raise ResultsError(f"{source}: 'rows' must be a list")
    if not rows and not allow_empty:
        raise ResultsError(f"{source}: no rows (a run stopped before its first row finished?)")
    seen: dict[tuple, int] = {}
    defaults = option_defaults(results["run"])
    for i, row in enumerate(rows):
        check_row(row, f"{source}: rows[{i}]", defaults)
        key = row_key(row)
        if key in seen:
            raise ResultsError(f"{source}: rows[{seen[key]}] and rows[{i}] are the same case and backend "
                               f"({row_label(row)}); a file holds one row per key")
        seen[key] = i
    return results


def load(path, allow_empty: bool = True) -> dict:
    """Reads and validates a results file (``validate``); ResultsError for anything else."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such results file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON: {e}") from None
    except RecursionError:
        raise ResultsError(f"{path}: not a results file (JSON nested too deeply)") from None
    return validate(data, str(path), allow_empty=allow_empty)


def check_resume_settings(old_run: dict, new_run: dict, source: str) -> None:
    """``--resume`` continues a file only under the settings its rows were measured with
    (MEASUREMENT_SETTINGS); ResultsError naming each setting that differs."""
    missing = object()
    diffs = []
    for k in MEASUREMENT_SETTINGS:
        old, new = old_run.get(k, missing), new_run.get(k, missing)
        if k == "option_defaults" and new is not missing:  # what `qla` means; unrecorded in a file: LEGACY
            old, new = option_defaults(old_run), option_defaults(new_run)
        if old is missing and new is missing:
            continue
        if old is missing or new is missing or old != new or isinstance(old, bool) != isinstance(new, bool):
            was, now = ("not recorded" if x is missing else repr(x) for x in (old, new))
            diffs.append(f"{k} (file: {was}, this run: {now})")
    if diffs:
        raise ResultsError(f"--resume: {source} was measured under other settings: {'; '.join(diffs)}; rerun "
                           "with the file's settings or write a new --out")


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
