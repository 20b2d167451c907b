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


# --- regression tracking: compare, gate, history (qlabench/gate.py, history.py) ---


# --- kernels: aot (qlabench/kernels/aot.py) ---
