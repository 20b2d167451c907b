"""The stress sweep through the command line, on the CPU: its listing, and a shrunken run of it."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from qlabench.cli import main


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_list_cases_of_the_stress_sweep():
    res = _invoke("list", "cases", "--sweep", "stress")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "stress: 104 cases, phases fwd,bwd, backends qla,fla,flash_qla, arch sm90"
    assert len(lines) == 2 + 104
    padded = next(ln.split() for ln in lines if "pad1000" in ln)
    assert padded[:6] == ["fwd", "hk2_hv16", "256*1+64*63+64*65+pad1000", "384", "8448", "1000"]
    assert any(ln.split()[-2:] == ["bench", "beta=near0"] for ln in lines)
    assert any(ln.split()[2] == "1x262144" and ln.split()[-1] == "extreme" for ln in lines)
    missing = _invoke("list", "cases")
    assert missing.exit_code == 2 and "list cases needs --sweep" in missing.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_run_stress_on_sm90_needs_the_gpu():
    res = _invoke("run", "--arch", "sm90", "--sweep", "stress")
    assert res.exit_code == 2 and "--arch sm90: no CUDA GPU is visible" in res.output
