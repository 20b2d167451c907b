"""The float64 Gated DeltaNet oracle agrees with itself: chunked == recurrent == a naive loop.

Every comparison is in float64 and covers outputs, final states and all six gradients
(dq, dk, dv, dg, dbeta, dh0), taken with ``torch.autograd.grad`` of a random linear functional
of (o, final_state).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from qlabench.kernels.reference import (
    chunk_gated_delta_rule_ref,
    chunk_intermediates_ref,
    l2norm,
    recurrent_gated_delta_rule_ref,
)

from .cases import Case

F64 = torch.float64
GRAD_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
# Chunked and recurrent orders of summation differ, so agreement is to rounding, not bit-exact.
TOL = {"rtol": 1e-10, "atol": 1e-12}


@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    """These tensors are tiny: a second intra-op thread only adds contention (30x slower on a busy
    2-core CI machine), so the module runs single-threaded and restores the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_inputs(case: Case) -> dict:
    """Seeded float64 leaf tensors (requires_grad) for one case, in the API's layouts."""
    gen = torch.Generator().manual_seed(case.seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    B, T = case.B, case.T
    q = randn(B, T, case.h_qk, case.K)
    if case.l2norm:
        k = randn(B, T, case.h_qk, case.K)
    else:
        # Keys of norm about 1 keep (I + strict_lower(diag(beta) K K^T)) well conditioned,
        # as l2-normalised keys do in the models.
        k = randn(B, T, case.h_qk, case.K) * case.K**-0.5
    v = randn(B, T, case.h_v, case.V)
    beta = torch.sigmoid(randn(B, T, case.h_v))
    if case.strong_decay:
        # Per-head rate A_h ~ U(0, 16): log-gates reach -20 and below per token, so whole chunks
        # decay to exp(-1000) and the chunked form's exponentials underflow to exactly 0.
        a_h = 16 * torch.rand(case.h_v, generator=gen, dtype=F64)
        g = -a_h * F.softplus(0.5 * randn(B, T, case.h_v) + 1)
    else:
        g = F.logsigmoid(randn(B, T, case.h_v) + 3)
    inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    if case.h0:
        shape = (case.N, case.h_v, case.V, case.K) if case.state_v_first else (case.N, case.h_v, case.K, case.V)
        inputs["initial_state"] = randn(*shape)
    for x in inputs.values():
        x.requires_grad_(True)
    return inputs


def call_kwargs(case: Case) -> dict:
    cu = None if case.cu_seqlens is None else torch.tensor(case.cu_seqlens, dtype=torch.int32)
    return {"cu_seqlens": cu, "state_v_first": case.state_v_first, "use_qk_l2norm_in_kernel": case.l2norm}


def run_with_grads(fn, inputs: dict, seed: int, **kwargs):
    """Runs ``fn`` and differentiates a random linear functional of (o, final_state).

    Returns (o, final_state, {grad name: tensor}); dh0 is None without an initial state.
    """
    o, final = fn(**inputs, output_final_state=True, **kwargs)
    gen = torch.Generator().manual_seed(seed + 1000)
    w_o = torch.randn(o.shape, generator=gen, dtype=F64)
    w_s = torch.randn(final.shape, generator=gen, dtype=F64)
    loss = (o * w_o).sum() + (final * w_s).sum()
    names = ["q", "k", "v", "g", "beta"] + (["initial_state"] if "initial_state" in inputs else [])
    grads = torch.autograd.grad(loss, [inputs[n] for n in names])
    out = dict(zip(GRAD_NAMES, grads))
    out.setdefault("dh0", None)
    return o.detach(), final.detach(), out


def chunked(case: Case):
    def fn(**kw):
        return chunk_gated_delta_rule_ref(chunk_size=case.C, **kw)

    return fn


CASES = [
    Case(B=2, T=100, h_qk=2, h_v=2),  # dense B > 1, partial last chunk (100 = 6 * 16 + 4)
    Case(B=3, T=64, h_qk=1, h_v=1, K=32, V=16, C=64),  # T an exact multiple of C, K != V
    Case(B=1, T=200, h_qk=2, h_v=4, cu_seqlens=(0, 37, 100, 163)),  # varlen + partial chunks + tail
    Case(B=2, T=50, h_qk=1, h_v=4, h0=True),  # GQA x4 with initial state
    Case(B=1, T=120, h_qk=2, h_v=4, cu_seqlens=(0, 16, 16, 70, 101), h0=True),  # empty sequence
    Case(B=2, T=40, h_qk=2, h_v=2, K=16, V=32, h0=True, state_v_first=True),
    Case(B=1, T=150, h_qk=2, h_v=4, cu_seqlens=(0, 60, 130), h0=True, state_v_first=True, seed=3),
    Case(B=2, T=80, h_qk=2, h_v=2, h0=True, strong_decay=True, seed=1),
    Case(B=1, T=150, h_qk=1, h_v=2, C=64, cu_seqlens=(0, 90, 140), h0=True, strong_decay=True, seed=2),
    Case(B=2, T=60, h_qk=2, h_v=4, h0=True, l2norm=True, seed=4),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_chunked_matches_recurrent(case: Case):
    inputs = make_inputs(case)
    if case.strong_decay:
        assert inputs["g"].min() < -20
    kw = call_kwargs(case)
    o_c, s_c, d_c = run_with_grads(chunked(case), inputs, case.seed, **kw)
    o_r, s_r, d_r = run_with_grads(recurrent_gated_delta_rule_ref, inputs, case.seed, **kw)
    assert o_c.dtype == F64 and o_c.shape == (case.B, case.T, case.h_v, case.V)
    want_state = (case.N, case.h_v) + ((case.V, case.K) if case.state_v_first else (case.K, case.V))
    assert s_c.shape == want_state
    torch.testing.assert_close(o_c, o_r, **TOL)
    torch.testing.assert_close(s_c, s_r, **TOL)
    for name in GRAD_NAMES:
        if d_r[name] is None:
            assert d_c[name] is None
            continue
        assert d_c[name].abs().max() > 0, f"{name} is identically zero"
        torch.testing.assert_close(d_c[name], d_r[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("case", [c for c in CASES if c.cu_seqlens is not None], ids=lambda c: c.id)
def test_varlen_padding_tail_is_zero(case: Case):
    end = case.cu_seqlens[-1]
    assert end < case.T, "the case needs a padding tail"
    inputs = make_inputs(case)
    o, _, grads = run_with_grads(chunked(case), inputs, case.seed, **call_kwargs(case))
    assert torch.equal(o[:, end:], torch.zeros_like(o[:, end:]))
    assert o[:, :end].abs().max() > 0
    for name in ("dq", "dk", "dv", "dg", "dbeta"):
        tail = grads[name][:, end:]
        assert torch.equal(tail, torch.zeros_like(tail)), name


@pytest.mark.parametrize("case", [c for c in CASES if c.cu_seqlens is not None], ids=lambda c: c.id)
def test_varlen_equals_sequences_run_separately(case: Case):
    inputs = make_inputs(case)
    kw = call_kwargs(case)
    o, final, _ = run_with_grads(chunked(case), inputs, case.seed, **kw)
    cu = case.cu_seqlens
    for n, (bos, eos) in enumerate(itertools.pairwise(cu)):
        piece = {name: x[:, bos:eos] for name, x in inputs.items() if name != "initial_state"}
        if "initial_state" in inputs:
            piece["initial_state"] = inputs["initial_state"][n:n + 1]
        o_n, s_n = chunk_gated_delta_rule_ref(**piece, output_final_state=True, chunk_size=case.C,
                                              state_v_first=case.state_v_first,
                                              use_qk_l2norm_in_kernel=case.l2norm)
        torch.testing.assert_close(o[:, bos:eos], o_n.detach(), **TOL)
        torch.testing.assert_close(final[n:n + 1], s_n.detach(), **TOL)
        if eos == bos and "initial_state" not in inputs:
            assert torch.equal(final[n], torch.zeros_like(final[n]))


@pytest.mark.parametrize("split", [1, 16, 37, 64, 99])
@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vfirst"])
def test_split_with_carried_state_equals_whole(split: int, state_v_first: bool):
    case = Case(B=2, T=100, h_qk=1, h_v=2, h0=True, state_v_first=state_v_first, seed=5)
    inputs = {n: x.detach() for n, x in make_inputs(case).items()}
    kw = {"chunk_size": case.C, "state_v_first": state_v_first, "output_final_state": True}
    o_all, s_all = chunk_gated_delta_rule_ref(**inputs, **kw)
    first = {n: (x[:, :split] if n != "initial_state" else x) for n, x in inputs.items()}
    o_1, s_1 = chunk_gated_delta_rule_ref(**first, **kw)
    second = {n: x[:, split:] for n, x in inputs.items() if n != "initial_state"}
    o_2, s_2 = chunk_gated_delta_rule_ref(**second, initial_state=s_1, **kw)
    torch.testing.assert_close(torch.cat([o_1, o_2], 1), o_all, **TOL)
    torch.testing.assert_close(s_2, s_all, **TOL)


def test_split_varlen_with_carried_state():
    """Every packed sequence cut at its own point, the second halves packed again with the states."""
    cu = (0, 37, 100, 163)
    case = Case(B=1, T=170, h_qk=2, h_v=4, cu_seqlens=cu, h0=True, seed=6)
    inputs = {n: x.detach() for n, x in make_inputs(case).items()}
    o_all, s_all = chunk_gated_delta_rule_ref(**inputs, output_final_state=True, chunk_size=case.C,
                                              cu_seqlens=torch.tensor(cu))
    cuts = [bos + (eos - bos) // 3 for bos, eos in itertools.pairwise(cu)]
    first_idx = torch.cat([torch.arange(bos, cut) for bos, cut in zip(cu[:-1], cuts)])
    second_idx = torch.cat([torch.arange(cut, eos) for cut, eos in zip(cuts, cu[1:])])
    lens_1 = [cut - bos for bos, cut in zip(cu[:-1], cuts)]
    lens_2 = [eos - cut for cut, eos in zip(cuts, cu[1:])]
    cu_1 = torch.tensor([0] + lens_1).cumsum(0)
    cu_2 = torch.tensor([0] + lens_2).cumsum(0)
    seq = {n: x for n, x in inputs.items() if n != "initial_state"}
    o_1, s_1 = chunk_gated_delta_rule_ref(**{n: x[:, first_idx] for n, x in seq.items()},
                                          initial_state=inputs["initial_state"], output_final_state=True,
                                          chunk_size=case.C, cu_seqlens=cu_1)
    o_2, s_2 = chunk_gated_delta_rule_ref(**{n: x[:, second_idx] for n, x in seq.items()},
                                          initial_state=s_1, output_final_state=True,
                                          chunk_size=case.C, cu_seqlens=cu_2)
    torch.testing.assert_close(o_1, o_all[:, first_idx], **TOL)
    torch.testing.assert_close(o_2, o_all[:, second_idx], **TOL)
    torch.testing.assert_close(s_2, s_all, **TOL)


@pytest.mark.parametrize("chunk_size", [1, 3, 16, 64, 512])
def test_chunk_size_does_not_change_the_result(chunk_size: int):
    case = Case(B=1, T=90, h_qk=1, h_v=2, cu_seqlens=(0, 41, 85), h0=True, seed=7)
    inputs = {n: x.detach() for n, x in make_inputs(case).items()}
    kw = {"output_final_state": True, "cu_seqlens": torch.tensor(case.cu_seqlens)}
    o, s = chunk_gated_delta_rule_ref(**inputs, chunk_size=chunk_size, **kw)
    o_r, s_r = recurrent_gated_delta_rule_ref(**inputs, **kw)
    torch.testing.assert_close(o, o_r, **TOL)
    torch.testing.assert_close(s, s_r, **TOL)


def naive_recurrence(q, k, v, g, beta, scale, h0):
    """Dense, one head at a time, written straight from the delta rule (no GQA, no l2norm).

    q, k `[B, T, H, K]`, v `[B, T, H, V]`, g, beta `[B, T, H]`, h0 `[B, H, K, V]`.
    Returns o `[B, T, H, V]` and the states after every token `[B, T, H, K, V]`.
    """
    B, T, H, _ = q.shape
    o = torch.zeros(B, T, H, v.shape[-1], dtype=F64)
    states = torch.zeros(B, T, H, k.shape[-1], v.shape[-1], dtype=F64)
    for b in range(B):
        for h in range(H):
            S = h0[b, h].clone()
            for t in range(T):
                kt = k[b, t, h]
                S = torch.exp(g[b, t, h]) * S  # decay first, then the delta-rule write
                v_new = beta[b, t, h] * (v[b, t, h] - S.T @ kt)
                S = S + torch.outer(kt, v_new)
                o[b, t, h] = scale * S.T @ q[b, t, h]
                states[b, t, h] = S
    return o, states


def test_recurrent_matches_naive_loop_with_gqa_and_l2norm():
    case = Case(B=2, T=30, h_qk=1, h_v=3, K=8, V=4, h0=True, l2norm=True, seed=8)
    x = {n: t.detach() for n, t in make_inputs(case).items()}
    scale = 0.37
    o, s = recurrent_gated_delta_rule_ref(**x, scale=scale, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)
    qn = l2norm(x["q"]).repeat_interleave(3, dim=2)
    kn = l2norm(x["k"]).repeat_interleave(3, dim=2)
    o_n, states = naive_recurrence(qn, kn, x["v"], x["g"], x["beta"], scale, x["initial_state"])
    torch.testing.assert_close(o, o_n, **TOL)
    torch.testing.assert_close(s, states[:, -1], **TOL)


def test_l2norm_rule():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=F64)
    y = l2norm(x)
    torch.testing.assert_close(y[0], torch.tensor([3.0, 4.0], dtype=F64) / (25 + 1e-6) ** 0.5)
    assert torch.equal(y[1], torch.zeros(2, dtype=F64))


def test_default_scale_is_inverse_sqrt_k():
    case = Case(B=1, T=20, h_qk=1, h_v=1, K=16, V=8)
    x = {n: t.detach() for n, t in make_inputs(case).items()}
    o_default, _ = chunk_gated_delta_rule_ref(**x, chunk_size=case.C)
    o_explicit, _ = chunk_gated_delta_rule_ref(**x, scale=0.25, chunk_size=case.C)
    o_double, _ = chunk_gated_delta_rule_ref(**x, scale=0.5, chunk_size=case.C)
    torch.testing.assert_close(o_default, o_explicit, rtol=0, atol=0)
    torch.testing.assert_close(o_double, 2 * o_explicit, **TOL)


def test_outputs_are_float64_from_low_precision_inputs():
    case = Case(B=1, T=20, h_qk=1, h_v=2, h0=True)
    x = {n: t.detach() for n, t in make_inputs(case).items()}
    low = {n: (t.to(torch.float32) if n in ("q", "k", "v") else t) for n, t in x.items()}
    o, s = chunk_gated_delta_rule_ref(**low, output_final_state=True, chunk_size=case.C)
    assert o.dtype == F64 and s.dtype == F64
    o_ref, _ = chunk_gated_delta_rule_ref(**{**x, **{n: low[n].to(F64) for n in ("q", "k", "v")}},
                                          chunk_size=case.C)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=0)


def test_final_state_is_none_unless_asked():
    case = Case(B=1, T=10, h_qk=1, h_v=1)
    x = {n: t.detach() for n, t in make_inputs(case).items()}
    assert chunk_gated_delta_rule_ref(**x)[1] is None
    assert recurrent_gated_delta_rule_ref(**x)[1] is None


GRADCHECK_CASES = [
    # fast_mode checks random projections of the Jacobian, so it affords GQA and more tokens.
    (Case(B=1, T=7, h_qk=1, h_v=2, K=3, V=2, C=3, cu_seqlens=(0, 2, 6), h0=True, l2norm=True, seed=9), True),
    (Case(B=1, T=5, h_qk=1, h_v=1, K=2, V=2, C=2, cu_seqlens=(0, 1, 4), h0=True, l2norm=True, seed=9), False),
]


@pytest.mark.parametrize("case,fast_mode", GRADCHECK_CASES,
                         ids=[f"{c.id}-{'fast' if f else 'full'}" for c, f in GRADCHECK_CASES])
def test_gradcheck_tiny(case: Case, fast_mode: bool):
    x = make_inputs(case)
    cu = torch.tensor(case.cu_seqlens)
    names = ["q", "k", "v", "g", "beta", "initial_state"]

    def fn(*args):
        return chunk_gated_delta_rule_ref(**dict(zip(names, args)), output_final_state=True,
                                          cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                          chunk_size=case.C)

    assert torch.autograd.gradcheck(fn, tuple(x[n] for n in names), eps=1e-6, atol=1e-7, rtol=1e-5,
                                    fast_mode=fast_mode)


# --- intermediates ---------------------------------------------------------------------------

INTER_CASES = [
    Case(B=2, T=70, h_qk=2, h_v=4, h0=True, seed=10),
    Case(B=1, T=200, h_qk=1, h_v=2, cu_seqlens=(0, 37, 37, 100, 163), h0=True, seed=11),
    Case(B=1, T=90, h_qk=2, h_v=2, cu_seqlens=(0, 50, 85), h0=True, state_v_first=True, l2norm=True,
         seed=12),
]


def _sequences(case: Case):
    if case.cu_seqlens is None:
        return [(b, 0, case.T) for b in range(case.B)]
    cu = case.cu_seqlens
    return [(0, bos, eos) for bos, eos in itertools.pairwise(cu)]


@pytest.mark.parametrize("case", INTER_CASES, ids=lambda c: c.id)
def test_intermediates(case: Case):
    x = {n: t.detach() for n, t in make_inputs(case).items()}
    kw = call_kwargs(case)
    inter = chunk_intermediates_ref(**x, chunk_size=case.C, **kw)
    o, final = chunk_gated_delta_rule_ref(**x, output_final_state=True, chunk_size=case.C, **kw)
    torch.testing.assert_close(inter.o, o, rtol=0, atol=0)
    torch.testing.assert_close(inter.final_state, final, rtol=0, atol=0)

    C, group = case.C, case.h_v // case.h_qk
    k = l2norm(x["k"]) if case.l2norm else x["k"]
    k = k.repeat_interleave(group, dim=2)
    h0 = x["initial_state"]
    if case.state_v_first:
        h0 = h0.transpose(-1, -2)
    h = inter.h.transpose(-1, -2) if case.state_v_first else inter.h
    nt = sum(-(-(eos - bos) // C) for _, bos, eos in _sequences(case))
    assert inter.g_cumsum.shape == (case.B, case.T, case.h_v)
    assert inter.A.shape == (case.B, case.T, case.h_v, C)
    assert h.shape == (nt, case.h_v, case.K, case.V)

    chunk_index = 0
    eye = torch.eye(C, dtype=F64)
    for n, (b, bos, eos) in enumerate(_sequences(case)):
        # The recurrence's state after every token of this sequence.
        _, states = naive_recurrence(
            x["q"][b:b + 1, bos:eos].repeat_interleave(group, dim=2), k[b:b + 1, bos:eos],
            x["v"][b:b + 1, bos:eos], x["g"][b:b + 1, bos:eos], x["beta"][b:b + 1, bos:eos], 1.0,
            h0[n:n + 1])
        for c, start in enumerate(range(bos, eos, C)):
            stop = min(start + C, eos)
            m = stop - start
            gc = inter.g_cumsum[b, start:stop]
            torch.testing.assert_close(gc, x["g"][b, start:stop].cumsum(0), **TOL)
            if c == 0:
                torch.testing.assert_close(h[chunk_index], h0[n], rtol=0, atol=0)
            else:
                torch.testing.assert_close(h[chunk_index], states[0, start - bos - 1], **TOL)
            A = inter.A[b, start:stop].movedim(1, 0)  # [H_v, m, C]
            assert torch.equal(A[..., m:], torch.zeros_like(A[..., m:])), "A reaches past the chunk"
            kc = k[b, start:stop].movedim(1, 0)  # [H_v, m, K]
            bc = x["beta"][b, start:stop].movedim(1, 0)  # [H_v, m]
            lower = torch.tril(bc[..., :, None] * (kc @ kc.transpose(-1, -2)), -1)
            identity = A[..., :m] @ (eye[:m, :m] + lower)
            torch.testing.assert_close(identity, eye[:m, :m].expand_as(identity), **TOL)
            chunk_index += 1
    assert chunk_index == nt
    if case.cu_seqlens is not None:
        end = case.cu_seqlens[-1]
        assert torch.equal(inter.g_cumsum[:, end:], torch.zeros_like(inter.g_cumsum[:, end:]))
        assert torch.equal(inter.A[:, end:], torch.zeros_like(inter.A[:, end:]))


@pytest.mark.parametrize("fn", [chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref],
                         ids=["chunk", "recurrent"])
@pytest.mark.parametrize("T,cu", [(0, None), (5, (0, 0, 0))], ids=["T0", "all-empty-varlen"])
def test_no_tokens_keeps_device_and_state(fn, T, cu):
    """With no token inside any sequence, o is zeros on the inputs' device and the state passes through.

    The 'meta' device stands in for CUDA: the outputs must not fall back to the CPU.
    """
    dev = "meta"
    q = torch.empty(1, T, 1, 4, dtype=torch.bfloat16, device=dev)
    v = torch.empty(1, T, 2, 3, dtype=torch.bfloat16, device=dev)
    g = torch.empty(1, T, 2, dtype=torch.float32, device=dev)
    n = 1 if cu is None else len(cu) - 1
    h0 = torch.empty(n, 2, 4, 3, dtype=torch.float32, device=dev)
    kw = {} if cu is None else {"cu_seqlens": torch.tensor(cu)}
    o, s = fn(q, q, v, g, g, initial_state=h0, output_final_state=True, **kw)
    assert o.device.type == dev and o.shape == (1, T, 2, 3) and o.dtype == F64
    assert s.device.type == dev and s.shape == (n, 2, 4, 3)
    # Same call on CPU: the values.
    cpu = [torch.randn(x.shape, dtype=x.dtype) for x in (q, v, g, h0)]
    o, s = fn(cpu[0], cpu[0], cpu[1], cpu[2], cpu[2], initial_state=cpu[3], output_final_state=True, **kw)
    assert torch.equal(o, torch.zeros(1, T, 2, 3, dtype=F64))
    assert torch.equal(s, cpu[3].to(F64))
