"""Our forward kernels against the float64 reference on the GPU (relative L2 <= 0.02 per tensor).

Every test goes through forward.py, which reads QLABENCH_FWD_KERNEL at call time: run the whole file
on another recurrence with e.g. `QLABENCH_FWD_KERNEL=ws python -m pytest tests/kernels/test_forward_gpu.py`
(ws: hopper/chunk_fwd_ws.py, the manually warp-specialized one). test_recurrence_kernels runs the
varlen / partial-chunk / h0 / BV = 64 cases on each recurrence whatever the environment says, and
test_recurrence_v128 the V-tile-128 recurrence (QLABENCH_FWD_BV=128 forces that tile for a whole run).
"""

from __future__ import annotations

import pytest
import torch

from qlabench.kernels import chunk_gated_delta_rule
from qlabench.kernels.reference import chunk_intermediates_ref

from .gdn_inputs import make_inputs, poison_cuda_cache, random_varlen, rel_l2

pytestmark = pytest.mark.gpu
TOL = 0.02


def _check_forward(inp, T, check_h=True):
    from qlabench.kernels.forward import chunk_gated_delta_rule_fwd

    ref = chunk_intermediates_ref(**{k: inp.get(k) for k in ("q", "k", "v", "g", "beta")},
                                  initial_state=inp.get("initial_state"), cu_seqlens=inp.get("cu_seqlens"),
                                  state_v_first=inp["state_v_first"])
    poison_cuda_cache()
    o, ht = chunk_gated_delta_rule(**inp, output_final_state=True)
    errs = {"o": rel_l2(o, ref.o), "final_state": rel_l2(ht, ref.final_state)}
    if check_h:
        poison_cuda_cache()
        g_cumsum, A, o2, h, _ = chunk_gated_delta_rule_fwd(
            inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], initial_state=inp.get("initial_state"),
            cu_seqlens=inp.get("cu_seqlens"), output_h=True, state_v_first=inp["state_v_first"])
        nt = ref.h.shape[0]
        errs["h"] = rel_l2(h[:nt], ref.h)
        end = int(inp["cu_seqlens"][-1]) if "cu_seqlens" in inp else o.shape[0] * o.shape[1]
        flat = (lambda x: x.reshape(-1, *x.shape[2:])[:end])
        errs["g_cumsum"] = rel_l2(flat(g_cumsum), flat(ref.g_cumsum))
        errs["A"] = rel_l2(flat(A), flat(ref.A))
        from qlabench.kernels import cp_mode

        if cp_mode() == "off":  # the API runs the same kernels: bit-identical
            assert torch.equal(o2, o), "output differs between the two entry points"
        else:  # the API may take the CP forward (another summation order): both against the reference
            errs["o_low_level"] = rel_l2(o2, ref.o)
    if "cu_seqlens" in inp:
        end = int(inp["cu_seqlens"][-1])
        tail = o.reshape(-1, *o.shape[2:])[end:]
        assert torch.all(tail == 0), "padding tail of o not zero"
    bad = {k: v for k, v in errs.items() if not v <= TOL}
    assert not bad, f"relative L2 over {TOL}: {bad} (all: {errs})"
    return errs


@pytest.mark.parametrize("h_qk,h_v", [(4, 4), (2, 8), (4, 16)], ids=["H4-HV4", "H2-HV8", "H4-HV16"])
@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_dense_T4096(h_qk, h_v, gate):
    _check_forward(make_inputs(4096, h_qk, h_v, gate=gate), 4096)


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_dense_batch_h0(state_v_first, gate):
    _check_forward(make_inputs(1000, 2, 4, B=3, gate=gate, h0=True, state_v_first=state_v_first), 1000)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_random_varlen_with_tail(seed, gate):
    cu, T = random_varlen(seed)
    _check_forward(make_inputs(T, 2, 4, cu_seqlens=cu, gate=gate, h0=seed % 2 == 0,
                               state_v_first=seed == 1), T)


def test_irregular_cu_seqlens_16_32():
    cu = [0, 410, 841, 1135, 2126, 2512, 4096]
    _check_forward(make_inputs(4096, 16, 32, cu_seqlens=cu, gate="qwen", h0=True), 4096)


def test_empty_sequence_and_tail():
    cu = [0, 100, 100, 229]
    _check_forward(make_inputs(300, 1, 2, cu_seqlens=cu, h0=True), 300)


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_long_T32768_h0(state_v_first):
    _check_forward(make_inputs(32768, 2, 4, gate="qwen", h0=True, state_v_first=state_v_first), 32768,
                   check_h=False)


@pytest.mark.parametrize("fwd_kernel", ["pipelined", "ws", "wy"])
@pytest.mark.parametrize("case", ["varlen-bv32", "varlen-bv64"])
@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_recurrence_kernels(fwd_kernel, case, state_v_first, monkeypatch):
    """Each recurrence kernel (QLABENCH_FWD_KERNEL) on partial chunks, an empty sequence, a padding
    tail and h0; 2 sequences x 64 v-heads (128 chains) take BV = 64 (value_tile.py), 5 x 4 take BV = 32."""
    from qlabench.kernels.forward import recurrence_role

    monkeypatch.setenv("QLABENCH_FWD_KERNEL", fwd_kernel)
    monkeypatch.delenv("QLABENCH_FWD_BV", raising=False)  # these kernels run 32 / 64
    assert recurrence_role(1, 132) == {"pipelined": "chunk_fwd_pipelined", "ws": "chunk_fwd_ws",
                                       "wy": "chunk_fwd_wy"}[fwd_kernel]
    if case == "varlen-bv32":
        cu = [0, 100, 100, 229, 1000, 2497]
        _check_forward(make_inputs(2600, 2, 4, cu_seqlens=cu, gate="qwen", h0=True, state_v_first=state_v_first), 2600)
    else:
        cu = [0, 700, 1500]
        _check_forward(make_inputs(1530, 4, 64, cu_seqlens=cu, gate="bench", h0=True, state_v_first=state_v_first),
                       1530)


@pytest.mark.parametrize("case", ["varlen-h0", "two-seqs-zero-start"])
@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_recurrence_v128(case, state_v_first, monkeypatch):
    """hopper/chunk_fwd_v128 (V tile 128, forced by QLABENCH_FWD_BV) on partial chunks, an empty sequence, a
    padding tail, h0 or a zero start, strong decay (qwen gates), both state layouts."""
    from qlabench.kernels.forward import recurrence_role

    monkeypatch.delenv("QLABENCH_FWD_KERNEL", raising=False)
    monkeypatch.setenv("QLABENCH_FWD_BV", "128")
    assert recurrence_role(1, 132, "sm90", None, 128) == "chunk_fwd_v128"
    if case == "varlen-h0":
        cu = [0, 100, 100, 229, 1000, 2497]
        _check_forward(make_inputs(2600, 2, 4, cu_seqlens=cu, gate="qwen", h0=True, state_v_first=state_v_first), 2600)
    else:
        cu = [0, 700, 1500]
        _check_forward(make_inputs(1530, 4, 64, cu_seqlens=cu, gate="qwen", h0=False, state_v_first=state_v_first),
                       1530)


def test_l2norm_and_scale():
    inp = make_inputs(700, 2, 4, h0=True)
    from qlabench.kernels.reference import chunk_gated_delta_rule_ref

    q = inp["q"] * 3
    k = inp["k"] * 0.5
    ref_o, ref_s = chunk_gated_delta_rule_ref(q, k, inp["v"], inp["g"], inp["beta"], scale=0.05,
                                              initial_state=inp["initial_state"], output_final_state=True,
                                              use_qk_l2norm_in_kernel=True)
    o, s = chunk_gated_delta_rule(q, k, inp["v"], inp["g"], inp["beta"], scale=0.05,
                                  initial_state=inp["initial_state"], output_final_state=True,
                                  use_qk_l2norm_in_kernel=True)
    assert rel_l2(o, ref_o) <= TOL and rel_l2(s, ref_s) <= TOL


def test_fp16():
    _check_forward(make_inputs(1000, 2, 4, dtype=torch.float16, h0=True), 1000)


def test_deterministic():
    inp = make_inputs(4096, 2, 8, cu_seqlens=[0, 1000, 3000, 4000], h0=True)
    first = chunk_gated_delta_rule(**inp, output_final_state=True)
    for _ in range(5):
        again = chunk_gated_delta_rule(**inp, output_final_state=True)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
