"""The public forward's intra-card CP switch (QLABENCH_CP), without a GPU: the kernels are stubbed."""

from __future__ import annotations

import pytest
import torch

import qlabench.kernels as api
from qlabench.kernels import cp_mode


@pytest.fixture
def stubs(monkeypatch):
    calls = []
    from qlabench.kernels import dispatch, forward, forward_cp

    def plain(*args, **kw):
        calls.append(("plain", kw))
        return ("plain",) * 6  # + kkt_solve's masks (return_masks)

    def with_cp(*args, **kw):
        calls.append(("cp", kw))
        return ("cp",) * 8  # + the pieces' initial states and the chain's transitions (return_piece_states), masks

    monkeypatch.setattr(forward, "chunk_gated_delta_rule_fwd", plain)
    monkeypatch.setattr(forward_cp, "chunk_gated_delta_rule_fwd_cp", with_cp)
    monkeypatch.setattr(forward, "_sm_count", lambda device: 132)
    monkeypatch.setattr(dispatch, "arch_for_device", lambda device: dispatch.arch_by_name("sm90"))
    return calls


def _call(T, H, cu=None, output_h=False, for_backward=False):
    x = torch.zeros(1, T, H, 128)
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    out = api._forward(x, x, x, x[..., 0], x[..., 0], scale=1.0, initial_state=None, cu_seqlens=cu,
                       output_final_state=True, output_h=output_h, state_v_first=False,
                       for_backward=for_backward)
    assert len(out) == 7  # the five forward entries + the CP state for the backward (or None) + the masks
    assert out[6] == (out[0] if for_backward else None)  # kkt_solve's masks, kept only for a backward
    if out[0] == "cp":
        plan, h0_pieces, transitions = out[5]
        assert plan.enabled and h0_pieces == transitions == "cp"
    else:
        assert out[5] is None
    return out[0]


def test_auto_by_default_follows_the_measured_rule(stubs, monkeypatch):
    """cp=auto (the default): cp.py's plan and an entry of api.cp_rule's table, the forward-only one
    (<= 8 effective chains from 16384 tokens, <= 12 from 24576, <= 16 from 28672) here; cp.py alone would also cut the
    32-head and the 8192-token calls."""
    monkeypatch.delenv("QLABENCH_CP", raising=False)
    assert cp_mode() == "auto"
    assert _call(32768, 8) == "cp"  # one 32k sequence, 8 heads: 8 chains
    assert stubs[-1][1]["transition"] == "always" and stubs[-1][1]["plan"].enabled
    assert stubs[-1][1]["return_piece_states"] is True
    assert _call(32768, 8, cu=[0, 28672, 32768]) == "cp"  # 8 x 512 / 448 = 9.1 effective chains
    assert _call(32768, 12, cu=[0, 28672, 32768]) == "cp"  # 13.7 effective chains
    assert _call(32768, 16) == "cp"  # 16 chains: both directions win since session 8
    assert _call(32768, 16, cu=[0, 28672, 32768]) == "plain"  # 18.3 effective chains
    assert _call(32768, 32) == "plain"  # 32 chains: CP lost
    assert _call(8192, 8) == "plain"  # 8192 tokens: the forward loses
    assert _call(16384, 8) == "cp"  # 8 chains from 16384 tokens
    assert _call(16384, 8, cu=[0, 12288, 16384]) == "plain"  # 10.7 effective chains need 24576
    assert _call(32768, 8, cu=[0, 24576, 32768]) == "cp"
    assert _call(16384, 16) == "plain"  # 16 chains need 28672
    assert _call(1024, 8, cu=list(range(0, 1025, 128))) == "plain"  # 2-chunk sequences: nothing to cut
    assert _call(32768, 64) == "plain"  # 64 heads fill the GPU
    monkeypatch.setenv("QLABENCH_CP", "auto")
    assert _call(32768, 4) == "cp"


def test_auto_with_a_backward_takes_the_training_entries(stubs, monkeypatch):
    """A forward whose backward follows (for_backward) takes CP earlier: the backward's gain outweighs the
    forward's loss (<= 6 chains from 4096 tokens, <= 12 from 5120, <= 20 from 6144, <= 28 from 9216;
    refitted on the H200 in session 25)."""
    monkeypatch.delenv("QLABENCH_CP", raising=False)
    assert _call(8192, 8, for_backward=True) == "cp"
    assert _call(8192, 16, for_backward=True) == "cp"  # 16 chains from 8192 tokens
    assert _call(8192, 4, cu=[0, 7053, 8192], for_backward=True) == "cp"  # 4.6 effective chains of 7053
    assert _call(8192, 8, cu=[0, 7053, 8192], for_backward=True) == "cp"  # 9.3 of 7053
    assert _call(8192, 12, cu=[0, 7053, 8192], for_backward=True) == "cp"  # 14 of 7053
    assert _call(8192, 24, cu=[0, 7053, 8192], for_backward=True) == "plain"  # 27.9 of 7053 need 9216
    assert _call(4096, 8, for_backward=True) == "plain"  # 8 chains of 4096 need 5120
    assert _call(6144, 20, for_backward=True) == "cp"  # 20 chains from 6144
    assert _call(4096, 4, for_backward=True) == "cp"  # 4 chains from 4096
    assert _call(12288, 24, for_backward=True) == "cp"  # 24 chains from 9216
    assert _call(8192, 24, for_backward=True) == "plain"  # 24 chains need 9216
    assert _call(16384, 24, for_backward=True) == "cp"
    assert _call(16384, 16, cu=[0, 12288, 16384], for_backward=True) == "cp"  # 21.3 chains of 12288 tokens
    assert _call(16384, 28, for_backward=True) == "cp"  # 28 chains
    assert _call(32768, 16, cu=[0, 7168, 32768], for_backward=True) == "cp"  # 20.5 effective chains of 25600
    assert _call(32768, 32, for_backward=True) == "plain"  # 32 chains: CP lost (hk16_hv32 1x32768 1.08x)
    assert _call(16384, 32, cu=[0, 12288, 16384], for_backward=True) == "plain"  # 42.7 effective chains


def _call_gqa(T, H, cu, for_backward=True):
    """As _call with 2 v-heads per qk-head (no bwd_fused: CP_RULE_TRAINING alone)."""
    q, v = torch.zeros(1, T, H // 2, 128), torch.zeros(1, T, H, 128)
    cu = torch.tensor(cu, dtype=torch.int32)
    out = api._forward(q, q, v, v[..., 0], v[..., 0], scale=1.0, initial_state=None, cu_seqlens=cu,
                       output_final_state=True, output_h=False, state_v_first=False, for_backward=for_backward)
    return out[0]


def test_training_rule_is_wider_where_the_backward_takes_bwd_fused(stubs, monkeypatch):
    """With H_v == H_qk on sm90 (bwd_fused, bwd_dh auto) and at most 16 v-heads, CP_RULE_TRAINING_FUSED also admits up
    to 56 effective chains with a 9216-token sequence (session 31: the bench's 32k_4seq / 32k_8seq at hk16_hv16, where
    the plain path's dh buffer kept the peak memory over 1.25x flash-qla's)."""
    monkeypatch.delenv("QLABENCH_CP", raising=False)
    monkeypatch.delenv("QLABENCH_BWD_DH", raising=False)
    four, eight = [0, 7212, 14284, 28009, 32768], [0, 3274, 4303, 7212, 12273, 14284, 18077, 28009, 32768]
    assert _call(32768, 16, cu=four, for_backward=True) == "cp"  # 38.3 effective chains of 13725
    assert _call(32768, 16, cu=eight, for_backward=True) == "cp"  # 53.1 of 9932
    assert _call(32768, 16, cu=four) == "plain"  # inference: the forward-only entries
    assert _call(8192, 16, cu=[0, 5809, 7053, 7459, 8192], for_backward=True) == "plain"  # 22.9 chains of 5809
    assert _call_gqa(32768, 16, cu=four) == "plain"  # GQA: bwd_fused does not run
    assert _call(32768, 32, cu=[0, 16384, 32768], for_backward=True) == "plain"  # 64 chains
    assert _call(32768, 20, cu=four, for_backward=True) == "plain"  # 20 v-heads: not measured
    monkeypatch.setenv("QLABENCH_BWD_DH", "ws")
    assert _call(32768, 16, cu=four, for_backward=True) == "plain"  # the plain reverse pass forced


def _piece_chunks(stubs) -> int:
    """The piece length (chunks) of the last stubbed CP forward's plan: its longest piece."""
    plan = stubs[-1][1]["plan"]
    return max(-(-(eos - bos) // plan.chunk_size) for bos, eos, _ in plan.pieces)


def test_training_plan_takes_longer_pieces_where_few_long_chains_run(stubs, monkeypatch):
    """A forward whose backward follows cuts pieces twice as long (api.CP_ALPHA_LONG) where its longest sequence holds
    at least half the tokens and the call has at most 12 effective chains, or 16 with a 32768-token sequence (measured
    on the H200 in session 27); an inference forward, and the training forward elsewhere, keep cp.py's length."""
    monkeypatch.delenv("QLABENCH_CP", raising=False)
    assert _call(32768, 8, for_backward=True) == "cp" and _piece_chunks(stubs) == 32  # 8 chains: 6 sqrt(8*512/132)
    assert _call(32768, 8) == "cp" and _piece_chunks(stubs) == 16  # the inference forward: 3 sqrt(...)
    assert _call(8192, 4, cu=[0, 5809, 7053, 8192], for_backward=True) == "cp" and _piece_chunks(stubs) == 16
    assert _call(32768, 4, cu=[0, 7212, 14284, 28009, 32768], for_backward=True) == "cp"  # Be 2.4: 9.5 chains
    assert _piece_chunks(stubs) == 16
    assert _call(32768, 16, for_backward=True) == "cp" and _piece_chunks(stubs) == 64  # 16 chains of 32768 tokens
    assert _call(8192, 16, for_backward=True) == "cp" and _piece_chunks(stubs) == 16  # 16 chains of 8192: cp.py's
    assert _call(32768, 16, cu=[0, 7168, 32768], for_backward=True) == "cp"  # 20.5 chains: cp.py's length
    assert _piece_chunks(stubs) == 32
    assert api.training_alpha(12, 8, 4096) == api.CP_ALPHA_LONG and api.training_alpha(12.5, 8, 4096) == 3
    assert api.training_alpha(8, 4, 4096) == api.CP_ALPHA_LONG and api.training_alpha(8.5, 4, 32768) == 3  # Be 2
    assert api.training_alpha(16, 16, 32768) == api.CP_ALPHA_LONG and api.training_alpha(16, 16, 32767) == 3


def test_off_and_on(stubs, monkeypatch):
    monkeypatch.setenv("QLABENCH_CP", "off")
    assert _call(32768, 8) == "plain"
    monkeypatch.setenv("QLABENCH_CP", "on")
    assert _call(32768, 64) == "cp"
    assert _call(8192, 16) == "cp"
    assert _call(32768, 16, output_h=True) == "plain"  # per-chunk states come from the plain forward


def test_bad_mode_names_the_value(monkeypatch):
    monkeypatch.setenv("QLABENCH_CP", "yes")
    with pytest.raises(ValueError, match="'yes'"):
        cp_mode()


def test_backward_follows_the_forward(monkeypatch):
    """The autograd backward takes backward_cp with the forward's plan and piece states; without them
    backward_cp over bwd_cp_plan's pieces (piece states recomputed: h0_pieces None) when it plans
    any, else the plain backward."""
    from qlabench.kernels import backward, backward_cp

    seen = []
    grads = tuple(torch.zeros(1) for _ in range(6))
    monkeypatch.setattr(backward, "chunk_gated_delta_rule_bwd", lambda *a, **kw: seen.append(("plain", kw)) or grads)
    monkeypatch.setattr(backward_cp, "chunk_gated_delta_rule_bwd_cp",
                        lambda *a, **kw: seen.append(("cp", kw)) or grads)

    class Ctx:
        saved_tensors = (None,) * 4 + (torch.zeros(1), None, None, None, None, None)  # beta: a tensor; no Ag, Pm
        scale, state_v_first, g_dtype = 1.0, False, torch.float32

    own_plan = [None]
    monkeypatch.setattr(api, "bwd_cp_plan", lambda q, v, cu, options: own_plan[0])
    ctx = Ctx()
    ctx.cp = None
    api.ChunkGatedDeltaRuleFunction.backward(ctx, torch.zeros(1), None)
    ctx.cp = ("plan", "h0_pieces", "transitions")
    api.ChunkGatedDeltaRuleFunction.backward(ctx, torch.zeros(1), None)
    ctx.cp, own_plan[0] = None, "bwd plan"
    api.ChunkGatedDeltaRuleFunction.backward(ctx, torch.zeros(1), None)
    assert [name for name, _ in seen] == ["plain", "cp", "cp"]
    assert seen[1][1]["plan"] == "plan" and seen[1][1]["h0_pieces"] == "h0_pieces"
    assert seen[1][1]["transitions"] == "transitions"  # the forward chain's M: no transition pass
    assert seen[2][1]["plan"] == "bwd plan" and seen[2][1]["h0_pieces"] is None
    assert seen[2][1]["transitions"] is None
    assert seen[1][1]["transition"] == seen[2][1]["transition"] == "always"
    assert all(kw["masks"] is None for _, kw in seen)  # the forward kept no kkt_solve masks
    Ag, Pm = torch.ones(1), torch.ones(1)  # it kept them (bwd_masks=forward): both backward paths get them
    ctx.saved_tensors = Ctx.saved_tensors[:8] + (Ag, Pm)
    for cp in (None, ("plan", "h0_pieces", "transitions")):
        ctx.cp, own_plan[0] = cp, None
        api.ChunkGatedDeltaRuleFunction.backward(ctx, torch.zeros(1), None)
        assert seen[-1][1]["masks"].Ag is Ag and seen[-1][1]["masks"].Pm is Pm


def test_bwd_cp_plan_modes(monkeypatch):
    """bwd_cp: off plans nothing, on cp.py's pieces, auto those only for at most 4 (sequence, v-head)
    chains with a sequence of 32768+ tokens (the measured rule)."""
    from qlabench.kernels import dispatch, forward
    from qlabench.kernels.options import KernelOptions

    monkeypatch.setattr(forward, "_sm_count", lambda device: 132)
    monkeypatch.setattr(dispatch, "arch_for_device", lambda device: dispatch.arch_by_name("sm90"))
    few, many, short = torch.zeros(1, 32768, 4, 1), torch.zeros(1, 32768, 16, 1), torch.zeros(1, 8192, 4, 1)
    assert api.bwd_cp_plan(few, few, None, KernelOptions(bwd_cp="off")) is None
    assert api.bwd_cp_plan(few, few, None, KernelOptions()).n_pieces > 1  # auto
    for x in (many, short):  # cp.py's plan cuts both; the measured rule does not take them
        assert api.bwd_cp_plan(x, x, None, KernelOptions()) is None
        assert api.bwd_cp_plan(x, x, None, KernelOptions(bwd_cp="on")).n_pieces > 1
    two = torch.tensor([0, 32768, 65536], dtype=torch.int32)  # 2 sequences x 4 heads = 8 chains
    x = torch.zeros(1, 65536, 4, 1)
    assert api.bwd_cp_plan(x, x, two, KernelOptions()) is None


@pytest.mark.parametrize("grad,no_grad", [(False, False), (True, False), (True, True)],
                         ids=["inference", "training", "requires-grad-under-no-grad"])
def test_the_api_tells_the_forward_whether_a_backward_follows(grad, no_grad, stubs, monkeypatch):
    """chunk_gated_delta_rule hands _forward for_backward = some input requires grad and autograd records
    (cp_rule's table; without it A is not kept): under torch.no_grad no backward can follow."""
    seen = []

    def fake_forward(q, *args, **kw):
        seen.append(kw["for_backward"])
        o = torch.zeros(q.shape[:3] + (128,))
        return None, None, o, None, torch.zeros(1, q.shape[2], 128, 128), None, None

    monkeypatch.setattr(api, "_forward", fake_forward)
    x = torch.zeros(1, 64, 2, 128, dtype=torch.bfloat16)
    v = x.clone().requires_grad_(grad)
    g, beta = torch.zeros(1, 64, 2), torch.ones(1, 64, 2)
    with torch.set_grad_enabled(not no_grad):
        api.chunk_gated_delta_rule(x, x, v, g, beta, output_final_state=True)
    assert seen == [grad and not no_grad]
