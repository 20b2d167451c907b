"""Warms the peers' on-disk compile caches before a timed sweep (``qlabench warm``).

On a fresh GPU host the first call of FLA (Triton autotuning: 40-96 s per head preset) and of
upstream flash-qla (TileLang compilation: 22-113 s per preset) dominates a sweep when the presets run
one after another. Compilation is CPU work and both libraries keep their binaries on disk
(``~/.triton/cache``, ``$TILELANG_CACHE_DIR``), so this module makes the first call of every
(head preset, phase, backend) once, in parallel worker processes; the timed sweep that follows in a
fresh process then mostly loads binaries instead of compiling them.

    parent (qlabench warm)                            task process (multiprocessing 'spawn', one per
    plan_tasks: the selection's cases ->              task, at most ``jobs`` at once)
      one WarmTask per (preset, phase, backend)       own process group (a timeout kills its compiler
    start tasks while fewer than jobs run  ───────>     subprocesses too); TRITON_CACHE_AUTOTUNING unset
    collect  <──── {status, first_call_s, message} ── run_task: seeded inputs, ONE first call
    a task past timeout_s: its process group killed,    (forward; bwd/fwdbwd: forward + backward)
      `error` row; a task that dies: `error` row; the others go on

Triton's autotuner is left with its default of keeping its *choices* in memory only
(``TRITON_CACHE_AUTOTUNING`` is removed from every task's environment): the choices made here, with
many processes sharing the GPU, die with the task process, and the timed run makes its own choices
uncontended, re-benchmarking configurations whose binaries are now on disk.

Pattern of a task (``pattern``): ``first`` (default), the first pattern the selection runs for that
preset and phase, i.e. the call whose ``first_call_s`` the timed sweep records first; ``smallest``, the
one with the fewest tokens; or an explicit pattern (``2048+2048``) for every task. FLA's kernels do not
depend on it (varlen always; autotune keys H, K, V, BT; T not specialised); flash-qla's automatic
context parallelism does, which is why the default follows the sweep.

On the CPU (``--device cpu --backends torch``) the same pool runs the float64 reference: how it is
tested without GPUs.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

from .backends import Backend
from .config import Case, Preset
from .envinfo import utc_now
from .procs import become_worker, kill_process_group, spawn
from .results import write_atomic
from .workload import Pattern, parse_pattern

SCHEMA = "qlabench.warm/1"
DEFAULT_BACKENDS = {"cuda": ["fla", "flash_qla"], "cpu": ["torch"]}
PATTERN_POLICIES = ("first", "smallest")
DEFAULT_TIMEOUT_S = 600.0
STATUSES = ("ok", "error", "unavailable")
# Triton's switch that would save autotune choices to disk; never on in a task process
AUTOTUNE_CACHE_VAR = "TRITON_CACHE_AUTOTUNING"


@dataclass(frozen=True)
class WarmTask:
    """One first call to make: a head preset, a phase, a backend (pickled into the task process) and
    the pattern its inputs have."""

    preset: Preset
    phase: str
    backend: Backend
    pattern: Pattern
    gate_profile: str = "bench"
    dtype: str = "bfloat16"  # of the inputs (a sweep's dtype): kernels compile per dtype

    @property
    def label(self) -> str:
        return f"{self.preset.name} {self.phase} {self.backend.name}"


@dataclass(frozen=True)
class WarmOptions:
    """How every task runs: device, base seed (mixed with the case identity as in `qlabench run`, so the
    inputs are the run's), initial state on/off (FLA compiles a variant per choice), head dim, torch
    threads per task process (None: torch's default)."""

    device: str = "cuda"
    seed: int = 0
    with_h0: bool = True
    head_dim: int = 128
    threads: int | None = None

    def __post_init__(self):
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {self.device!r}")


# --- planning --------------------------------------------------------------------------------------


def _pick(patterns: list[Pattern], policy: str) -> Pattern:
    if policy == "first":
        return patterns[0]
    return min(patterns, key=lambda p: p.total_tokens)  # the first of the smallest


def resolve_pattern(spec: str | None) -> str | Pattern:
    """``--pattern``: None -> 'first'; 'first' / 'smallest'; else a pattern (ValueError naming it)."""
    if spec is None:
        return "first"
    text = str(spec).strip()
    if text in PATTERN_POLICIES:
        return text
    try:
        return parse_pattern(text)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--pattern {spec!r}: expected {' or '.join(PATTERN_POLICIES)} or a seqlen pattern "
                         f"({e})") from None


def plan_tasks(cases: list[Case], backends: list[Backend], pattern: str | Pattern = "first") -> list[WarmTask]:
    """One task per (head preset, phase, backend) of ``cases``, in the cases' order (grouped per preset,
    then phase), backends in the given order. ``pattern``: a policy of PATTERN_POLICIES or a Pattern."""
    if isinstance(pattern, str) and pattern not in PATTERN_POLICIES:
        raise ValueError(f"pattern policy {pattern!r}: expected one of {', '.join(PATTERN_POLICIES)} or a Pattern")
    groups: dict[tuple[str, str], tuple[Case, list[Pattern]]] = {}
    for c in cases:
        first, pats = groups.setdefault((c.preset.name, c.phase), (c, []))
        if c.pattern.name not in {p.name for p in pats}:
            pats.append(c.pattern)
    tasks = []
    for first, pats in groups.values():
        chosen = pattern if isinstance(pattern, Pattern) else _pick(pats, pattern)
        tasks.extend(WarmTask(first.preset, first.phase, b, chosen, first.gate_profile, first.dtype)
                     for b in backends)
    return tasks


def default_jobs(n_tasks: int, cpu_count: int | None = None) -> int:
    """min(tasks, CPU cores // 2), at least 1: compilers get the other half of the cores."""
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 2)
    return max(1, min(n_tasks, cores // 2))


# --- one task (in its own process) -----------------------------------------------------------------


def _short(e: BaseException, limit: int = 600) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_task(task: WarmTask, opts: WarmOptions) -> dict:
    """The task's first call, timed like `qlabench run` times it (``timing.first_call``: synchronised,
    bwd/fwdbwd = forward + backward). Never raises: {status, first_call_s, message}."""
    import torch

    from .runner import _PhaseCall
    from .timing import bench_stream, first_call, on_stream
    from .workload import case_seed, make_workload

    out = {"status": "error", "first_call_s": None, "message": ""}
    call = None
    try:
        if opts.threads:
            torch.set_num_threads(opts.threads)
        ok, why = task.backend.available(opts.device)
        if ok:
            ok, why = task.backend.supports(task.phase)
        if not ok:
            out.update(status="unavailable", message=why)
            return out
        w = make_workload(task.preset.h_qk, task.preset.h_v, task.pattern.seqlens, task.gate_profile,
                          seed=case_seed(opts.seed, task.preset.name, task.pattern.name, task.gate_profile),
                          device=opts.device, head_dim=opts.head_dim, with_h0=opts.with_h0,
                          dtype=getattr(torch, task.dtype))
        call = _PhaseCall(task.phase, task.backend, w)

        def first():
            call.prepare()
            return call()

        with on_stream(bench_stream(opts.device)):
            seconds, raw = first_call(first, opts.device)
        del raw
        out.update(status="ok", first_call_s=seconds, message=why)
    except Exception as e:  # noqa: BLE001 - any failure (compile error, OOM, bad preset) is the row's message
        out["message"] = _short(e)
    finally:
        if call is not None:
            call.release()
    return out


def _task_main(task: WarmTask, opts: WarmOptions, conn) -> None:
    """Entry point of a task process (spawned): own process group, no autotune cache, one result."""
    become_worker()  # own process group (a timeout kills it), SIGINT left to the parent
    os.environ.pop(AUTOTUNE_CACHE_VAR, None)
    try:
        result = run_task(task, opts)
    except BaseException as e:  # noqa: BLE001 - reported, not raised
        result = {"status": "error", "first_call_s": None, "message": _short(e)}
    with contextlib.suppress(BrokenPipeError, EOFError, OSError):
        conn.send(result)
    conn.close()


# --- the pool --------------------------------------------------------------------------------------


def _row(task: WarmTask, status: str, first_call_s: float | None, wall_s: float | None, message: str) -> dict:
    return {
        "preset": task.preset.name, "h_qk": task.preset.h_qk, "h_v": task.preset.h_v, "phase": task.phase,
        "backend": task.backend.name, "pattern": task.pattern.name, "seqlens": list(task.pattern.seqlens),
        "gate_profile": task.gate_profile, "status": status, "first_call_s": first_call_s,
        "wall_s": wall_s, "message": message, "timestamp": utc_now(),
    }


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Running:
    def __init__(self, index: int, proc, conn, started: float, deadline: float | None):
        self.index, self.proc, self.conn = index, proc, conn
        self.started, self.deadline = started, deadline
        self.result: dict | None = None

    def receive(self) -> None:
        """Reads the task's result if it has arrived (or the pipe closed)."""
        if self.conn is None:
            return
        try:
            if self.conn.poll():
                self.result = self.conn.recv()
            else:
                return
        except (EOFError, OSError):
            pass
        self.conn.close()
        self.conn = None


def _kill(proc) -> None:
    """Kills a task process and its process group (compilers it started): procs.kill_process_group."""
    kill_process_group(proc)


class WarmPool:
    """Runs ``tasks`` in at most ``jobs`` spawned processes at once; ``results`` holds one row per
    finished task, in task order (None while a task has not finished).

    A task past ``timeout_s`` (wall time from its process start) is killed with its process group and
    becomes an `error` row; a task process that dies without a result becomes an `error` row naming
    its exit; the other tasks go on. ``on_done(row, n_done, n_total)`` is called as rows arrive.
    """

    def __init__(self, tasks: list[WarmTask], opts: WarmOptions, jobs: int, timeout_s: float | None = None,
                 on_done=None):
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.tasks, self.opts, self.jobs, self.timeout_s = list(tasks), opts, jobs, timeout_s
        self.on_done = on_done
        self.results: list[dict | None] = [None] * len(self.tasks)
        self.ctx = mp.get_context("spawn")
        self._running: dict[int, _Running] = {}

    @property
    def rows(self) -> list[dict]:
        return [r for r in self.results if r is not None]

    def _start(self, i: int) -> None:
        try:
            proc, reader = spawn(self.ctx, _task_main, (self.tasks[i], self.opts), f"qlabench-warm-{i}")
        except Exception as e:  # noqa: BLE001 - an unpicklable backend: that task fails, not the pool
            self._finish_row(i, _row(self.tasks[i], "error", None, 0.0, f"cannot start: {_short(e)}"))
            return
        now = time.monotonic()
        self._running[i] = _Running(i, proc, reader, now, now + self.timeout_s if self.timeout_s else None)

    def _finish_row(self, i: int, row: dict) -> None:
        self.results[i] = row
        if self.on_done is not None:
            self.on_done(row, sum(r is not None for r in self.results), len(self.tasks))

    def _collect(self, r: _Running, now: float) -> bool:
        """Finishes ``r`` if its process ended or its time is up; True when it did."""
        r.receive()
        task = self.tasks[r.index]
        if r.proc.is_alive() and r.result is None:
            if r.deadline is None or now < r.deadline:
                return False
            _kill(r.proc)
            row = _row(task, "error", None, now - r.started,
                       f"timed out after {self.timeout_s:g} s (task process killed)")
        else:
            r.proc.join(10)
            if r.proc.is_alive():  # sent its result but hangs on exit
                _kill(r.proc)
            r.receive()
            wall = time.monotonic() - r.started
            res = r.result
            if res is None:
                row = _row(task, "error", None, wall, f"task process died without a result "
                           f"({_exit_text(r.proc.exitcode)})")
            else:
                row = _row(task, res.get("status", "error"), res.get("first_call_s"), wall,
                           str(res.get("message") or ""))
        if r.conn is not None:
            r.conn.close()
        del self._running[r.index]
        self._finish_row(r.index, row)
        return True

    def stop(self) -> None:
        """Kills every running task (their rows stay None)."""
        for r in list(self._running.values()):
            _kill(r.proc)
            if r.conn is not None:
                r.conn.close()
        self._running.clear()

    def run(self) -> list[dict]:
        """Runs every task; returns the rows in task order. KeyboardInterrupt: running tasks are killed,
        ``rows`` keeps the finished ones, and the interrupt propagates."""
        pending = deque(range(len(self.tasks)))
        try:
            while pending or self._running:
                while pending and len(self._running) < self.jobs:
                    self._start(pending.popleft())
                if not self._running:
                    continue
                now = time.monotonic()
                deadlines = [r.deadline for r in self._running.values() if r.deadline is not None]
                timeout = max(0.0, min(deadlines) - now) + 0.05 if deadlines else None
                waitables = [r.proc.sentinel for r in self._running.values()]
                waitables += [r.conn for r in self._running.values() if r.conn is not None]
                wait(waitables, timeout)
                now = time.monotonic()
                for r in list(self._running.values()):
                    self._collect(r, now)
        except BaseException:
            self.stop()
            raise
        return self.rows


def warm(tasks: list[WarmTask], opts: WarmOptions, jobs: int | None = None,
         timeout_s: float | None = DEFAULT_TIMEOUT_S, on_done=None) -> list[dict]:
    """Runs the tasks in a pool (see WarmPool); ``jobs`` None: ``default_jobs``."""
    return WarmPool(tasks, opts, jobs or default_jobs(len(tasks)), timeout_s, on_done).run()


# --- output ----------------------------------------------------------------------------------------


def _secs(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def format_row(row: dict) -> str:
    return (f"{row['preset']:12} {row['phase']:6} {row['backend']:10} {row['pattern']:14} "
            f"{_secs(row['first_call_s']):>8} {_secs(row['wall_s']):>8}  {row['status']:11} {row['message']}"
            ).rstrip()


def format_table(rows: list[dict]) -> str:
    """preset, phase, backend, pattern, first-call seconds, task wall seconds, status, message."""
    head = (f"{'preset':12} {'phase':6} {'backend':10} {'pattern':14} {'first s':>8} {'wall s':>8}  "
            f"{'status':11} message")
    return "\n".join([head, *(format_row(r) for r in rows)])


def summary(rows: list[dict], n_tasks: int, wall_s: float) -> str:
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    done = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "nothing finished"
    first = sum(r["first_call_s"] or 0.0 for r in rows)
    return (f"{len(rows)}/{n_tasks} tasks: {done}; {wall_s:.1f} s wall for {first:.1f} s of first calls")


def cache_dirs() -> dict:
    """Where the peers keep their binaries (what a warm fills): the environment's choice, else the
    libraries' defaults."""
    home = Path.home()
    return {
        "triton": os.environ.get("TRITON_CACHE_DIR") or str(home / ".triton" / "cache"),
        "tilelang": os.environ.get("TILELANG_CACHE_DIR") or str(home / ".tilelang" / "cache"),
    }


def save(path: Path, rows: list[dict], meta: dict) -> None:
    """``{"schema": "qlabench.warm/1", **meta, "tasks": rows}`` written atomically (results.write_atomic)."""
    write_atomic(path, json.dumps({"schema": SCHEMA, **meta, "tasks": rows}, indent=1) + "\n")


def meta_block(opts: WarmOptions, jobs: int, timeout_s: float | None, n_tasks: int, wall_s: float) -> dict:
    import socket

    return {
        "argv": ["qlabench", *sys.argv[1:]], "timestamp": utc_now(), "hostname": socket.gethostname(),
        "device": opts.device, "jobs": jobs, "timeout_s": timeout_s, "with_h0": opts.with_h0,
        "n_tasks": n_tasks, "wall_s": wall_s, "caches": cache_dirs(),
    }
