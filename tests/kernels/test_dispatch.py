"""Compute capability -> architecture module, chunk size and explicit TileLang target."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qlabench.kernels.dispatch import ARCHS, arch_by_name, arch_for_capability


@pytest.mark.parametrize("cc,name,module,chunk,target", [
    ((9, 0), "sm90", "hopper", 64, "sm_90a"),
    ((10, 0), "sm100", "blackwell", 64, "sm_100a"),
    ((10, 3), "sm100", "blackwell", 64, "sm_100a"),
    ((12, 0), "sm120", "blackwell_sm120", 32, "sm_120a"),
    ((12, 1), "sm120", "blackwell_sm120", 32, "sm_120a"),
], ids=lambda x: ".".join(map(str, x)) if isinstance(x, tuple) else None)
def test_capability_to_arch(cc, name, module, chunk, target):
    arch = arch_for_capability(*cc)
    assert (arch.name, arch.module, arch.chunk_size) == (name, module, chunk)
    assert arch.target == {"kind": "cuda", "arch": target}
    assert arch.target_key == f"cuda:{target}"


@pytest.mark.parametrize("cc", [(8, 0), (8, 9), (11, 0), (9, 1)], ids=lambda cc: f"{cc[0]}.{cc[1]}")
def test_unknown_capability_is_named(cc):
    with pytest.raises(ValueError, match=rf"compute capability {cc[0]}\.{cc[1]}"):
        arch_for_capability(*cc)


def test_only_sm120_lacks_backward():
    assert {a.name for a in ARCHS.values() if not a.has_backward} == {"sm120"}


@pytest.mark.parametrize("alias,name", [
    ("sm90", "sm90"), ("sm90a", "sm90"), ("sm100", "sm100"), ("sm100a", "sm100"), ("sm103", "sm100"),
    ("sm120", "sm120"), ("sm120a", "sm120"), ("sm121", "sm120"),
])
def test_arch_by_name(alias, name):
    assert arch_by_name(alias) is ARCHS[name]


@pytest.mark.parametrize("bad", ["sm80", "hopper", ""], ids=["sm80", "hopper", "empty"])
def test_arch_by_name_unknown(bad):
    with pytest.raises(ValueError, match=repr(bad)):
        arch_by_name(bad)


def test_import_needs_no_gpu():
    """Importing the kernel package (and its dispatch) on a machine without CUDA never fails."""
    code = (
        "import torch; torch.cuda.is_available = lambda: False\n"
        "import qlabench.kernels, qlabench.kernels.dispatch, qlabench.kernels.reference\n"
        "print(qlabench.kernels.chunk_gated_delta_rule.__name__)"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "chunk_gated_delta_rule"
