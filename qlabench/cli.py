"""The `qlabench` command line: run, warm, report, compare, gate, history, list, env, aot."""

from __future__ import annotations

import click

from qlabench import __version__
from qlabench.recipe import GATE_PROFILES  # torch-free: the commands import their heavy modules when run


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="qlabench")
def main() -> None:
    """qlabench: Gated DeltaNet kernels and the suite that measures and tracks them."""


# --- suite core: run, list, env (qlabench/runner.py, config.py, backends.py, envinfo.py) ---


def _setup_error(msg: str) -> None:
    """Bad options or a machine that cannot run them: one clear line, exit code 2, no traceback."""
    click.echo(f"qlabench: error: {msg}", err=True)
    raise SystemExit(2)


@main.command("run")
@click.option("--arch", type=click.Choice(["sm90", "sm100", "sm120"]), default=None,
              help="Require this GPU architecture; a mismatch or no GPU exits 2 [default: not checked].")
@click.option("--cfg", "cfgs", multiple=True,
              help="Head preset(s) hk<h_qk>_hv<h_v>, repeatable or comma list; any such name parses "
              "[default: the sweep's presets].")
@click.option("--sweep", default=None,
              help="Sweep name in configs/sweeps/ (h200-fwd, h200-bwd, ci-smoke, stress) or a .toml path.")
@click.option("--seqlens", "seqlens", multiple=True,
              help="Pattern set names from seqlens.toml and/or patterns (1x32768, 28672+4096, 8192x4, "
              "32k_4seq), repeatable or comma list [default: the sweep's, else per phase: fwd -> set "
              "'fwd', bwd/fwdbwd -> set 'bwd'].")
@click.option("--phase", default=None,
              help="fwd, bwd, fwdbwd or all (comma list allowed) [default: the sweep's phases, else fwd].")
@click.option("--backends", default=None,
              help="Comma list from `qlabench list backends`; qla variants as qla:key=value+key=value "
              "(qla:cp=on+bwd_dh=ws), each its own column [default: the sweep's; else qla,fla,flash_qla "
              "on CUDA, torch on the CPU].")
@click.option("--gate-profile", type=click.Choice(GATE_PROFILES), default=None,
              help="Gate distribution [default: the sweep's, else bench].")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Where to run [default: cuda when a GPU is visible; without one, cpu with --quick].")
@click.option("--quick", is_flag=True,
              help="Fewer samples (warmup/repeats 3/20 on CUDA, 1/5 on the CPU); on the CPU also shrinks "
              "every pattern to at most 512 tokens.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Results JSON [default: results/<gpu>/<date>_<commit>/<sweep-or-cfg>.json].")
@click.option("--resume", is_flag=True,
              help="Continue --out: rows already ok/incorrect are skipped, error/unavailable/timeout rows re-run.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Base seed of the inputs (mixed with each case's identity).")
@click.option("--warmup", type=click.IntRange(min=0), default=None,
              help="Warm-up calls per backend and case [default: the sweep's, else 10; --quick 3 / 1].")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="Samples: graph replays (cudagraph) or timed calls [default: the sweep's, else 100; "
              "--quick 20 / 5].")
@click.option("--timer", type=click.Choice(["auto", "cudagraph", "events", "wall"]), default="auto",
              show_default=True,
              help="auto = cudagraph on CUDA (falls back to events if capture fails), wall on the CPU.")
@click.option("--l2", type=click.Choice(["auto", "warm", "flush"]), default="auto", show_default=True,
              help="L2 between calls: auto = warm for cudagraph, flushed (256 MB write) for events; flush "
              "with cudagraph subtracts a flush-only graph.")
@click.option("--tolerance", type=float, default=0.02, show_default=True,
              help="Largest relative L2 error vs the float64 reference before a row is 'incorrect'; a finite "
              "number in (0, 1).")
@click.option("--verify-kernels", type=click.Choice(["first", "each", "off"]), default="first", show_default=True,
              help="Profile one call to check a backend's kernel path (fla: no FlashQLA/TileLang kernel): on "
              "the first case of each phase and preset, on every case, or never.")
@click.option("--no-h0", is_flag=True, help="Run without an initial state [default: h0 on, like FlashQLA].")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--verbose", is_flag=True,
              help="End-of-run report with the first-call section (compile / load time per head configuration) "
                   "and its explanation [default: speed and accuracy only; `qlabench report` shows it all].")
@click.option("--kernel-split", "--profile", "kernel_split", is_flag=True,
              help="Also profile a few calls of every timed row (torch.profiler) and record its device time "
              "per kernel name (row field kernel_split, us per call); reports show it per case "
              "[default: off]. --profile is the same flag.")
@click.option("--gpus", default=None,
              help="Shard the cases over local GPUs, one worker process per GPU, rows merged into --out: all, "
              "a count N (GPUs 0..N-1) or indices 0,2,5 (one index: 3,) [default: one GPU, in this process].")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="With --device cpu: the same sharding over N CPU worker processes [default: in this process].")
@click.option("--case-timeout", type=float, default=None,
              help="Seconds a case may run (reference, first calls and compilation included); past it its "
              "worker process is killed, the case's rows become 'timeout' and the sweep goes on in a fresh "
              "worker. Runs the cases in worker processes (one, unless --gpus/--workers) [default: none].")
def run_cmd(arch, cfgs, sweep, seqlens, phase, backends, gate_profile, device, quick, out, resume, seed, kernel_split,
            warmup, repeats, timer, l2, tolerance, verify_kernels, no_h0, no_progress, verbose, gpus, workers,
            case_timeout) -> None:
    """Sweep head presets x seqlen patterns over backends: correctness and timing, saved row by row.

    --out is locked (<out>.lock) for the whole run and written once before the first case; --resume
    refuses a file measured under other settings (seed, h0, tolerance, warmup, repeats, timer, L2,
    quick, device, kernel-option defaults). Bad options exit 2 with one line.
    """
    import sys
    from pathlib import Path

    from qlabench import envinfo
    from qlabench import runner as RN
    from qlabench import runsetup as RS
    from qlabench import shard as SH
    from qlabench.backends import get_backend, parse_backends
    from qlabench.kernels.options import KernelOptions

    lock = None
    try:
        if arch:  # before the device default: --arch on a machine without a GPU is its own error
            RS.check_arch(arch, device or "cuda")
        RN.check_tolerance(tolerance)
        device, note = RS.resolve_device(device, quick)
        slots = SH.resolve_slots(gpus, workers, device)  # None: one device, in this process
        if case_timeout is not None:  # the timeout kills a worker process: run in one if none is asked for
            case_timeout = SH.check_case_timeout(case_timeout)
            slots = slots or SH.resolve_slots("1" if device == "cuda" else None,
                                              None if device == "cuda" else 1, device)
        sel = RS.select_cases(sweep, cfgs, seqlens, phase, gate_profile)  # shared with `qlabench warm`
        sw, chosen, phases, gate, cases = sel.sweep, sel.presets, sel.phases, sel.gate_profile, sel.cases
        names = parse_backends(backends or (sw.backends if sw and sw.backends else RS.DEFAULT_BACKENDS[device]))
        bes = [get_backend(n) for n in names]
        settings = sw.settings if sw else {}
        qk = "cuda" if device == "cuda" else "cpu"
        warmup = warmup if warmup is not None else (RN.QUICK_WARMUP[qk] if quick
                                                    else settings.get("warmup", RN.DEFAULT_WARMUP))
        repeats = repeats if repeats is not None else (RN.QUICK_REPEATS[qk] if quick
                                                       else settings.get("repeats", RN.DEFAULT_REPEATS))
        cfg = RN.RunConfig(device=device, timer=timer, l2=l2, warmup=warmup, repeats=repeats,
                           tolerance=tolerance, quick=quick, seed=seed, with_h0=not no_h0,
                           verify_kernels=verify_kernels, kernel_split=kernel_split)
        from qlabench.timing import resolve_l2, resolve_timer

        timer_used = resolve_timer(timer, device)
        env = envinfo.collect(device, index=(slots[0].gpu_index or 0) if slots else 0)
        label = sw.name if sw else "+".join(p.name for p in chosen)
        if not sw or phase:
            label += "_" + "-".join(phases)
        label += "_quick" if quick else ""
        out_path = Path(out) if out else RS.default_out_path(env["gpu_name"], env["git_commit"], label)
        run = {
            "argv": ["qlabench", *sys.argv[1:]], "sweep": sw.name if sw else None,
            "arch": arch or (sw.arch if sw else None), "seed": seed, "phases": phases, "backends": names,
            "gate_profile": gate, "timer": timer_used, "warmup": warmup, "repeats": repeats,
            "l2_policy": resolve_l2(l2, timer_used), "quick": quick, "tolerance": tolerance,
            "device": device, "presets": [p.name for p in chosen], "n_cases": len(cases),
            "with_h0": not no_h0, "verify_kernels": verify_kernels, "kernel_split": kernel_split,
            "cpu_max_tokens": cfg.cpu_max_tokens if device == "cpu" and quick else None,
            "gpus": [s.gpu_index for s in slots] if slots and device == "cuda" else None,
            "workers": len(slots) if slots else None, "case_timeout_s": case_timeout,
            "option_defaults": KernelOptions().as_dict(),  # what `qla` means in this file's names
        }
        lock = RS.prepare_out(out_path)  # before anything is measured: writable, and ours alone
        res = RS.open_results(out_path, env, run, resume)
    except (ValueError, TypeError) as exc:  # ConfigError, RunSetupError, ResultsError, bad backend names
        if lock is not None:
            lock.release()
        _setup_error(str(exc))
    try:
        _run_locked(res, out_path, cfg, bes, names, cases, slots, env, sw, arch, device, quick, note,
                    no_progress, resume, case_timeout, verbose)
    finally:
        lock.release()


def _run_locked(res, out_path, cfg, bes, names, cases, slots, env, sw, arch, device, quick, note, no_progress,
                resume, case_timeout, verbose=False) -> None:
    """The measuring part of `qlabench run`, while this process holds the lock on ``out_path``."""
    from qlabench import results as R
    from qlabench import runner as RN
    from qlabench import shard as SH

    if note:
        click.echo(note, err=True)
    if device == "cpu":
        click.echo(f"NOTE: {RN.CPU_NOTICE}." + ("" if quick else " Full-size patterns in float64 on the "
                   "CPU are very slow; --quick shrinks them."), err=True)
    if sw and sw.arch and device == "cuda" and not arch:
        click.echo(f"sweep {sw.name} is meant for {sw.arch} (not checked; pass --arch to enforce)", err=True)
    click.echo(f"{len(cases)} cases x {len(bes)} backends ({', '.join(names)}) on {env['gpu_name'] or 'cpu'}"
               + (f", {len(slots)} workers" if slots else "") + f" -> {out_path}", err=True)
    echo = lambda m: click.echo(m, err=True)
    if not slots:
        runner = RN.Runner(cfg, bes, res, out_path, progress=not no_progress, echo=echo,
                           row_fields=SH.local_row_fields(device, env))
        for b in bes:
            ok, why = runner.avail[b.name]
            if not ok:
                click.echo(f"  {b.name}: unavailable: {why}", err=True)
    try:
        if slots:  # qlabench/shard.py: worker processes, rows merged into out_path as they arrive
            SH.run_sharded(cfg, bes, res, out_path, cases, slots, progress=not no_progress, echo=echo,
                           recover=resume, case_timeout=case_timeout)
        else:
            runner.run(cases)
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: {len(res['rows'])} rows kept in {out_path}", err=True)
        raise SystemExit(130) from None
    if device == "cpu":
        click.echo(f"=== {RN.CPU_NOTICE}: a smoke test of the float64 torch reference"
                   + (f" at <= {cfg.cpu_max_tokens} tokens per case (Seqlens: as run)" if quick else "")
                   + ", not a benchmark ===")
    click.echo(_end_of_run_tables(res, verbose))
    counts = {s: sum(r["status"] == s for r in res["rows"]) for s in R.STATUSES}
    click.echo(f"wrote {out_path}: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))


def _end_of_run_tables(res: dict, verbose: bool) -> str:
    """The run's report: everything with --verbose; else without the first-call section (its paragraph
    of explanation printed after every run hid the tables; `qlabench report FILE` still shows it)."""
    from qlabench import runsetup as RS

    if verbose:
        return RS.format_tables(res)
    try:
        from dataclasses import replace

        from qlabench.report.tables import build_report, render_text

        return render_text(replace(build_report(res), first_calls=[]))
    except Exception:  # noqa: BLE001 - the rows are saved; the table is a convenience (format_tables falls back)
        return RS.format_tables(res)


@main.command("list")
@click.argument("what", type=click.Choice(["configs", "seqlens", "sweeps", "cases", "backends"]))
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Device to check backends on [default: cuda when a GPU is visible, else cpu].")
@click.option("--sweep", default=None, help="For `list cases`: the sweep whose cases to list (name or .toml path).")
def list_cmd(what, device, sweep) -> None:
    """Head presets, seqlen sets, sweeps, a sweep's cases (--sweep), or backends with their availability."""
    from qlabench import config as C

    try:
        if what == "cases":
            if not sweep:
                raise C.ConfigError("list cases needs --sweep NAME (see `qlabench list sweeps`)")
            sw = C.load_sweep(sweep)
            click.echo(f"{sw.name}: {len(sw.cases)} cases, phases {','.join(sw.phases)}, backends "
                       f"{','.join(sw.backends or [])}" + (f", arch {sw.arch}" if sw.arch else ""))
            for line in C.describe_cases(sw.cases):
                click.echo(line)
        elif what == "configs":
            click.echo(f"{'preset':12} {'h_qk':>4} {'h_v':>4}  model")
            for p in C.load_presets().values():
                click.echo(f"{p.name:12} {p.h_qk:4d} {p.h_v:4d}  {p.model}")
            click.echo("(any hkN_hvM with M a multiple of N is accepted too)")
        elif what == "seqlens":
            sets = C.load_seqlens()
            click.echo(f"defaults: {', '.join(f'{k} -> {v}' for k, v in sets.defaults.items())}; "
                       f"cut_seed = {sets.cut_seed}")
            for name in sets.sets:
                click.echo(f"[{name}]")
                for p in sets.patterns([name]):
                    lens = ",".join(map(str, p.seqlens)) if p.n_seqs <= 8 else f"{p.n_seqs} seqs"
                    click.echo(f"  {p.name:14} {p.total_tokens:6d} tokens  {p.n_seqs} seq  [{lens}]")
        elif what == "sweeps":
            for name in C.sweep_names():
                sw = C.load_sweep(name)
                click.echo(f"{name:12} {len(sw.cases):4d} cases  phases={','.join(sw.phases)}  "
                           f"backends={','.join(sw.backends or [])}  {sw.description}")
        else:
            import torch

            from qlabench.backends import backend_names, get_backend

            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            for name in backend_names():
                b = get_backend(name)
                ok, why = b.available(device)
                state = "available" if ok else f"unavailable: {why}"
                version = b.version() if ok else None
                click.echo(f"{name:10} {state}" + (f"  ({version})" if version else "")
                           + (f"  [{why}]" if ok and why else "") + f"\n{'':10} {b.description}")
            from qlabench.kernels.options import CHOICES, MEANING

            click.echo("\nqla variants: qla:key=value+key=value (e.g. qla:cp=on+bwd_dh=ws), one column each; "
                       "plain qla also takes the QLABENCH_* switches of the environment")
            for key, choices in CHOICES.items():
                click.echo(f"  {key:10} {'|'.join(choices):24} {MEANING[key]}")
    except (ValueError, TypeError) as exc:
        _setup_error(str(exc))


@main.command("env")
@click.option("--json", "as_json", is_flag=True, help="Print the env block as JSON.")
def env_cmd(as_json) -> None:
    """The machine as a results file's env block records it (GPU, clocks, driver, versions, commit)."""
    import json

    import torch

    from qlabench import envinfo

    env = envinfo.collect("cuda" if torch.cuda.is_available() else "cpu")
    if as_json:
        click.echo(json.dumps(env, indent=1))
        return
    for k, v in env.items():
        if isinstance(v, dict):
            v = "  ".join(f"{a}={b}" for a, b in v.items())
        click.echo(f"{k:20} {v}")


# --- compile caches: warm (qlabench/warm.py) ---


@main.command("warm")
@click.option("--cfg", "cfgs", multiple=True,
              help="Head preset(s) hk<h_qk>_hv<h_v>, repeatable or comma list [default: the sweep's presets].")
@click.option("--sweep", default=None,
              help="Sweep name in configs/sweeps/ (h200-fwd, h200-bwd, ci-smoke, stress) or a .toml path.")
@click.option("--seqlens", "seqlens", multiple=True,
              help="Pattern sets and/or patterns, as for `qlabench run` [default: the sweep's, else the phase's set].")
@click.option("--phase", default=None,
              help="fwd, bwd, fwdbwd or all (comma list allowed) [default: the sweep's phases, else fwd].")
@click.option("--gate-profile", type=click.Choice(GATE_PROFILES), default=None,
              help="Gate distribution of the inputs [default: the sweep's, else bench].")
@click.option("--backends", default=None,
              help="Comma list from `qlabench list backends` [default: fla,flash_qla on CUDA, torch on the CPU; "
              "qla warms our TileLang kernels].")
@click.option("--pattern", default=None,
              help="Inputs of each first call: first (the selection's first pattern of that preset and phase), "
              "smallest (its fewest tokens) or one pattern for all, e.g. 2048+2048 [default: first].")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Task processes at once [default: min(tasks, CPU cores // 2)].")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Where the first calls run [default: cuda when a GPU is visible].")
@click.option("--timeout-s", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Wall seconds a task may take (process start included); past it the task is killed and "
              "becomes an error row.")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed of the inputs (as `qlabench run`).")
@click.option("--no-h0", is_flag=True, help="Inputs without an initial state (match the run's --no-h0).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Also write the table as JSON here.")
@click.option("--dry-run", is_flag=True, help="Print the tasks and exit without running them.")
def warm_cmd(cfgs, sweep, seqlens, phase, gate_profile, backends, pattern, jobs, device, timeout_s, seed, no_h0,
             out, dry_run) -> None:
    """One first call per (head preset, phase, backend), in parallel processes, to fill compile caches.

    Run it on a fresh GPU host before `qlabench run` with the same selection: FLA's Triton binaries and
    flash-qla's TileLang kernels land in their on-disk caches, so the timed sweep compiles little.
    Triton autotune choices are not saved (TRITON_CACHE_AUTOTUNING is unset in the tasks): the run
    still autotunes alone on the GPU. Exit 0 when no task failed, 1 when one did.
    """
    import os
    import time

    import torch

    from qlabench import runsetup as RS
    from qlabench import warm as W
    from qlabench.backends import get_backend, parse_backends

    try:
        if device is None and not torch.cuda.is_available():
            raise RS.RunSetupError("no CUDA GPU is visible: warm fills GPU compile caches; pass --device cpu "
                                   "(with --backends torch) to run the pool on the CPU")
        device, _ = RS.resolve_device(device or "cuda", quick=False)
        sel = RS.select_cases(sweep, cfgs, seqlens, phase, gate_profile)  # the same selection as `run`
        names = parse_backends(backends or W.DEFAULT_BACKENDS[device])
        tasks = W.plan_tasks(sel.cases, [get_backend(n) for n in names], W.resolve_pattern(pattern))
        jobs = jobs or W.default_jobs(len(tasks))
        threads = max(1, torch.get_num_threads() // jobs) if device == "cpu" else None
        opts = W.WarmOptions(device=device, seed=seed, with_h0=not no_h0, threads=threads)
    except (ValueError, TypeError) as exc:  # ConfigError, RunSetupError, bad backend or pattern
        _setup_error(str(exc))
    label = sel.sweep.name if sel.sweep else "+".join(p.name for p in sel.presets)
    click.echo(f"warm {label}: {len(tasks)} tasks ({len(sel.presets)} presets x {len(sel.phases)} phases x "
               f"{len(names)} backends: {', '.join(names)}) on {device}, {jobs} at once, timeout {timeout_s:g} s",
               err=True)
    if dry_run:
        for t in tasks:
            click.echo(f"{t.preset.name:12} {t.phase:6} {t.backend.name:10} {t.pattern.name:14} "
                       f"{t.pattern.total_tokens:6d} tokens  {t.pattern.n_seqs} seq")
        return
    if os.environ.get(W.AUTOTUNE_CACHE_VAR):
        click.echo(f"note: {W.AUTOTUNE_CACHE_VAR} is set here; the warm tasks run without it (contended "
                   "autotune choices are not saved)", err=True)
    caches = W.cache_dirs()
    click.echo(f"caches: triton {caches['triton']}, tilelang {caches['tilelang']}", err=True)

    def done(row, n, total):
        click.echo(f"[{n}/{total}] " + W.format_row(row), err=True)

    pool = W.WarmPool(tasks, opts, jobs, timeout_s, on_done=done)
    t0 = time.monotonic()
    interrupted = False
    try:
        pool.run()
    except KeyboardInterrupt:
        interrupted = True
    rows, wall = pool.rows, time.monotonic() - t0
    click.echo(W.format_table(rows))
    click.echo(W.summary(rows, len(tasks), wall))
    if out:
        W.save(out, rows, W.meta_block(opts, jobs, timeout_s, len(tasks), wall))
        click.echo(f"wrote {out}", err=True)
    if interrupted:
        click.echo(f"interrupted: {len(rows)} of {len(tasks)} tasks finished", err=True)
        raise SystemExit(130)
    if any(r["status"] == "error" for r in rows):
        raise SystemExit(1)


# --- reports: report (qlabench/report/) ---


@main.command("report")
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["text", "md", "csv", "html"]), default="text",
              show_default=True, help="Output format; md adds a summary per preset and overall.")
@click.option("--subject", default=None, help="Backend the speedups are about [default: qla if it has ok rows, "
              "else the first backend].")
@click.option("--baseline", "peers", multiple=True, help="Peer backend(s) to compare against, repeatable "
              "[default: every other backend].")
@click.option("--phase", "phases", multiple=True, type=click.Choice(["fwd", "bwd", "fwdbwd"]),
              help="Phases to show, repeatable [default: all present].")
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False), default=None,
              help="Write PNG plots here; with --format md also DIR/REPORT.md embedding them.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None,
              help="Write the report to this file instead of stdout.")
def report_cmd(results, fmt, subject, peers, phases, plots_dir, out_file) -> None:
    """Speedup tables (FlashQLA's H200 layout) and plots from one or more results files.

    Never writes over one of RESULTS (--out, DIR/REPORT.md, a plot); plot file names are built from
    sanitised phase and backend names and stay inside --plots DIR. Bad input exits 2 with one line.
    """
    import os
    from pathlib import Path

    from qlabench.report import build_report, render

    inputs = {Path(r).resolve() for r in results}

    def check_target(path: str, what: str) -> None:
        if Path(path).resolve() in inputs:
            raise ValueError(f"{what} {path} is one of the input results files; refusing to overwrite it")
        if os.path.isdir(path):
            raise ValueError(f"{what} {path} is a directory")

    try:
        if out_file:
            check_target(out_file, "--out")
        if plots_dir and fmt == "md" and not out_file:
            out_file = os.path.join(plots_dir, "REPORT.md")
            check_target(out_file, "--plots")
        rep = build_report(list(results), subject=subject, peers=list(peers) or None, phases=list(phases) or None)
        made: dict[str, list[str]] = {}
        if plots_dir:
            from qlabench.report.plots import write_plots

            made = write_plots(rep, plots_dir, protect=inputs)
        if made and out_file:  # image links relative to the markdown file
            rel = os.path.relpath(plots_dir, os.path.dirname(os.path.abspath(out_file)) or ".")
            made = {k: [os.path.normpath(os.path.join(rel, f)) for f in v] for k, v in made.items()}
        text = render(rep, fmt, plots=made if fmt == "md" else None)
        if out_file:  # atomically, creating a missing folder (as run --out does)
            from qlabench.results import write_atomic

            write_atomic(out_file, text)
    except (ValueError, TypeError) as exc:  # ResultsError is a ValueError
        _setup_error(f"report: {exc}")
    except OSError as exc:
        _setup_error(f"report: cannot write {exc.filename or out_file or plots_dir}: {exc.strerror or exc}")
    if out_file:
        click.echo(f"wrote {out_file}", err=True)
    else:
        click.echo(text, nl=False)
    for phase, files in made.items():
        click.echo(f"plots ({phase}): {', '.join(files)}", err=True)


# --- regression tracking: compare, gate, history (qlabench/gate.py, history.py) ---


@main.command("compare")
@click.argument("base", type=click.Path(exists=True, dir_okay=False))
@click.argument("current", type=click.Path(exists=True, dir_okay=False))
@click.option("--min-effect", default="2%", show_default=True,
              help="Smallest relative change called FASTER/SLOWER (also the SAME band).")
@click.option("--backend", "backends", multiple=True, help="Only these backends, repeatable [default: all].")
@click.option("--changes-only", is_flag=True, help="List only rows that are not SAME.")
@click.option("--allow-different-gpu", is_flag=True, help="Compare even if the GPU models differ.")
def compare_cmd(base, current, min_effect, backends, changes_only, allow_different_gpu) -> None:
    """Per-row ratio and verdict (FASTER/SLOWER/SAME/NOISY) of CURRENT against BASE."""
    from qlabench.gate import CompareError, compare, format_comparison, parse_percent

    try:
        cmp = compare(base, current, min_effect=parse_percent(min_effect), backends=list(backends) or None,
                      allow_different_gpu=allow_different_gpu)
    except (CompareError, ValueError, TypeError) as exc:
        _setup_error(f"compare: {exc}")
    click.echo(format_comparison(cmp, only_changes=changes_only), nl=False)


@main.command("gate")
@click.argument("current", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--baseline", type=click.Path(dir_okay=False), default=None,
              help="Baseline results of the same GPU model (e.g. results/baselines/h200.json) [default: none; "
              "then only the in-run requirements and correctness gate].")
@click.option("--max-regression", default="5%", show_default=True,
              help="Largest confirmed slowdown against the baseline that still passes.")
@click.option("--min-speedup", "min_speedups", multiple=True,
              help="SUBJECT/PEER=RATIO, repeatable: geomean of peer time / subject time inside CURRENT must "
              "reach RATIO (e.g. qla/fla=2.5); the peer's rows may come from another CURRENT file.")
@click.option("--min-case-speedup", "min_case_speedups", multiple=True,
              help="SUBJECT/PEER=RATIO, repeatable: peer time / subject time must reach RATIO in every case both ran "
              "ok (e.g. qla/flash_qla=0.8).")
@click.option("--max-memory", "max_memory", multiple=True,
              help="SUBJECT/PEER=RATIO, repeatable: subject peak memory / peer peak memory must stay at or under "
              "RATIO in every case both ran ok (e.g. qla/flash_qla=1.25).")
@click.option("--backend", "backends", multiple=True,
              help="Backend(s) whose correctness and times are gated [default: qla if it has ok rows].")
@click.option("--min-effect", default="2%", show_default=True, help="Noise band for verdicts (see compare).")
def gate_cmd(current, baseline, max_regression, min_speedups, min_case_speedups, max_memory, backends,
             min_effect) -> None:
    """CI gate. Exit 0 pass; 1 a regression, a correctness failure, a baseline row missing from CURRENT,
    a ratio not met; 2 inputs that cannot be compared (invalid or empty results, other GPU model, ...)
    and any unexpected error (one line, never a pass).

    Several CURRENT files (one GPU model) are merged into one run, a row in two files taken from the
    later one: `gate qla.json peers.json --min-speedup qla/fla=2.5`."""
    from qlabench.gate import CompareError, gate, parse_min_speedup, parse_percent

    try:
        reqs = [parse_min_speedup(t) for t in min_speedups]
        case_reqs = [parse_min_speedup(t, "--min-case-speedup") for t in min_case_speedups]
        mem_reqs = [parse_min_speedup(t, "--max-memory") for t in max_memory]
        res = gate(list(current) if len(current) > 1 else current[0], baseline,
                   max_regression=parse_percent(max_regression), min_speedups=reqs,
                   backends=list(backends) or None, min_effect=parse_percent(min_effect),
                   min_case_speedups=case_reqs, max_memory=mem_reqs)
        text = res.render()
    except (CompareError, ValueError) as exc:  # ResultsError is a ValueError
        click.echo(f"gate: cannot compare: {exc}", err=True)
        raise SystemExit(2) from None
    except Exception as exc:  # noqa: BLE001 - whatever went wrong, the gate did not pass: exit 2
        click.echo(f"gate: error: {type(exc).__name__}: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo(text, nl=False)
    raise SystemExit(res.code)


@main.group("baseline")
def baseline_grp() -> None:
    """The baselines `qlabench gate --baseline` compares against (results/baselines/<gpu>.json)."""


@baseline_grp.command("update")
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("--gpu", required=True, help="GPU slug of the run and the file name, e.g. h200.")
@click.option("--backends", default=None,
              help="Comma list of backends whose ok rows to keep [default: every backend of RESULTS].")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None,
              help="Where to write [default: results/baselines/<gpu>.json].")
def baseline_update_cmd(results, gpu, backends, out_file) -> None:
    """Write a baseline from one run: its ok rows of the chosen backends, validated, written atomically.

    Refused (exit 2, one line) when RESULTS is not a valid results file with rows, was measured on
    another GPU than --gpu, or has a qla row that is not ok.
    """
    from pathlib import Path

    from qlabench import results as R
    from qlabench.gate import baseline_path, make_baseline

    names = [b.strip() for b in (backends or "").split(",") if b.strip()]
    try:
        out = Path(out_file or baseline_path(gpu))
        if out.resolve() == Path(results).resolve():
            raise ValueError(f"--out {out} is RESULTS itself; refusing to overwrite the run")
        doc = make_baseline(R.load(results, allow_empty=False), results, gpu, names or None)
        R.save(doc, out)
    except (ValueError, TypeError) as exc:  # ResultsError is a ValueError
        _setup_error(f"baseline update: {exc}")
    except OSError as exc:
        _setup_error(f"baseline update: cannot write {out}: {exc.strerror or exc}")
    per = {b: sum(r["backend"] == b for r in doc["rows"]) for b in doc["run"]["baseline"]["backends"]}
    click.echo(f"wrote {out}: {len(doc['rows'])} ok rows (" + ", ".join(f"{b} {n}" for b, n in per.items())
               + f") from {results}")


@main.command("history")
@click.argument("results_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--cfg", "cfg", multiple=True,
              help="Keep cases whose label (phase preset pattern [gate]) contains this, repeatable (AND).")
@click.option("--phase", "phases", multiple=True, type=click.Choice(["fwd", "bwd", "fwdbwd"]))
@click.option("--subject", default=None, help="Backend to follow [default: qla if it has ok rows].")
@click.option("--gpu", default=None, help="GPU name substring, required when the directory mixes GPU models.")
@click.option("--min-effect", default="5%", show_default=True, help="Smallest sustained change called a step.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), default=None, help="Write a PNG here.")
@click.option("--variants", is_flag=True,
              help="Keep A/B runs in the timeline: rows with kernel options (qla:bwd_dh=ws) and *.ab.json files "
              "[default: left out, each named on stderr].")
def history_cmd(results_dir, cfg, phases, subject, gpu, min_effect, plot_file, variants) -> None:
    """The subject's time and ratios per case across runs, with step detection and attribution.

    Every results file under RESULTS_DIR is a run, except (each named on stderr): runs without a GPU
    (CPU smoke runs), A/B variants unless --variants (rows whose backend carries kernel options, files
    named *.ab.json), and a copy of another run (same GPU, commit, timestamp, and its rows all in the
    other file: results/baselines/<gpu>.json) which is counted once."""
    from pathlib import Path

    from qlabench.gate import parse_percent
    from qlabench.history import build_history, format_history, load_runs, plot_history, timeline

    skipped: list[tuple[str, str]] = []
    try:
        runs, left_out = timeline(load_runs(results_dir, skipped), variants=variants)
        for note in left_out:
            click.echo(f"history: {note}", err=True)
        if not runs:
            raise ValueError(f"no GPU runs left under {results_dir!r} (see the lines above)")
        if gpu:
            runs = [r for r in runs if gpu.lower() in str(r.env.get("gpu_name") or "").lower()]
            if not runs:
                raise ValueError(f"no runs on a GPU matching {gpu!r} under {results_dir!r}")
        gpus = sorted({str(r.env.get("gpu_name")) for r in runs})
        if plot_file and Path(plot_file).resolve() in {Path(r.path).resolve() for r in runs}:
            raise ValueError(f"--plot {plot_file} is one of the results files read; refusing to overwrite it")
        if len(gpus) > 1:
            raise ValueError(f"{results_dir!r} mixes GPU models ({', '.join(gpus)}); pick one with --gpu")
        hist = build_history(runs, subject=subject, cfg=list(cfg), phases=list(phases) or None,
                             min_effect=parse_percent(min_effect))
    except (ValueError, TypeError) as exc:
        for _, why in skipped:
            click.echo(f"history: skipped {why}", err=True)
        _setup_error(f"history: {exc}")
    for _, why in skipped:
        click.echo(f"history: skipped {why}", err=True)
    click.echo(f"{len(runs)} runs on {gpus[0]}\n")
    click.echo(format_history(hist), nl=False)
    if plot_file and hist:
        try:  # the plot's folder is made, as report --plots makes its DIR; what cannot be written is one line
            Path(plot_file).parent.mkdir(parents=True, exist_ok=True)
            plot_history(hist, plot_file, gpu=gpus[0])
        except OSError as exc:
            _setup_error(f"history: cannot write {plot_file}: {exc.strerror or exc}")
        click.echo(f"wrote {plot_file}", err=True)


# --- kernels: aot (qlabench/kernels/aot.py) ---

AOT_DEFAULT_HEADS = "hk2_hv8,hk4_hv16,hk8_hv32,hk16_hv64,hk16_hv32,hk8_hv24,hk16_hv48,hk16_hv16,hk32_hv32"


def _parse_heads(items: tuple[str, ...]) -> list[tuple[int, int]]:
    import re

    heads = []
    for item in items:
        for name in filter(None, (x.strip() for x in item.split(","))):
            m = re.fullmatch(r"hk(\d+)_hv(\d+)", name)
            if not m or int(m.group(1)) == 0 or int(m.group(2)) % int(m.group(1)):
                raise click.BadParameter(f"{name!r} is not a head configuration hk<H_qk>_hv<H_v> with H_v a "
                                         "multiple of H_qk", param_hint="--cfg")
            heads.append((int(m.group(1)), int(m.group(2))))
    return heads


@main.command()
@click.option("--arch", required=True, type=click.Choice(["sm90", "sm100", "sm120"]),
              help="Architecture to compile for (explicit target: sm_90a / sm_100a / sm_120a).")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="TileLang cache directory [default: $TILELANG_CACHE_DIR or ~/.tilelang/cache].")
@click.option("--cfg", "cfgs", multiple=True, default=(AOT_DEFAULT_HEADS,), show_default=True,
              help="Head configurations hk<H_qk>_hv<H_v> (repeatable or comma-separated).")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(["bfloat16", "float16"]),
              default=("bfloat16",), show_default=True, help="Activation dtypes (repeatable).")
@click.option("--state-layout", type=click.Choice(["both", "kv", "vk"]), default="both", show_default=True,
              help="State layouts: kv = [K, V], vk = state_v_first.")
@click.option("--no-backward", is_flag=True, help="Compile only the forward kernels.")
@click.option("--verbose", is_flag=True, help="Let TileLang's INFO lines (begin / end of each compile) through.")
def aot(arch, cache_dir, cfgs, dtypes, state_layout, no_backward, verbose):
    """Compile every kernel the API would launch for ARCH, without a GPU, into the TileLang cache.

    One line per kernel: `compiled` (a new cache entry) or `cached` (already in the cache: loaded), with
    the seconds it took. TileLang's INFO lines are silenced unless --verbose.
    """
    import logging
    import os

    if cache_dir:
        os.environ["TILELANG_CACHE_DIR"] = os.path.abspath(cache_dir)
    heads = _parse_heads(cfgs)
    layouts = {"both": (False, True), "kv": (False,), "vk": (True,)}[state_layout]
    from qlabench.kernels.aot import compile_all, not_available

    if not verbose:  # TileLang logs two INFO lines per kernel; its import sets the level, so after it
        import tilelang  # noqa: F401

        logging.getLogger("tilelang").setLevel(logging.WARNING)
    click.echo(f"compiling for {arch} into {os.environ.get('TILELANG_CACHE_DIR', '~/.tilelang/cache')}")
    for line in not_available(arch, backward=not no_backward):
        click.echo(f"  skipped: {line}")
    done = compile_all(heads, arch, dtypes=dtypes, state_layouts=layouts, backward=not no_backward,
                       on_done=lambda c: click.echo(f"  {c.kernel:<28} {c.config:<36} "
                                                    f"{'cached' if c.cached else 'compiled':<8} {c.seconds:6.1f} s"))
    n_cached = sum(c.cached for c in done)
    click.echo(f"{len(done) - n_cached} kernels compiled, {n_cached} cached ({sum(c.seconds for c in done):.1f} s)")
