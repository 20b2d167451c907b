"""Sharded sweeps: one worker process per local GPU (or N CPU workers), rows merged into one file.

    parent (qlabench run --gpus ...)                 worker k (multiprocessing 'spawn')
    plan_shards: cases -> one shard per worker        CUDA_VISIBLE_DEVICES=<GPU's UUID>, set before
                                                      torch initialises CUDA; torch.cuda.set_device(0)
    start worker k ──── cfg, backends, shard ──────>  Runner.run_case over its shard; every row saved
                                                      to its own partial file (atomic) ...
    upsert into --out (atomic save) <──── row ─────   ... and sent to the parent through a pipe
    worker died: its partial file is read, the case in flight becomes `error` rows, a fresh worker on
                 the same device takes the shard's remaining cases; the other workers go on
    Ctrl-C: SIGTERM to the workers (each saves its partial file and stops), their rows are merged,
            the partial files removed, KeyboardInterrupt re-raised (the CLI exits 130)
    --case-timeout: a case running longer (from the worker's "case" message: reference, first calls
            and compilation included) has its worker's process group killed; the backends of that case
            without a row get `timeout` rows and a fresh worker takes the rest of the shard

Partial files live in ``<out dir>/.<out name>.shards/`` while the run lasts. A parent killed hard
leaves them behind; ``--resume`` merges their finished rows into --out before planning.

Sharding (``plan_shards``) is deterministic: cases are weighed by ``case_cost`` (tokens x h_v x
phase weight x pending backends) and assigned heaviest first to the least-loaded worker, except that a
worker keeps taking the cases of a head preset it already holds while it stays near its share: a
preset is split over workers only where balance needs it (each worker compiles its presets once).
On the H200 matrices the busiest worker gets at most ~5% over the ideal share for 2-8 workers.

On the CPU (``--device cpu --workers N``) the same path runs N workers on the torch backend, each with
``torch.get_num_threads() // N`` threads; this is how the pool is tested without GPUs.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import pickle
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

from . import results as R
from .backends import Backend
from .config import Case
from .envinfo import utc_now
from .procs import become_worker, kill_process_group, spawn
from .runner import RunConfig, Runner, _short, base_row, case_pattern

# relative cost of a phase at equal size (a backward recomputes the forward's states and does ~2x its
# matmuls); only the ratios matter
PHASE_WEIGHT = {"fwd": 1.0, "bwd": 3.0, "fwdbwd": 4.0}
# below this many tokens a call is launch/latency bound: its cost stops shrinking with the size
MIN_COST_TOKENS = 4096
# a worker takes more of its preset's cases while its load stays within (1 + this) x the ideal share
BALANCE_SLACK = 0.05
STOP_GRACE_S = 15.0  # Ctrl-C: how long workers get to save their partial files before being killed


def check_case_timeout(seconds) -> float:
    """``--case-timeout``: a finite number of seconds > 0; ValueError naming the value otherwise."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
            math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"--case-timeout must be a finite number of seconds > 0, got {seconds!r}")
    return float(seconds)


@dataclass(frozen=True)
class Slot:
    """Where one worker runs: a GPU (index as this process numbers the visible GPUs, UUID, and the
    CUDA_VISIBLE_DEVICES value that pins the worker to it) or, with gpu_index None, the CPU."""

    worker: int
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    visible: str | None = None
    threads: int | None = None  # CPU workers: torch threads

    @property
    def label(self) -> str:
        if self.gpu_index is None:
            return f"worker {self.worker} (cpu)"
        return f"worker {self.worker} (GPU {self.gpu_index}{', ' + self.gpu_uuid if self.gpu_uuid else ''})"

    def row_fields(self) -> dict:
        return {"gpu_index": self.gpu_index, "gpu_uuid": self.gpu_uuid, "worker": self.worker}


# --- choosing devices ------------------------------------------------------------------------------


def parse_gpus(spec: str, n_visible: int) -> list[int]:
    """``--gpus`` -> GPU indices: ``all``; a count ``N`` (GPUs 0..N-1); indices ``0,2,5`` (one index
    alone: ``3,``). ValueError naming the value when it asks for GPUs that are not there."""
    text = str(spec).strip().lower()
    if n_visible < 1:
        raise ValueError(f"--gpus {spec}: no CUDA GPU is visible to torch")
    have = f"{n_visible} GPU{'s' if n_visible != 1 else ''} visible (indices 0..{n_visible - 1})"
    if text == "all":
        return list(range(n_visible))
    if re.fullmatch(r"\d+", text):
        n = int(text)
        if n < 1:
            raise ValueError(f"--gpus {spec}: the count must be at least 1")
        if n > n_visible:
            raise ValueError(f"--gpus {spec}: asks for {n} GPUs but {have}; give all, a count, or indices "
                             "like 0,2")
        return list(range(n))
    parts = [p.strip() for p in text.split(",")]
    if parts and parts[-1] == "":  # '3,' = the single index 3
        parts = parts[:-1]
    if not parts or not all(re.fullmatch(r"\d+", p) for p in parts):
        raise ValueError(f"--gpus {spec!r}: expected all, a count N, or comma-separated indices like 0,2,5")
    idx = [int(p) for p in parts]
    bad = [i for i in idx if i >= n_visible]
    if bad:
        raise ValueError(f"--gpus {spec}: GPU index {', '.join(map(str, bad))} does not exist; {have}")
    dup = sorted({i for i in idx if idx.count(i) > 1})
    if dup:
        raise ValueError(f"--gpus {spec}: GPU index {', '.join(map(str, dup))} given twice")
    return idx


def _visible_id(index: int, uuid: str | None) -> str:
    """What pins a child to this process's GPU ``index``: its UUID (immune to CUDA_DEVICE_ORDER and
    remapping), else the matching entry of our own CUDA_VISIBLE_DEVICES, else the index."""
    if uuid:
        return uuid
    ours = os.environ.get("CUDA_VISIBLE_DEVICES")
    if ours:
        entries = [e.strip() for e in ours.split(",") if e.strip()]
        if index < len(entries):
            return entries[index]
    return str(index)


def resolve_slots(gpus: str | None, workers: int | None, device: str) -> list[Slot] | None:
    """Worker slots for ``--gpus`` / ``--workers``; None = run in this process (neither given).
    ValueError for a bad combination or value (the CLI exits 2 with it)."""
    if gpus is None and workers is None:
        return None
    if gpus is not None and workers is not None:
        raise ValueError(f"--gpus {gpus} and --workers {workers} exclude each other: --gpus shards over GPUs, "
                         "--workers over CPU processes (--device cpu)")
    if workers is not None:
        if device != "cpu":
            raise ValueError(f"--workers {workers} is for CPU runs (--device cpu); on GPUs use --gpus")
        if workers < 1:
            raise ValueError(f"--workers {workers}: need at least 1")
        import torch

        threads = max(1, torch.get_num_threads() // workers)
        return [Slot(worker=k, threads=threads) for k in range(workers)]
    import torch

    if device != "cuda":
        why = ("no CUDA GPU is visible to torch" if not torch.cuda.is_available()
               else f"the run is on the CPU (--device {device})")
        raise ValueError(f"--gpus {gpus}: {why}; CPU workers are --device cpu --workers N")
    from .envinfo import torch_gpu_uuid

    idx = parse_gpus(gpus, torch.cuda.device_count())
    names = {i: torch.cuda.get_device_name(i) for i in idx}
    if len(set(names.values())) > 1:
        listed = ", ".join(f"{i}: {n}" for i, n in names.items())
        raise ValueError(f"--gpus {gpus}: the GPUs are of different models ({listed}); a results file holds "
                         "one GPU model, pick GPUs of one model")
    slots = []
    for k, i in enumerate(idx):
        uuid = torch_gpu_uuid(i)
        slots.append(Slot(worker=k, gpu_index=i, gpu_uuid=uuid, visible=_visible_id(i, uuid)))
    return slots


def local_row_fields(device: str, env: dict) -> dict:
    """Row fields of a one-process run: the GPU of the env block (index 0 as torch numbers it)."""
    if device != "cuda":
        return {"gpu_index": None, "gpu_uuid": None, "worker": None}
    import torch

    return {"gpu_index": torch.cuda.current_device(), "gpu_uuid": env.get("gpu_uuid"), "worker": None}


# --- planning --------------------------------------------------------------------------------------


def case_cost(case: Case, cfg: RunConfig, n_backends: int = 1) -> float:
    """Estimated relative run time of a case: phase weight x h_v x tokens (at least MIN_COST_TOKENS)
    x the backends still to run on it."""
    tokens = case_pattern(case, cfg).total_tokens
    return PHASE_WEIGHT.get(case.phase, 1.0) * case.preset.h_v * max(tokens, MIN_COST_TOKENS) * max(n_backends, 1)


def plan_shards(costs: list[float], groups: list, n: int, slack: float = BALANCE_SLACK) -> list[list[int]]:
    """Deterministic assignment of items (cases) to ``n`` workers: one list of item indices per worker,
    each in the original order.

    Longest-processing-time first with preset affinity: groups (head presets) heaviest first, inside a
    group its items heaviest first; an item goes to the worker already holding its group while that
    worker stays within (1 + ``slack``) x the share (total / n), else to the least-loaded worker, which
    then holds the group. A group is split only where balance needs it (one extra compile each time).
    """
    if n < 1:
        raise ValueError(f"need at least one worker, got {n}")
    if len(costs) != len(groups):
        raise ValueError(f"{len(costs)} costs but {len(groups)} group labels")
    by_group: dict = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    cap = sum(costs) / n * (1 + slack)
    loads, shards = [0.0] * n, [[] for _ in range(n)]
    for g in sorted(by_group, key=lambda g: (-sum(costs[i] for i in by_group[g]), by_group[g][0])):
        home = None
        for i in sorted(by_group[g], key=lambda i: (-costs[i], i)):
            if home is None or loads[home] + costs[i] > cap:
                home = min(range(n), key=lambda k: (loads[k], k))
            shards[home].append(i)
            loads[home] += costs[i]
    return [sorted(s) for s in shards]


# --- the worker process ----------------------------------------------------------------------------


class _ParentGone(BaseException):
    """The pipe to the parent broke: stop quietly (the partial file keeps the rows)."""


def _send(conn, *msg) -> None:
    try:
        conn.send(msg)
    except (BrokenPipeError, EOFError, OSError) as e:
        raise _ParentGone(str(e)) from None


class _WorkerRunner(Runner):
    """A Runner that also reports every saved row to the parent."""

    def __init__(self, conn, *args, **kw):
        super().__init__(*args, **kw)
        self.conn = conn

    def _add(self, row: dict) -> None:
        super()._add(row)
        _send(self.conn, "row", row)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _pin(slot: Slot) -> None:
    """Makes the slot's GPU this process's only CUDA device; called before CUDA is initialised."""
    import torch

    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised before the worker could pin its GPU")
    os.environ["CUDA_VISIBLE_DEVICES"] = slot.visible
    if torch.cuda.device_count() != 1:
        raise RuntimeError(f"CUDA_VISIBLE_DEVICES={slot.visible} shows {torch.cuda.device_count()} GPUs, "
                           "expected 1")
    torch.cuda.set_device(0)
    from .envinfo import torch_gpu_uuid

    seen = torch_gpu_uuid(0)
    if slot.gpu_uuid and seen and seen != slot.gpu_uuid:
        raise RuntimeError(f"pinned to {slot.visible} but torch sees {seen}")


def _worker_main(slot: Slot, cfg: RunConfig, backends: list[Backend], cases: list[tuple[int, Case]],
                 done: set, partial: str, conn) -> None:
    """Entry point of a worker process (spawned): runs its cases, saving and reporting each row."""
    become_worker()  # own process group (a case timeout kills it), SIGINT ignored: the parent stops us (SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)
    runner = None
    try:
        if slot.gpu_index is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = slot.visible  # before anything can initialise CUDA
        try:
            import torch

            if slot.gpu_index is not None:
                _pin(slot)
            if slot.threads:
                torch.set_num_threads(slot.threads)
            from .envinfo import collect

            env = collect(cfg.device)
            res = R.new_results(env, {"worker": slot.worker, "gpu_index": slot.gpu_index,
                                      "cases": [i for i, _ in cases]})
            runner = _WorkerRunner(conn, cfg, backends, res, Path(partial), progress=False,
                                   row_fields=slot.row_fields())
            runner.done = set(done)
        except Exception as e:  # noqa: BLE001 - reported to the parent, which writes error rows
            _send(conn, "fatal", _short(e))
            return
        _send(conn, "ready", {"avail": runner.avail, "env": {k: env.get(k) for k in (
            "gpu_name", "gpu_uuid", "clocks_start", "hostname")}, "pid": os.getpid()})
        for i, case in cases:
            _send(conn, "case", i)
            runner.run_case(case)
            _send(conn, "case_done", i)
        runner.finish()
        _send(conn, "done", {"clocks_end": runner.results["env"].get("clocks_end")})
    except KeyboardInterrupt:  # SIGTERM from the parent: keep what is finished, stop
        if runner is not None:
            runner.finish()
        sys.exit(130)
    except _ParentGone:
        if runner is not None:
            runner.finish()
        sys.exit(0)


# --- the parent ------------------------------------------------------------------------------------


def shard_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.shards"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Worker:
    def __init__(self, slot: Slot, shard: list[int], attempt: int, partial: Path):
        self.slot, self.shard, self.attempt, self.partial = slot, shard, attempt, partial
        self.proc = self.conn = None
        self.started: list[int] = []  # case ids in the order they began
        self.current: int | None = None
        self.finished = False  # sent "done"
        self.fatal: str | None = None
        self.exited = False
        self.info: dict = {}
        self.case_started: float | None = None  # monotonic time of the current case's start
        self.timed_out: float | None = None  # seconds the current case had run when it was killed


class ShardedRun:
    """Runs ``cases`` over ``slots`` (one worker process each) into ``results``, saved to ``out``.

    ``results`` may hold rows already (--resume): keys already ok/incorrect are not run again.
    """

    def __init__(self, cfg: RunConfig, backends: list[Backend], results: dict, out: Path | None,
                 cases: list[Case], slots: list[Slot], progress: bool = True, echo=print,
                 recover: bool = False, case_timeout: float | None = None):
        if not slots:
            raise ValueError("a sharded run needs at least one worker slot")
        self.case_timeout = None if case_timeout is None else check_case_timeout(case_timeout)
        self.cfg, self.backends, self.results, self.cases = cfg, backends, results, cases
        self.slots, self.progress, self.echo = slots, progress, echo
        self._tmp = None
        if out is None:
            import tempfile

            self._tmp = tempfile.mkdtemp(prefix="qlabench-shards-")
            self.out, self.dir = None, Path(self._tmp)
        else:
            self.out, self.dir = Path(out), shard_dir(Path(out))
        self.recover = recover
        self.ctx = mp.get_context("spawn")
        self.workers: list[_Worker] = []
        self.merged: set = set()  # row keys merged during this run
        self.avail_seen: set = set()
        self.bar = None
        self.names = [b.name for b in backends]
        self.env_workers: dict[int, dict] = {}

    # rows ------------------------------------------------------------------------------------------

    def _base(self, case: Case) -> dict:
        return base_row(case, case_pattern(case, self.cfg).seqlens, self.cfg)

    def _save(self) -> None:
        if self.out is not None:
            R.save(self.results, self.out)

    def _merge(self, row: dict, save: bool = True) -> None:
        R.upsert_row(self.results, row)
        self.merged.add(R.row_key(row))
        if save:
            self._save()

    def _done_keys(self) -> set:
        return {R.row_key(r) for r in self.results["rows"] if r["status"] in ("ok", "incorrect")}

    def _pending(self, case: Case, done: set) -> list[str]:
        base = self._base(case)
        return [n for n in self.names if R.row_key({**base, "backend": n}) not in done]

    def _error_rows(self, case_id: int, slot: Slot, message: str, status: str = "error") -> int:
        """``status`` rows (`error`, `timeout`) for the backends of a case that have no row from this run
        (nor an earlier ok)."""
        case = self.cases[case_id]
        base = self._base(case)
        skip = self.merged | self._done_keys()
        n = 0
        for name in self.names:
            if R.row_key({**base, "backend": name}) in skip:
                continue
            self._merge(R.make_row(status=status, **base, backend=name, message=message, timestamp=utc_now(),
                                   **slot.row_fields()), save=False)
            n += 1
        self._save()
        return n

    def _absorb(self, path: Path, only_new: bool = True) -> int:
        """Rows of a worker's partial file that the pipe did not deliver (a worker killed between saving
        a row and sending it)."""
        try:
            part = R.load(path)
        except R.ResultsError:
            return 0
        n = 0
        for row in part["rows"]:
            if only_new and R.row_key(row) in self.merged:
                continue
            self._merge(row, save=False)
            n += 1
        if n:
            self._save()
        return n

    def _recover_leftovers(self) -> None:
        """--resume after a parent that died hard: finished rows of its workers' partial files."""
        done = self._done_keys()
        gpu = self.results["env"].get("gpu_name")
        n = 0
        for path in sorted(self.dir.glob("*.json")):
            try:
                part = R.load(path)
            except R.ResultsError:
                continue
            if part["env"].get("gpu_name") != gpu:
                continue
            for row in part["rows"]:
                if row["status"] in ("ok", "incorrect") and R.row_key(row) not in done:
                    R.upsert_row(self.results, row)
                    done.add(R.row_key(row))
                    n += 1
        if n:
            self.echo(f"recovered {n} finished rows from {self.dir}")
            self._save()

    def _order_rows(self) -> None:
        """Rows in the plan's order (cases, then backends), as a one-process run writes them; rows of
        cases outside this run keep their place after them."""
        pos = {}
        for ci, case in enumerate(self.cases):
            base = self._base(case)
            for bi, name in enumerate(self.names):
                pos[R.row_key({**base, "backend": name})] = (ci, bi)
        rows = self.results["rows"]
        far = (len(self.cases), 0)
        self.results["rows"] = sorted(rows, key=lambda r: pos.get(R.row_key(r), far))

    # workers ---------------------------------------------------------------------------------------

    def _start(self, slot: Slot, shard: list[int], attempt: int) -> _Worker:
        w = _Worker(slot, shard, attempt, self.dir / f"worker{slot.worker}.{attempt}.json")
        done = self._done_keys()
        try:
            w.proc, w.conn = spawn(
                self.ctx, _worker_main,
                (slot, self.cfg, self.backends, [(i, self.cases[i]) for i in shard], done, str(w.partial)),
                f"qlabench-{slot.label}")
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise RuntimeError(f"cannot start {slot.label}: its arguments do not pickle "
                               f"(a backend holding live state?): {_short(e)}") from None
        self.workers.append(w)
        return w

    def _handle(self, w: _Worker, msg: tuple) -> None:
        kind = msg[0]
        if kind == "row":
            self._merge(msg[1])
        elif kind == "case":
            w.current = msg[1]
            w.case_started = time.monotonic()
            w.started.append(msg[1])
            if self.bar is not None:
                self.bar.set_postfix_str(f"{w.slot.worker}: {self.cases[msg[1]].label}", refresh=False)
        elif kind == "case_done":
            w.current = w.case_started = None
            if self.bar is not None:
                self.bar.update(1)
        elif kind == "ready":
            w.info = msg[1]
            self.env_workers[w.slot.worker] = {**w.slot.row_fields(), **msg[1]["env"], "pid": msg[1]["pid"]}
            for name, (ok, why) in msg[1]["avail"].items():
                if not ok and (name, why) not in self.avail_seen:
                    self.avail_seen.add((name, why))
                    self.echo(f"  {name}: unavailable: {why}")
        elif kind == "done":
            w.finished = True
            self.env_workers.setdefault(w.slot.worker, w.slot.row_fields())["clocks_end"] = msg[1]["clocks_end"]
        elif kind == "fatal":
            w.fatal = msg[1]

    def _drain(self, w: _Worker) -> None:
        while w.conn is not None:
            try:
                if not w.conn.poll():
                    return
                msg = w.conn.recv()
            except (EOFError, OSError, pickle.UnpicklingError):
                w.conn.close()
                w.conn = None
                return
            self._handle(w, msg)

    def _pump(self, timeout: float) -> list[_Worker]:
        """Handles whatever arrived; returns workers whose process ended (their pipes drained)."""
        live = [w for w in self.workers if not w.exited]
        waitables = [w.conn for w in live if w.conn is not None] + [w.proc.sentinel for w in live]
        if not waitables:
            return []
        ready = set(wait(waitables, timeout))
        ended = []
        for w in live:
            if w.conn is not None and w.conn in ready:
                self._drain(w)
            if w.proc.sentinel in ready or not w.proc.is_alive():
                w.proc.join()
                self._drain(w)
                w.exited = True
                ended.append(w)
        return ended

    def _after_exit(self, w: _Worker) -> None:
        """A worker ended: fine if it finished; else error rows and, if it got going, a fresh worker."""
        if w.conn is not None:
            w.conn.close()
            w.conn = None
        if w.finished:
            return
        self._absorb(w.partial)
        how = _exit_text(w.proc.exitcode)
        left = [i for i in w.shard if i not in w.started]
        if w.fatal is not None or not w.started:
            why = w.fatal or f"died before its first case ({how})"
            for i in ([w.current] if w.current is not None else []) + left:
                self._error_rows(i, w.slot, f"{w.slot.label} could not run: {why}")
                if self.bar is not None:
                    self.bar.update(1)
            self.echo(f"{w.slot.label} could not run ({why}): {len(left)} cases got error rows")
            return
        if w.current is not None and w.timed_out is not None:
            self._error_rows(w.current, w.slot, f"case exceeded --case-timeout {self.case_timeout:g} s (killed "
                             f"after {w.timed_out:.0f} s); the rest of {w.slot.label}'s shard went to a fresh "
                             "worker", status="timeout")
            if self.bar is not None:
                self.bar.update(1)
            self.echo(f"{w.slot.label}: {self.cases[w.current].label} exceeded --case-timeout "
                      f"{self.case_timeout:g} s: timeout rows written"
                      + (f"; a fresh worker takes its {len(left)} remaining cases" if left else ""))
        elif w.current is not None:
            self._error_rows(w.current, w.slot, f"{w.slot.label} died during this case ({how}); the rest of "
                             "its shard went to a fresh worker")
            if self.bar is not None:
                self.bar.update(1)
            self.echo(f"{w.slot.label} died ({how}) in {self.cases[w.current].label}: error rows written"
                      + (f"; a fresh worker takes its {len(left)} remaining cases" if left else ""))
        if left:
            self._start(w.slot, left, w.attempt + 1)

    def _stop(self) -> None:
        """SIGTERM to live workers (they save their partial files), then kill what is left."""
        live = [w for w in self.workers if not w.exited]
        for w in live:
            if w.proc.is_alive():
                w.proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        try:
            while any(not w.exited for w in self.workers) and time.monotonic() < deadline:
                self._pump(0.2)
        finally:
            for w in self.workers:
                if not w.exited:
                    w.proc.kill()
                    w.proc.join(5)
                    self._drain(w)
                    w.exited = True

    def _finish(self) -> None:
        for w in self.workers:
            if w.conn is not None:
                w.conn.close()
                w.conn = None
            self._absorb(w.partial)
        env = self.results["env"]
        env["workers"] = [self.env_workers[k] for k in sorted(self.env_workers)]
        ends = [e.get("clocks_end") for e in env["workers"] if e.get("clocks_end")]
        if self.cfg.device == "cuda" and ends:
            env["clocks_end"] = ends[0]
        self._order_rows()
        self._save()
        shutil.rmtree(self.dir, ignore_errors=True)

    def run(self) -> dict:
        if self.recover and self.dir.is_dir():
            self._recover_leftovers()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        done = self._done_keys()
        todo = [(i, len(self._pending(c, done))) for i, c in enumerate(self.cases)]
        todo = [(i, n) for i, n in todo if n]
        costs = [case_cost(self.cases[i], self.cfg, n) for i, n in todo]
        groups = [self.cases[i].preset.name for i, _ in todo]
        plan = plan_shards(costs, groups, len(self.slots))
        if self.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=len(todo), unit="case", file=sys.stderr, dynamic_ncols=True)
        try:
            for slot, shard in zip(self.slots, plan):
                if shard:
                    self._start(slot, [todo[j][0] for j in shard], 0)
            while any(not w.exited for w in self.workers):
                for w in self._pump(self._tick()):
                    self._after_exit(w)
                self._enforce_timeout()
        except BaseException:
            try:
                self._stop()
            finally:
                self._finish()
                self._close_bar()
            raise
        self._finish()
        self._close_bar()
        return self.results

    def _deadlines(self) -> list[tuple[float, _Worker]]:
        if self.case_timeout is None:
            return []
        return [(w.case_started + self.case_timeout, w) for w in self.workers
                if not w.exited and w.current is not None and w.case_started is not None and w.timed_out is None]

    def _tick(self) -> float:
        """How long to wait for messages: 1 s, or until the nearest case deadline."""
        soonest = min((d for d, _ in self._deadlines()), default=None)
        return 1.0 if soonest is None else min(1.0, max(0.05, soonest - time.monotonic()))

    def _enforce_timeout(self) -> None:
        now = time.monotonic()
        for deadline, w in self._deadlines():
            if now >= deadline:
                w.timed_out = now - w.case_started
                kill_process_group(w.proc)

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


def run_sharded(cfg: RunConfig, backends: list[Backend], results: dict, out: Path | None, cases: list[Case],
                slots: list[Slot], progress: bool = True, echo=print, recover: bool = False,
                case_timeout: float | None = None) -> dict:
    """Runs the sweep over worker processes (see the module docstring); returns ``results``."""
    return ShardedRun(cfg, backends, results, out, cases, slots, progress=progress, echo=echo,
                      recover=recover, case_timeout=case_timeout).run()
