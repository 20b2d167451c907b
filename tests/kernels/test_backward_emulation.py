"""The kernels' backward decomposition (emulated step for step in torch) equals autograd of the oracle.

``emulate_chunk_gated_delta_rule_bwd`` runs the five backward kernels' per-chunk math (masks, h
recompute, reverse dh pass, per-chunk state grads, per-chunk intra grads) plus the host's GQA sum. In float64
it must reproduce ``torch.autograd.grad`` of ``chunk_gated_delta_rule_ref`` to rounding for all six
gradients; with the kernels' bf16 staging it must stay within the GPU tests' rel-L2 budget.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qlabench.kernels.emulate_bwd import emulate_chunk_gated_delta_rule_bwd
from qlabench.kernels.reference import chunk_gated_delta_rule_ref, chunk_intermediates_ref

from .cases import Case
from .gdn_inputs import rel_l2

F64 = torch.float64
NAMES = ("dq", "dk", "dv", "dbeta", "dg", "dh0")


def make_problem(case: Case):
    """Seeded float64 inputs, the oracle's autograd gradients, and the inputs of the backward."""
    gen = torch.Generator().manual_seed(case.seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    B, T = case.B, case.T
    q = randn(B, T, case.h_qk, case.K)
    k = F.normalize(randn(B, T, case.h_qk, case.K), dim=-1)
    v = randn(B, T, case.h_v, case.V)
    beta = torch.sigmoid(randn(B, T, case.h_v))
    if case.strong_decay:
        a_h = 16 * torch.rand(case.h_v, generator=gen, dtype=F64)  # g down to about -20 per token
        g = -a_h * F.softplus(0.5 * randn(B, T, case.h_v) + 1)
    else:
        g = F.logsigmoid(randn(B, T, case.h_v) + 3)
    state_shape = (case.N, case.h_v, case.V, case.K) if case.state_v_first else (case.N, case.h_v, case.K, case.V)
    h0 = randn(*state_shape) if case.h0 else None
    leaves = [q, k, v, g, beta] + ([h0] if case.h0 else [])
    for x in leaves:
        x.requires_grad_(True)
    cu = None if case.cu_seqlens is None else torch.tensor(case.cu_seqlens, dtype=torch.int32)
    kw = {"scale": 0.3, "initial_state": h0, "cu_seqlens": cu, "state_v_first": case.state_v_first}
    o, ht = chunk_gated_delta_rule_ref(q, k, v, g, beta, output_final_state=True, chunk_size=case.C, **kw)
    do = randn(*o.shape)
    dht = randn(*ht.shape) if case.dht else None
    loss = (o * do).sum() + ((ht * dht).sum() if case.dht else 0)
    grads = dict(zip(NAMES[:3] + ("dg", "dbeta") + (("dh0",) if case.h0 else ()),
                     torch.autograd.grad(loss, leaves)))
    grads.setdefault("dh0", None)
    with torch.no_grad():
        inter = chunk_intermediates_ref(q, k, v, g, beta, chunk_size=case.C, **kw)
    args = dict(q=q.detach(), k=k.detach(), v=v.detach(), g_cumsum=inter.g_cumsum, beta=beta.detach(),
                A=inter.A, do=do, dht=dht, initial_state=None if h0 is None else h0.detach(),
                chunk_size=case.C, **{n: kw[n] for n in ("scale", "cu_seqlens", "state_v_first")})
    return grads, args



CASES = [
    Case(B=2, T=100, h_qk=2, h_v=2),  # dense B > 1, partial last chunk
    Case(B=1, T=64, h_qk=1, h_v=1, K=32, V=16, C=64, h0=True),  # exactly one chunk of 64, K != V
    Case(B=1, T=260, h_qk=2, h_v=4, C=64, cu_seqlens=(0, 1, 34, 97, 161, 226, 226, 250)),  # 1,33,63,64,65,0,24 + tail
    Case(B=2, T=50, h_qk=1, h_v=4, h0=True, dht=False),  # GQA x4, h0 without dht
    Case(B=2, T=70, h_qk=2, h_v=4, h0=True, state_v_first=True, V=32),  # [V, K] states, K != V
    Case(B=1, T=150, h_qk=2, h_v=4, C=64, cu_seqlens=(0, 65, 130), h0=True, strong_decay=True),
    Case(B=2, T=200, h_qk=1, h_v=2, C=64, strong_decay=True, seed=3),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_emulation_float64_matches_oracle_autograd(case):
    want, args = make_problem(case)
    got = dict(zip(NAMES, emulate_chunk_gated_delta_rule_bwd(**args)))
    if case.h0:
        assert got["dh0"] is not None and got["dh0"].shape == want["dh0"].shape
    else:
        assert got["dh0"] is None
    for name in NAMES:
        if want[name] is None:
            continue
        assert got[name].shape == want[name].shape, name
        assert torch.isfinite(got[name]).all(), name
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-10, msg=name)
    if case.cu_seqlens is not None:
        end = case.cu_seqlens[-1]
        for name in ("dq", "dk", "dv", "dbeta", "dg"):
            assert (got[name].flatten(0, 1)[end:] == 0).all(), name


BF16_CASES = [
    Case(B=1, T=300, h_qk=2, h_v=4, K=64, V=64, C=64, cu_seqlens=(0, 65, 128, 161, 290), h0=True),
    Case(B=1, T=256, h_qk=1, h_v=2, K=64, V=64, C=64, h0=True, strong_decay=True, seed=5),
]


@pytest.mark.parametrize("case", BF16_CASES, ids=[c.id for c in BF16_CASES])
def test_emulation_bf16_staging_within_gpu_budget(case):
    """With the kernels' bf16 staging every gradient stays within rel-L2 0.02 (the GPU tests' bound)."""
    want, args = make_problem(case)
    # Inputs as the kernels see them: bf16 q, k, v, do and A; fp32 gates.
    for name in ("q", "k", "v", "do", "A"):
        args[name] = args[name].to(torch.bfloat16).to(F64)
    got = dict(zip(NAMES, emulate_chunk_gated_delta_rule_bwd(stage_dtype=torch.bfloat16, **args)))
    for name in NAMES:
        if want[name] is None:
            continue
        err = rel_l2(got[name], want[name])
        assert err <= 0.02, f"{name}: rel-L2 {err:.3g}"
