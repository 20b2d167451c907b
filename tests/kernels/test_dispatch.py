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


# --- one place maps an arch to its kernel files (dispatch.kernel_factory), with a mocked GPU ---

def _mock_gpu(monkeypatch, cc):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)


# module of each forward kernel per arch: sm100 has its own tcgen05 files (blackwell/), sm120 its
# shared-memory-checked re-exports of the Hopper files (blackwell_sm120/)
FORWARD_FILES = {
    "sm90": {"kkt_solve": "hopper.kkt_solve", "chunk_fwd": "hopper.chunk_fwd", "chunk_fwd_pipelined": "hopper.chunk_fwd",
             "chunk_fwd_ws": "hopper.chunk_fwd_ws", "chunk_fwd_wy": "hopper.chunk_fwd_wy"},
    "sm100": {"kkt_solve": "blackwell.kkt_solve", "chunk_fwd": "blackwell.chunk_fwd",
              "chunk_fwd_pipelined": "blackwell.chunk_fwd"},
    "sm120": {"kkt_solve": "blackwell_sm120.kkt_solve", "chunk_fwd": "blackwell_sm120.chunk_fwd",
              "chunk_fwd_pipelined": "blackwell_sm120.chunk_fwd"},
}


@pytest.mark.parametrize("cc,name,chunk,target", [
    ((9, 0), "sm90", 64, "sm_90a"),
    ((10, 0), "sm100", 64, "sm_100a"),
    ((10, 3), "sm100", 64, "sm_100a"),
    ((12, 0), "sm120", 32, "sm_120a"),
    ((12, 1), "sm120", 32, "sm_120a"),
], ids=lambda x: ".".join(map(str, x)) if isinstance(x, tuple) else None)
def test_mocked_device_gets_its_kernels(monkeypatch, cc, name, chunk, target):
    from qlabench.kernels import kernels_available
    from qlabench.kernels.dispatch import arch_for_device, kernel_factory
    from qlabench.kernels.forward import recurrence_kernel

    _mock_gpu(monkeypatch, cc)
    arch = arch_for_device("cuda:0")
    assert (arch.name, arch.chunk_size, arch.target["arch"]) == (name, chunk, target)
    assert kernels_available() == (True, "")
    for role, module in FORWARD_FILES[name].items():
        factory = kernel_factory(arch, role)
        assert factory.__module__ == f"qlabench.kernels.{module}", role
        assert getattr(factory, "__wrapped__", factory).__name__ == f"{role}_kernel"
    # forward.py asks the same table for the recurrence: by default the warp-specialized ones where the
    # arch has them (sm90: ws at BV 32, wy at BV 64), else the pipelined one; the others only when forced
    # (the A/B switch)
    monkeypatch.delenv("QLABENCH_FWD_KERNEL", raising=False)
    default = "chunk_fwd_ws" if name == "sm90" else "chunk_fwd_pipelined"
    assert recurrence_kernel(10, 132, arch) is kernel_factory(arch, default)
    assert recurrence_kernel(1000, 132, name, bv=32) is kernel_factory(name, default)
    wide = "chunk_fwd_wy" if name == "sm90" else "chunk_fwd_pipelined"
    assert recurrence_kernel(1000, 132, name, bv=64) is kernel_factory(name, wide)
    monkeypatch.setenv("QLABENCH_FWD_KERNEL", "simple")
    assert recurrence_kernel(10, 132, arch) is kernel_factory(arch, "chunk_fwd")
    monkeypatch.setenv("QLABENCH_FWD_KERNEL", "pipelined")
    assert recurrence_kernel(10, 132, arch) is kernel_factory(arch, "chunk_fwd_pipelined")
    monkeypatch.setenv("QLABENCH_FWD_KERNEL", "ws")
    if name == "sm90":
        assert recurrence_kernel(10, 132, arch) is kernel_factory(arch, "chunk_fwd_ws")
    else:
        with pytest.raises(ValueError, match=rf"'chunk_fwd_ws' has no {name} version"):
            recurrence_kernel(10, 132, arch)
    monkeypatch.setenv("QLABENCH_FWD_KERNEL", "fast")
    with pytest.raises(ValueError, match="'fast'"):
        recurrence_kernel(10, 132, arch)


@pytest.mark.parametrize("name,has_bwd", [("sm90", True), ("sm100", True), ("sm120", False)])
def test_backward_kernels_per_arch(name, has_bwd):
    from qlabench.kernels.dispatch import BACKWARD_ROLES, kernel_factory, require_backward

    arch = ARCHS[name]
    assert arch.has_backward is has_bwd
    if has_bwd:
        require_backward(arch)
        # the per-chunk gradients: one fused kernel on sm90, bwd_state + bwd_intra on sm100
        own = {"sm90": ("bwd_chunk",), "sm100": ("bwd_state", "bwd_intra")}[name]
        for role in BACKWARD_ROLES:
            if role in ("bwd_chunk", "bwd_state", "bwd_intra") and role not in own:
                with pytest.raises(ValueError, match=f"{role!r} has no {name} version"):
                    kernel_factory(arch, role)
                continue
            # sm100 has tcgen05 files of its own (blackwell/); sm90 uses Hopper's
            prefix = "qlabench.kernels.blackwell.bwd_" if name == "sm100" else "qlabench.kernels.hopper.bwd_"
            assert kernel_factory(arch, role).__module__.startswith(prefix), role
    else:
        for call in [lambda: require_backward(arch)] + [lambda r=r: kernel_factory(arch, r) for r in BACKWARD_ROLES]:
            with pytest.raises(NotImplementedError, match=r"no backward kernels for sm120 .*12\.0 / 12\.1"):
                call()


@pytest.mark.parametrize("cc", [(8, 0), (8, 9), (11, 0), (9, 1)], ids=lambda cc: f"{cc[0]}.{cc[1]}")
def test_mocked_unknown_device_is_named(monkeypatch, cc):
    from qlabench.kernels import kernels_available
    from qlabench.kernels.dispatch import arch_for_device

    _mock_gpu(monkeypatch, cc)
    with pytest.raises(ValueError, match=rf"no qlabench kernels for compute capability {cc[0]}\.{cc[1]}"):
        arch_for_device("cuda")
    ok, why = kernels_available()
    assert not ok and f"{cc[0]}.{cc[1]}" in why


def test_unknown_kernel_role():
    from qlabench.kernels.dispatch import kernel_factory

    with pytest.raises(ValueError, match="'fused_fwd'"):
        kernel_factory("sm90", "fused_fwd")
    with pytest.raises(ValueError, match="'sm80'"):
        kernel_factory("sm80", "kkt_solve")


def test_sm120_backward_call_raises(monkeypatch):
    """On an sm120 device the backward API raises NotImplementedError before any work."""
    import torch

    from qlabench.kernels import backward

    monkeypatch.setattr(backward, "arch_for_device", lambda device: ARCHS["sm120"])
    T, H, D = 32, 1, 128
    x = torch.zeros(1, T, H, D, dtype=torch.bfloat16)
    gate = torch.zeros(1, T, H)
    with pytest.raises(NotImplementedError, match="no backward kernels for sm120"):
        backward.chunk_gated_delta_rule_bwd(x, x, x, gate, gate, torch.zeros(1, T, H, 32, dtype=x.dtype), x)
