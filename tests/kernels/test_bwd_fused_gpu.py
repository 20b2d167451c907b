"""bwd_dh=fused (hopper/bwd_fused.py; the default on CP backwards of few chains, backward.cp_dh_choice) against autograd
of the float64 reference and against bwd_chunk's kernels on the same inputs, plain and over CP pieces (rel-L2 <= 0.02
per gradient); and the API's default training step taking it.

Run on an H200:  pytest -q -m gpu tests/kernels/test_bwd_fused_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from qlabench.kernels import KernelOptions, backward

from .gdn_inputs import rel_l2
from .test_backward_gpu import (
    NAMES,
    TOL,
    _varlen,
    autograd_errors,
    forward_for_backward,
    make_inputs,
    nan_buffers,
    reference_grads,
)

pytestmark = pytest.mark.gpu
FUSED = KernelOptions(bwd_dh="fused")
__all__ = ["nan_buffers"]  # the fixture, imported for the tests below


def _errors(got, want, default, cu):
    errs = {}
    for n in NAMES:
        if want[n] is None:
            assert got[n] is None, n
            continue
        assert got[n].shape == default[n].shape and got[n].dtype == default[n].dtype, n
        assert torch.isfinite(got[n]).all(), f"{n} has NaN/Inf"
        errs[f"{n}_ref"] = rel_l2(got[n], want[n])
        errs[f"{n}_default"] = rel_l2(got[n], default[n])
    if cu is not None:
        end = int(cu[-1])
        for n in ("dq", "dk", "dv", "dbeta", "dg"):
            assert torch.all(got[n].flatten(0, 1)[end:] == 0), f"{n} not zero on the padding tail"
    bad = {key: val for key, val in errs.items() if not val <= TOL}
    assert not bad, f"over {TOL}: {bad} ({errs})"
    return errs


def _check(inp, plan_kw=None):
    g_cumsum, A = forward_for_backward(inp)
    do = torch.randn(inp["v"].shape, device="cuda").bfloat16()
    args = (inp["q"], inp["k"], inp["v"], g_cumsum, inp["beta"], A, do, inp["dht"])
    kw = {"initial_state": inp["initial_state"], "cu_seqlens": inp["cu_seqlens"], "state_v_first": inp["state_v_first"]}
    default = dict(zip(NAMES, backward.chunk_gated_delta_rule_bwd(*args, **kw)))
    want = reference_grads(inp, do)
    if plan_kw is None:
        got = dict(zip(NAMES, backward.chunk_gated_delta_rule_bwd(*args, **kw, options=FUSED)))
    else:
        from qlabench.kernels.backward_cp import chunk_gated_delta_rule_bwd_cp
        from qlabench.kernels.cp import plan_cp
        from qlabench.kernels.forward import _sm_count

        B, T, H = inp["v"].shape[:3]
        plan = plan_cp(inp["cu_seqlens"], heads=H, sm_count=_sm_count(inp["q"].device), chunk_size=64, B=B, T=T,
                       device=inp["q"].device, enable=True, **plan_kw)
        assert plan.n_pieces > (B if inp["cu_seqlens"] is None else inp["cu_seqlens"].numel() - 1)
        got = dict(zip(NAMES, chunk_gated_delta_rule_bwd_cp(*args, **kw, plan=plan, options=FUSED)))
    return _errors(got, want, default, inp["cu_seqlens"])


@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_plain_varlen_tail(gate, nan_buffers):
    cu, T = _varlen([300, 1, 64, 129, 65], tail=37)
    _check(make_inputs(T, 4, 4, cu_seqlens=cu, gate=gate, h0=True))


@pytest.mark.parametrize("dht", [True, False], ids=["dht", "nodht"])
@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_plain_layouts(dht, state_v_first, nan_buffers):
    _check(make_inputs(1000, 2, 2, B=2, gate="qwen", h0=True, dht=dht, state_v_first=state_v_first))


@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_cp_pieces(gate, nan_buffers):
    cu, T = _varlen([4000, 700, 3000], tail=21)
    _check(make_inputs(T, 4, 4, cu_seqlens=cu, gate=gate, h0=True), {"piece_chunks": 8})


@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_autograd_default_takes_fused(gate, monkeypatch):
    """`chunk_gated_delta_rule` under autograd with the default options, on a call whose training forward runs CP over
    few chains (4 v-heads, 4.7 effective chains): its backward runs bwd_fused (counted), gradients against the float64
    reference."""
    launches = []
    fused_grads = backward.fused_grads
    monkeypatch.setattr(backward, "fused_grads", lambda *a, **kw: launches.append(1) or fused_grads(*a, **kw))
    cu, T = _varlen([6000, 1000], tail=3)
    autograd_errors(make_inputs(T, 4, 4, cu_seqlens=cu, gate=gate, h0=True))
    assert launches == [1], "the default backward did not run bwd_fused"
