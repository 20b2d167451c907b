"""The README's quick start renders the committed H200 results: the files it names exist and report."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from qlabench.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_readme_h200_report_lines_render(monkeypatch):
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if re.match(r"qlabench report results/h200/", ln)]
    assert len(lines) == 2, lines  # forward and backward
    monkeypatch.chdir(ROOT)
    for line in lines:
        args = shlex.split(line)[1:]
        files = [a for a in args if a.endswith(".json")]
        assert len(files) == 2 and all((ROOT / f).is_file() for f in files), line
        assert args[args.index("--plots") + 1].startswith("runs/")  # git-ignored
        res = CliRunner().invoke(main, ["report", *files])  # tables only: the plots are test_plots' part
        assert res.exit_code == 0, res.output
        assert "GPU: NVIDIA H200" in res.output and "vs fla" in res.output and "vs flash_qla" in res.output
