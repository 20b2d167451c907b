"""Helpers the command-line tests share."""

from __future__ import annotations

from click.testing import CliRunner

from qlabench.cli import main


def invoke(*args):
    """`qlabench ARGS` in-process; an exception propagates (a traceback fails the test, it is no exit code)."""
    return CliRunner().invoke(main, list(args), catch_exceptions=False)
