"""The `qlabench` command line: run, report, compare, gate, history, list, env, aot."""

from __future__ import annotations

import click

from qlabench import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="qlabench")
def main() -> None:
    """qlabench: Gated DeltaNet kernels and the suite that measures and tracks them."""


# --- suite core: run, list, env (qlabench/runner.py, config.py, backends.py, envinfo.py) ---


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
    """Speedup tables (FlashQLA's H200 layout) and plots from one or more results files."""
    import os

    from qlabench.report import ResultsError, build_report, render

    try:
        rep = build_report(list(results), subject=subject, peers=list(peers) or None, phases=list(phases) or None)
    except (ResultsError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    made: dict[str, list[str]] = {}
    if plots_dir:
        from qlabench.report.plots import write_plots

        made = write_plots(rep, plots_dir)
        if fmt == "md" and not out_file:
            out_file = os.path.join(plots_dir, "REPORT.md")
    if made and out_file:  # image links relative to the markdown file
        rel = os.path.relpath(plots_dir, os.path.dirname(os.path.abspath(out_file)) or ".")
        made = {k: [os.path.normpath(os.path.join(rel, f)) for f in v] for k, v in made.items()}
    text = render(rep, fmt, plots=made if fmt == "md" else None)
    if out_file:
        with open(out_file, "w") as fh:
            fh.write(text)
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
    except (CompareError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(format_comparison(cmp, only_changes=changes_only), nl=False)


@main.command("gate")
@click.argument("current", type=click.Path(dir_okay=False))
@click.option("--baseline", type=click.Path(dir_okay=False), default=None,
              help="Baseline results of the same GPU model (e.g. results/baselines/h200.json) [default: none; "
              "then only --min-speedup and correctness gate].")
@click.option("--max-regression", default="5%", show_default=True,
              help="Largest confirmed slowdown against the baseline that still passes.")
@click.option("--min-speedup", "min_speedups", multiple=True,
              help="SUBJECT/PEER=RATIO, repeatable: geomean of peer time / subject time inside CURRENT must "
              "reach RATIO (e.g. qla/fla=2.5).")
@click.option("--backend", "backends", multiple=True,
              help="Backend(s) whose correctness and times are gated [default: qla if it has ok rows].")
@click.option("--min-effect", default="2%", show_default=True, help="Noise band for verdicts (see compare).")
def gate_cmd(current, baseline, max_regression, min_speedups, backends, min_effect) -> None:
    """CI gate. Exit 0 pass, 1 regression / correctness failure / ratio not met, 2 inputs not comparable."""
    from qlabench.gate import CompareError, gate, parse_min_speedup, parse_percent

    try:
        reqs = [parse_min_speedup(t) for t in min_speedups]
        res = gate(current, baseline, max_regression=parse_percent(max_regression), min_speedups=reqs,
                   backends=list(backends) or None, min_effect=parse_percent(min_effect))
    except (CompareError, ValueError) as exc:
        click.echo(f"gate: cannot compare: {exc}", err=True)
        raise SystemExit(2) from exc
    click.echo(res.render(), nl=False)
    raise SystemExit(res.code)


@main.command("history")
@click.argument("results_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--cfg", "cfg", multiple=True,
              help="Keep cases whose label (phase preset pattern [gate]) contains this, repeatable (AND).")
@click.option("--phase", "phases", multiple=True, type=click.Choice(["fwd", "bwd", "fwdbwd"]))
@click.option("--subject", default=None, help="Backend to follow [default: qla if it has ok rows].")
@click.option("--gpu", default=None, help="GPU name substring, required when the directory mixes GPU models.")
@click.option("--min-effect", default="5%", show_default=True, help="Smallest sustained change called a step.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), default=None, help="Write a PNG here.")
def history_cmd(results_dir, cfg, phases, subject, gpu, min_effect, plot_file) -> None:
    """The subject's time and ratios per case across runs, with step detection and attribution."""
    from qlabench.gate import parse_percent
    from qlabench.history import build_history, format_history, load_runs, plot_history

    try:
        runs = load_runs(results_dir)
        if gpu:
            runs = [r for r in runs if gpu.lower() in str(r.env.get("gpu_name") or "").lower()]
            if not runs:
                raise ValueError(f"no runs on a GPU matching {gpu!r} under {results_dir!r}")
        gpus = sorted({str(r.env.get("gpu_name")) for r in runs})
        if len(gpus) > 1:
            raise ValueError(f"{results_dir!r} mixes GPU models ({', '.join(gpus)}); pick one with --gpu")
        hist = build_history(runs, subject=subject, cfg=list(cfg), phases=list(phases) or None,
                             min_effect=parse_percent(min_effect))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(f"{len(runs)} runs on {gpus[0]}\n")
    click.echo(format_history(hist), nl=False)
    if plot_file and hist:
        plot_history(hist, plot_file, gpu=gpus[0])
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
def aot(arch, cache_dir, cfgs, dtypes, state_layout, no_backward):
    """Compile every kernel the API would launch for ARCH, without a GPU, into the TileLang cache."""
    import os

    if cache_dir:
        os.environ["TILELANG_CACHE_DIR"] = os.path.abspath(cache_dir)
    heads = _parse_heads(cfgs)
    layouts = {"both": (False, True), "kv": (False,), "vk": (True,)}[state_layout]
    from qlabench.kernels.aot import compile_all

    click.echo(f"compiling for {arch} into {os.environ.get('TILELANG_CACHE_DIR', '~/.tilelang/cache')}")
    done = compile_all(heads, arch, dtypes=dtypes, state_layouts=layouts, backward=not no_backward,
                       on_done=lambda c: click.echo(f"  {c.kernel:<28} {c.config:<36} {c.seconds:6.1f} s"))
    click.echo(f"{len(done)} kernels compiled ({sum(c.seconds for c in done):.1f} s)")
