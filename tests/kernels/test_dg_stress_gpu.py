"""dg under strong decay: the backward's gradients against float64 autograd on 32 seeds per head
configuration, with flash-qla's errors on the same inputs where it is installed.

Run on an H200:  pytest -q -m gpu tests/kernels/test_dg_stress_gpu.py -s   (-s prints the table)

Inputs: `qwen` gates (A_log-style; with one v-head that head has A = 16, about -8 to -40 per token),
varlen [300, 1, 64, 129, 65] with a 37-token padding tail, h0 and dht given. The true dg is tiny there
(norm 1e-5 to 1e-3), which is what exposed a fp32 cancellation in bwd_state's last-row gate term.
Every gradient of ours must be within 0.02 relative L2 on every seed; where flash-qla is installed,
ours must also be within 1.5x of flash-qla's worst seed for every gradient (the floor the issue sets:
not measurably worse than upstream's fused backward on the inputs that break FLA's).
"""

from __future__ import annotations

import pytest
import torch

from .test_backward_gpu import (
    NAMES,
    TOL,
    _varlen,
    check_backward,
    make_inputs,
    nan_buffers,  # noqa: F401 (the fixture)
    reference_grads,
    rel_l2,
)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("nan_buffers")]
SEEDS = range(32)
LENGTHS, TAIL = [300, 1, 64, 129, 65], 37


def _flash_qla():
    try:
        import flash_qla
    except Exception:  # noqa: BLE001 - ImportError, or its arch detection's ValueError
        return None
    return getattr(flash_qla, "chunk_gated_delta_rule", None)


def _flash_qla_errors(fn, inp, do):
    """flash-qla's autograd gradients on the same inputs (its float32 gate and beta, as ours)."""
    names = ("q", "k", "v", "g", "beta", "initial_state")
    leaves = {n: inp[n].clone().requires_grad_(True) for n in names}
    o, ht = fn(q=leaves["q"], k=leaves["k"], v=leaves["v"], g=leaves["g"], beta=leaves["beta"],
               initial_state=leaves["initial_state"], output_final_state=True, cu_seqlens=inp["cu_seqlens"])
    torch.autograd.backward([o, ht], [do, inp["dht"]])
    want = reference_grads(inp, do)
    got = {"dq": leaves["q"].grad, "dk": leaves["k"].grad, "dv": leaves["v"].grad, "dg": leaves["g"].grad,
           "dbeta": leaves["beta"].grad, "dh0": leaves["initial_state"].grad}
    return {n: rel_l2(got[n], want[n]) for n in NAMES}


@pytest.mark.parametrize("h", [1, 4], ids=["H1-HV1", "H4-HV4"])
def test_dg_strong_decay_32_seeds(h):
    cu, T = _varlen(LENGTHS, tail=TAIL)
    fq = _flash_qla()
    ours, theirs, failures = [], [], []
    for seed in SEEDS:
        torch.manual_seed(seed)
        inp = make_inputs(T, h, h, cu_seqlens=cu, gate="qwen", h0=True)
        try:
            ours.append(check_backward(inp))
        except AssertionError as e:  # keep going: the table names every failing seed
            failures.append(f"seed {seed}: {e}")
            continue
        if fq is not None:  # the same inputs and the same do as check_backward drew
            torch.manual_seed(seed)
            inp = make_inputs(T, h, h, cu_seqlens=cu, gate="qwen", h0=True)
            do = torch.randn(inp["v"].shape, device="cuda").bfloat16()
            theirs.append(_flash_qla_errors(fq, inp, do))
    worst = {n: max(e[n] for e in ours) for n in NAMES} if ours else {}
    line = " ".join(f"{n} {worst[n]:.2e}" for n in NAMES) if ours else "-"
    print(f"\n[H{h}] ours worst over {len(ours)} seeds: {line}")
    assert not failures, f"{len(failures)} of {len(SEEDS)} seeds over {TOL}:\n" + "\n".join(failures)
    if theirs:
        fq_worst = {n: max(e[n] for e in theirs) for n in NAMES}
        print(f"[H{h}] flash-qla worst over {len(theirs)} seeds: "
              + " ".join(f"{n} {fq_worst[n]:.2e}" for n in NAMES))
        worse = {n: (worst[n], fq_worst[n]) for n in NAMES if not worst[n] <= 1.5 * fq_worst[n]}
        assert not worse, f"ours over 1.5x flash-qla's worst (ours, flash-qla): {worse}"
