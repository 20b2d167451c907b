"""Intra-card CP backward (backward_cp.py) on the GPU: against the plain backward and the float64 reference.

Run on an H200:  pytest -q -m gpu tests/kernels/test_backward_cp_gpu.py

The CPU twin of this file is test_backward_cp.py. Every case runs our forward (g_cumsum, A as training does) and the plain
backward, then the CP backward three ways: the plan the model chooses (often off on small cases),
forced on with short pieces (4 chunks: long chains) with the piece initial states recomputed in the
backward, and forced on exactly (decay_threshold None) with the piece initial states from the CP
forward (``return_piece_states``). Each gradient must be finite and within relative L2 0.02 of the
float64 reference's autograd (test_backward_gpu.py's budget) and of the plain backward.
"""

from __future__ import annotations

import pytest
import torch

from .gdn_inputs import make_inputs, poison_cuda_cache, random_varlen, rel_l2
from .test_backward_gpu import NAMES, reference_grads

pytestmark = pytest.mark.gpu
TOL = 0.02
MODES = {"model": {}, "forced4": {"piece_chunks": 4, "enable": True},
         "forced16_exact_fwd_states": {"piece_chunks": 16, "enable": True, "exact": True, "states": "forward"}}


def _inputs(T, h_qk, h_v, *, dht=True, **kw):
    inp = make_inputs(T, h_qk, h_v, **kw)
    inp.setdefault("cu_seqlens", None)
    inp.setdefault("initial_state", None)
    N = inp["v"].shape[0] if inp["cu_seqlens"] is None else inp["cu_seqlens"].numel() - 1
    D = inp["v"].shape[-1]
    inp["dht"] = torch.randn(N, h_v, D, D, device="cuda") if dht else None
    return inp


def _check_cp(inp, modes=MODES):
    from qlabench.kernels.backward import chunk_gated_delta_rule_bwd
    from qlabench.kernels.backward_cp import chunk_gated_delta_rule_bwd_cp
    from qlabench.kernels.cp import plan_cp
    from qlabench.kernels.dispatch import arch_for_device
    from qlabench.kernels.forward import _sm_count, chunk_gated_delta_rule_fwd
    from qlabench.kernels.forward_cp import chunk_gated_delta_rule_fwd_cp

    x = {key: inp[key] for key in ("q", "k", "v", "g", "beta")}
    h0, cu, vf, dht = inp["initial_state"], inp["cu_seqlens"], inp["state_v_first"], inp["dht"]
    g_cumsum, A, _, _, _ = chunk_gated_delta_rule_fwd(**x, initial_state=h0, cu_seqlens=cu, state_v_first=vf)
    do = torch.randn(inp["v"].shape, device="cuda").bfloat16()
    bargs = (x["q"], x["k"], x["v"], g_cumsum, x["beta"], A, do, dht)
    bkw = {"initial_state": h0, "cu_seqlens": cu, "state_v_first": vf}
    plain = dict(zip(NAMES, chunk_gated_delta_rule_bwd(*bargs, **bkw)))
    want = reference_grads(inp, do)
    B, T, H = inp["v"].shape[:3]
    arch = arch_for_device(inp["q"].device)
    results = {}
    for name, opts in modes.items():
        opts = dict(opts)
        exact = opts.pop("exact", False)
        states = opts.pop("states", "recompute")
        threshold = None if exact else -10.0
        plan = plan_cp(cu, heads=H, sm_count=_sm_count(inp["q"].device), chunk_size=arch.chunk_size, B=B, T=T,
                       device=inp["q"].device, **opts)
        h0_pieces = transitions = None
        if states == "forward":
            out = chunk_gated_delta_rule_fwd_cp(**x, initial_state=h0, cu_seqlens=cu, state_v_first=vf, plan=plan,
                                                decay_threshold=threshold, return_piece_states=True)
            h0_pieces, transitions = out[5], out[6]  # the forward chain's M replaces the transition pass
            assert h0_pieces.shape[0] == plan.n_pieces
        poison_cuda_cache()
        got = dict(zip(NAMES, chunk_gated_delta_rule_bwd_cp(*bargs, **bkw, plan=plan, decay_threshold=threshold,
                                                            h0_pieces=h0_pieces, transitions=transitions)))
        assert (got["dh0"] is None) == (h0 is None), name
        errs = {}
        for n in NAMES:
            if want[n] is None:
                continue
            assert got[n].shape == plain[n].shape and got[n].dtype == plain[n].dtype, f"{name}: {n}"
            assert torch.isfinite(got[n]).all(), f"{name}: {n} has NaN/Inf"
            errs[f"{n}_ref"] = rel_l2(got[n], want[n])
            errs[f"{n}_plain"] = rel_l2(got[n], plain[n])
        if cu is not None:
            end = int(cu[-1])
            for n in ("dq", "dk", "dv", "dbeta", "dg"):
                assert torch.all(got[n].flatten(0, 1)[end:] == 0), f"{name}: {n} not zero on the padding tail"
        bad = {key: val for key, val in errs.items() if not val <= TOL}
        assert not bad, f"{name} (pieces {plan.n_pieces}, enabled {plan.enabled}): over {TOL}: {bad} ({errs})"
        results[name] = errs
    return results


@pytest.mark.parametrize("h_qk,h_v", [(16, 16), (2, 8)], ids=["hk16_hv16", "hk2_hv8"])
@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_cp_bwd_1x32768(h_qk, h_v, gate):
    """The case CP is for: the model's plan must turn CP on here."""
    from qlabench.kernels.cp import plan_cp
    from qlabench.kernels.forward import _sm_count

    inp = _inputs(32768, h_qk, h_v, gate=gate, h0=True)
    plan = plan_cp(None, heads=h_v, sm_count=_sm_count(inp["q"].device), chunk_size=64, B=1, T=32768,
                   device=inp["q"].device)
    assert plan.enabled, "CP should turn on for one 32k sequence with few heads"
    _check_cp(inp)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_cp_bwd_random_varlen_with_tail(seed, gate):
    cu, T = random_varlen(seed)
    _check_cp(_inputs(T, 2, 4, cu_seqlens=cu, gate=gate, h0=seed % 2 == 0, state_v_first=seed == 1))


def test_cp_bwd_long_and_short_gqa():
    """Long sequences (many pieces) mixed with short ones, GQA x4, h0 and dht."""
    cu = [0, 9000, 9001, 9100, 9164, 20000, 20033]
    _check_cp(_inputs(20100, 2, 8, cu_seqlens=cu, gate="qwen", h0=True))


@pytest.mark.parametrize("dht", [True, False], ids=["dht", "nodht"])
@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_cp_bwd_h0_dht_layouts(dht, state_v_first):
    _check_cp(_inputs(8192, 1, 4, cu_seqlens=[0, 300, 6000, 8192], gate="qwen", h0=True, dht=dht,
                      state_v_first=state_v_first))


def test_cp_bwd_qwen_strong_decay_long():
    """Per-token log-gates down to about -20 (qwen-like): truncation drops most transitions."""
    _check_cp(_inputs(16384, 2, 4, gate="qwen", h0=True))
