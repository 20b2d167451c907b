"""`qlabench run` / `qlabench warm` set-up and output, the command layer above the runner: which cases
the options select (select_cases), --arch and --device checks, the results file (default path, lock,
fresh or resumed), and the end-of-run table. RunSetupError (a ValueError) is a run that cannot start;
the CLI prints it and exits 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from . import results as R
from .config import Case, Preset, Sweep
from .envinfo import utc_now
from .runner import _short

# --- end-of-run table ------------------------------------------------------------------------------


def format_tables(results: dict) -> str:
    """FlashQLA's H200 layout via qlabench.report.tables; a minimal private table when unavailable.
    The rows are read as stored (a non-finite error is null there, NaN in memory)."""
    results = R.as_stored(results)
    try:
        from qlabench.report.tables import format_h200_tables
    except ImportError:
        return _plain_table(results)
    try:
        return format_h200_tables(results)
    except Exception as e:  # noqa: BLE001 - the run's rows are saved; the table is a convenience
        return _plain_table(results) + f"\n(report table unavailable: {_short(e, 200)})"


def _plain_table(results: dict) -> str:
    """One line per row: phase, preset, pattern, backend, status, median ms (fallback printer)."""
    lines = [f"{'phase':6} {'preset':12} {'pattern':14} {'backend':10} {'status':11} {'median':>10}"]
    for r in results["rows"]:
        ms = f"{r['median_ms']:.3f}ms" if r.get("median_ms") is not None else "-"
        lines.append(f"{r['phase']:6} {r['preset']:12} {r['pattern']:14} {r['backend']:10} "
                     f"{r['status']:11} {ms:>10}")
    return "\n".join(lines)


# --- planning a run from command-line options ------------------------------------------------------


class RunSetupError(ValueError):
    """A run that cannot start (bad option, arch mismatch, no GPU): the CLI prints it and exits 2."""


DEFAULT_BACKENDS = {"cuda": ["qla", "fla", "flash_qla"], "cpu": ["torch"]}


@dataclass
class Selection:
    """What the options of ``qlabench run`` / ``qlabench warm`` pick: the sweep (or None), the head
    presets, phases and gate profile, and the cases (grouped per preset, as config.build_cases)."""

    sweep: Sweep | None
    presets: list[Preset]
    phases: list[str]
    gate_profile: str
    cases: list[Case]


def split_opts(values) -> list[str]:
    """Repeatable and/or comma-list option values -> names, blanks dropped."""
    if isinstance(values, str):
        values = [values]
    return [s.strip() for v in values or () for s in str(v).split(",") if s.strip()]


def select_cases(sweep: str | None = None, cfgs=(), seqlens=(), phase: str | None = None,
                 gate_profile: str | None = None) -> Selection:
    """The cases of ``--sweep`` / ``--cfg`` / ``--seqlens`` / ``--phase`` / ``--gate-profile``.

    ``--cfg`` replaces the sweep's presets; ``--seqlens`` its patterns (else the sweep's patterns per
    phase, else each phase's default set); ``--phase`` its phases (else the sweep's, else fwd);
    ``--gate-profile`` its gate profile (config.reselect). ``gate_profile`` of the Selection names the
    cases' gate profiles, comma-joined when there are several.
    ConfigError / RunSetupError (ValueErrors naming the value) for anything malformed.
    """
    from . import config as C

    presets = C.load_presets()
    sets = C.load_seqlens()
    sw = C.load_sweep(sweep, presets=presets, seqlens=sets) if sweep else None
    names = split_opts(cfgs)
    if not sw and not names:
        raise RunSetupError("give --cfg (e.g. --cfg hk16_hv32) or --sweep (see `qlabench list sweeps`)")
    chosen = ([C.resolve_preset(n, presets) for n in names] if names
              else list(dict.fromkeys(c.preset for c in sw.cases)))
    phases = C.parse_phases(phase) if phase else (sw.phases if sw else ["fwd"])
    spec = split_opts(seqlens)
    if sw:  # the sweep's cases (its [[groups]] pair presets, patterns and inputs), options replacing parts
        cases = C.reselect(sw.cases, sets, presets=chosen if names else None,
                           phases=phases if phase else None, seqlen_spec=spec or None,
                           gate_profile=gate_profile)
        cases = [replace(c, dtype=sw.dtype) for c in cases]  # the sweep's dtype, also on cases reselect adds
    else:
        cases = C.build_cases(chosen, phases, sets, spec or None, gate_profile or "bench")
    gate = ",".join(dict.fromkeys(c.gate_profile for c in cases)) or gate_profile or "bench"
    return Selection(sweep=sw, presets=chosen, phases=phases, gate_profile=gate, cases=cases)


def check_arch(arch: str, device: str) -> str:
    """Checks --arch against the visible GPU; returns the arch name. RunSetupError on a mismatch."""
    from .kernels.dispatch import arch_by_name, arch_for_capability

    try:
        want = arch_by_name(arch)
    except ValueError as e:
        raise RunSetupError(f"--arch: {e}") from None
    if device == "cpu":
        raise RunSetupError(f"--arch {arch} checks the GPU, but the run is on the CPU (--device cpu); "
                            "drop --arch for CPU reference timings")
    if not torch.cuda.is_available():
        raise RunSetupError(f"--arch {arch}: no CUDA GPU is visible (torch {torch.__version__}); run on an "
                            f"{arch} machine, or drop --arch and use --device cpu --quick for CPU "
                            "reference timings")
    major, minor = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    try:
        have = arch_for_capability(major, minor)
    except ValueError:
        raise RunSetupError(f"--arch {arch} but the GPU is {name} (compute capability {major}.{minor}), "
                            "which no qlabench arch covers") from None
    if have.name != want.name:
        raise RunSetupError(f"--arch {arch} but the GPU is {name} (compute capability {major}.{minor}, "
                            f"arch {have.name})")
    return want.name


def resolve_device(device: str | None, quick: bool) -> tuple[str, str]:
    """(device, note): default cuda when a GPU is visible; without one, --quick falls back to cpu."""
    has_gpu = torch.cuda.is_available()
    if device is None:
        if has_gpu:
            return "cuda", ""
        if quick:
            return "cpu", "no CUDA GPU visible: running on the CPU (--quick)"
        raise RunSetupError("no CUDA GPU is visible; use --device cpu (or --quick) for CPU reference "
                            "timings of the torch backend")
    if device == "cuda" and not has_gpu:
        raise RunSetupError("--device cuda: no CUDA GPU is visible to torch "
                            f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
    return device, ""


def default_out_path(gpu_name: str | None, commit: str | None, name: str) -> Path:
    from .envinfo import gpu_slug

    date = utc_now()[:10]
    # results/ holds the committed GPU measurements; a CPU run (no GPU name) is a smoke test and goes
    # to runs/cpu/ (git-ignored), so it neither dirties the checkout nor enters `history results/`
    root = Path("results") if gpu_name else Path("runs")
    return root / gpu_slug(gpu_name) / f"{date}_{(commit or 'nogit')[:7]}" / f"{name}.json"


def prepare_out(out: Path) -> R.OutputLock:
    """Before any case runs: ``out``'s folder exists and is writable, and this process holds the
    exclusive lock on ``out`` (``<out>.lock``) for the length of the run. RunSetupError otherwise."""
    out = Path(out)
    if out.is_dir():
        raise RunSetupError(f"--out {out} is a directory; name a results file (.json)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunSetupError(f"--out {out}: cannot create its folder ({e.strerror or e})") from None
    if out.exists() and not os.access(out, os.R_OK | os.W_OK):
        raise RunSetupError(f"--out {out}: the file is not readable and writable")
    try:
        return R.OutputLock(out).acquire()
    except OSError as e:
        raise RunSetupError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    except R.ResultsError as e:
        raise RunSetupError(str(e)) from None


# The `run` block's fields that describe which cases the file selects (not how they were measured): a
# resume whose selection gained presets, gate profiles, phases or backends (a sweep that grew) widens
# them, so the report's Config line and `n_cases` describe every row; the rows carry their own values.
_SELECTION_LISTS = ("presets", "phases", "backends")


def _widen_selection(old_run: dict, new_run: dict) -> None:
    """``old_run``'s selection fields widened in place by ``new_run``'s (order kept, new entries last)."""
    for key in _SELECTION_LISTS:
        old, new = old_run.get(key), new_run.get(key)
        if isinstance(old, list) and isinstance(new, list):
            old_run[key] = old + [x for x in new if x not in old]
    old_g, new_g = old_run.get("gate_profile"), new_run.get("gate_profile")
    if isinstance(old_g, str) and isinstance(new_g, str):
        names = old_g.split(",")
        old_run["gate_profile"] = ",".join(names + [g for g in new_g.split(",") if g not in names])
    if isinstance(old_run.get("n_cases"), int) and isinstance(new_run.get("n_cases"), int):
        old_run["n_cases"] = max(old_run["n_cases"], new_run["n_cases"])


def open_results(out: Path, env: dict, run: dict, resume: bool) -> dict:
    """A fresh results dict, or with --resume the existing file's (same GPU and the same
    MEASUREMENT_SETTINGS required), saved at once: a place that cannot take the file fails here, before
    any case runs."""
    if out.exists():
        if not resume:
            raise RunSetupError(f"{out} already exists; pass --resume to continue it or --out to write "
                                "elsewhere")
        try:
            res = R.load(out)
        except R.ResultsError as e:
            raise RunSetupError(f"--resume: {e}") from None
        old_gpu, new_gpu = res["env"].get("gpu_name"), env.get("gpu_name")
        if old_gpu != new_gpu:
            raise RunSetupError(f"--resume: {out} was measured on {old_gpu or 'the CPU'}, this machine has "
                                f"{new_gpu or 'no GPU'}")
        try:
            R.check_resume_settings(res["run"], run, str(out))
        except R.ResultsError as e:
            raise RunSetupError(str(e)) from None
        res["env"].setdefault("resumed_at", []).append(env["timestamp"])
        # what each resume ran on (the file's git_commit / versions are its first run's): the report names
        # every commit and library version the rows were measured at
        res["env"].setdefault("resumes", []).append(
            {k: env.get(k) for k in ("timestamp", "git_commit", "git_dirty", "versions")})
        res["run"].setdefault("resumed_argv", []).append(run["argv"])
        _widen_selection(res["run"], run)
    else:
        res = R.new_results(env, run)
    try:
        R.save(res, out)
    except OSError as e:
        raise RunSetupError(f"--out {out}: cannot write the results file ({e.strerror or e})") from None
    return res
