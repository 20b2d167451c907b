"""Intra-card CP on the CPU: the plan (cp.py) and the CP forward's orchestration (forward_cp.py).

The orchestration runs with float64 twins of the three forward kernels (emulate_fwd.py), so the
only differences from the float64 reference are rounding (exact mode) or the documented warm-up
truncation error (decay_threshold on).
"""

from __future__ import annotations

import itertools
import math
import random
import types

import pytest
import torch
import torch.nn.functional as F

from qlabench.kernels import cp
from qlabench.kernels.cp import build_plan, choose_piece_chunks, plan_cp
from qlabench.kernels.emulate_fwd import TWIN_KERNELS, twin_chunk_fwd_kernel, twin_kkt_solve_kernel
from qlabench.kernels.forward_cp import ForwardKernels, _fwd_cp, warmup_skips
from qlabench.kernels.reference import chunk_gated_delta_rule_ref, chunk_intermediates_ref
from qlabench.kernels.validate import validate
from qlabench.workload import make_gate

F64 = torch.float64
EXACT = 1e-10


# ---------------------------------------------------------------------------------------- plan


def _cu(lengths, start=0):
    return list(itertools.accumulate(lengths, initial=start))


@pytest.mark.parametrize("seed", range(6))
def test_plan_covers_every_token_chunk_aligned(seed):
    rng = random.Random(seed)
    C = rng.choice([16, 32, 64])
    L = rng.choice([1, 2, 4, 8])
    lengths = [rng.choice([0, 1, C - 1, C, C + 1, rng.randint(1, 40 * C)]) for _ in range(rng.randint(1, 12))]
    cu = _cu(lengths)
    plan = build_plan(cu, L, C, "cpu")
    pieces = plan.pieces
    assert plan.cu_pieces.tolist() == [0] + [p[1] for p in pieces]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces)), "pieces must tile the token axis"
    assert pieces[-1][1] == cu[-1]
    offsets = [0]
    for n, (bos, eos) in enumerate(itertools.pairwise(cu)):
        mine = [p for p in pieces if p[2] == n]
        nc = -(-(eos - bos) // C)
        assert len(mine) == (-(-nc // L) if nc > L else 1)
        assert mine[0][0] == bos and mine[-1][1] == eos
        for j, (a, b, _) in enumerate(mine):
            assert (a - bos) % (L * C) == 0, "piece start not chunk aligned in its sequence"
            assert b - a <= L * C or len(mine) == 1
            offsets.append(offsets[-1] + -(-(b - a) // C))
        assert plan.is_first.tolist()[pieces.index(mine[0])] and plan.is_last.tolist()[pieces.index(mine[-1])]
        assert plan.last_piece.tolist()[n] == pieces.index(mine[-1])
    assert plan.chunk_offsets.tolist() == offsets
    assert plan.piece_seq.tolist() == [p[2] for p in pieces]
    assert sum(plan.is_first.tolist()) == sum(plan.is_last.tolist()) == len(lengths)
    # Every piece that is not last in its sequence lies in the local pass's range.
    non_last = [j for j, last in enumerate(plan.is_last.tolist()) if not last]
    if non_last:
        lo, hi = plan.pass1
        assert lo == non_last[0] and hi == non_last[-1] + 1
        assert plan.pass1_cu.tolist() == plan.cu_pieces.tolist()[lo:hi + 1]
    else:
        assert plan.pass1 is None and not plan.enabled


def test_plan_off_is_the_sequences():
    cu = [0, 100, 100, 5000]
    plan = build_plan(cu, None, 64, "cpu")
    assert not plan.enabled and plan.pass1 is None
    assert plan.cu_pieces.tolist() == cu and plan.piece_seq.tolist() == [0, 1, 2]


@pytest.mark.parametrize("heads,on,L", [(8, True, 16), (16, True, 32), (32, True, 32), (48, True, 32),
                                        (64, False, 64)])
def test_choose_h200_32k_matches_flashqla_examples(heads, on, L):
    """flashqla-design.md 4.2's H200 examples (132 SMs, one 32k sequence = 512 chunks)."""
    assert choose_piece_chunks([32768], heads, 132, 64) == (on, L)


def test_choose_thresholds():
    # Many long sequences fill the GPU: off. One short sequence: nothing to cut.
    assert not choose_piece_chunks([32768] * 8, 8, 132, 64)[0]
    assert not choose_piece_chunks([200], 1, 132, 64)[0]
    # 56-chain threshold needs >= 128 chunks in the longest sequence.
    assert not choose_piece_chunks([127 * 64] * 1, 50, 132, 64)[0]
    assert choose_piece_chunks([128 * 64] * 1, 50, 132, 64)[0]
    # Effective batch: one long sequence plus short ones counts the short ones' share.
    on, L = choose_piece_chunks([32768] + [64] * 64, 4, 132, 64)
    assert on and L >= 4
    # L is a power of two >= 4 and grows like sqrt(heads).
    for heads in (1, 2, 4, 8, 16, 32, 64, 128):
        L = choose_piece_chunks([65536], heads, 132, 64)[1]
        assert L >= 4 and L & (L - 1) == 0
    assert choose_piece_chunks([1 << 20], 64, 132, 64)[1] > choose_piece_chunks([1 << 20], 4, 132, 64)[1]
    # More SMs -> shorter pieces.
    assert choose_piece_chunks([65536], 16, 264, 64)[1] <= choose_piece_chunks([65536], 16, 132, 64)[1]
    with pytest.raises(ValueError):
        choose_piece_chunks([64], 0, 132, 64)


def test_plan_heads_makes_the_split_independent_of_sharding():
    cu = torch.tensor([0, 20000, 32768], dtype=torch.int32)
    full = plan_cp(cu, heads=16, sm_count=132, chunk_size=64)
    # A rank holding 4 of the 16 heads plans with the global count: same split.
    shard = plan_cp(cu, heads=16, sm_count=132, chunk_size=64)
    assert shard.pieces == full.pieces and full.enabled
    # Planning with the local count would cut differently (upstream's behaviour).
    local = plan_cp(cu, heads=4, sm_count=132, chunk_size=64)
    assert local.pieces != full.pieces


def test_plan_cache_and_capture(monkeypatch):
    cu = torch.tensor([0, 4096], dtype=torch.int32)
    a = plan_cp(cu, heads=2, sm_count=132, chunk_size=64)
    assert plan_cp(cu, heads=2, sm_count=132, chunk_size=64) is a
    dense = plan_cp(None, heads=2, sm_count=132, chunk_size=64, B=1, T=4096)
    assert dense.pieces == a.pieces
    monkeypatch.setattr(cp, "_capturing", lambda device: True)
    assert plan_cp(cu, heads=2, sm_count=132, chunk_size=64) is a  # cached: no host work
    with pytest.raises(RuntimeError, match="capture"):
        plan_cp(cu, heads=3, sm_count=132, chunk_size=64)


# ------------------------------------------------------------------------------- orchestration


def _inputs(T, h_qk, h_v, *, B=1, D=16, gates=None, h0_n=None, state_v_first=False, seed=0):
    """Float64 inputs, l2-normalised q/k, beta in (0, 1). ``gates`` per v-head: "zero" (g = 0),
    "strong" (about -2 per token), "qwen" (qwen-like at A = 16: about -20 per token), anything else
    moderate (logsigmoid / 8)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    q = F.normalize(randn(B, T, h_qk, D), dim=-1)
    k = F.normalize(randn(B, T, h_qk, D), dim=-1)
    v = randn(B, T, h_v, D)
    beta = torch.sigmoid(randn(B, T, h_v))
    g = F.logsigmoid(randn(B, T, h_v)) / 8
    for h, kind in enumerate(gates or ()):
        if kind == "zero":
            g[..., h] = 0
        elif kind == "strong":
            g[..., h] = -2 * F.softplus(randn(B, T) + 1)
        elif kind == "qwen":
            g[..., h] = -16 * F.softplus(0.5 * randn(B, T) + 1)
    h0 = None if h0_n is None else randn(h0_n, h_v, D, D)
    return q, k, v, g, beta, h0


def _run(q, k, v, g, beta, h0, cu, C, L, *, state_v_first=False, threshold=None, transition="auto",
         enable=True, kernels=None, final=True, keep_a=True):
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    p = validate(q, k, v, g, beta, None, h0, cu_t, state_v_first)
    plan = plan_cp(cu_t, heads=p.h_v, sm_count=132, chunk_size=C, B=p.B, T=p.T, piece_chunks=L, enable=enable)
    arch = types.SimpleNamespace(name="sm90", chunk_size=C)
    kernels = kernels or ForwardKernels(**TWIN_KERNELS)
    out = _fwd_cp(q, k, v, g, beta, p, h0, cu_t, final, state_v_first, plan, threshold, transition, kernels,
                  arch, 132, keep_a=keep_a)
    return out, plan


def _counting_kernels(calls: list, launches: list | None = None):
    """The twins, with every recurrence launch appended to ``calls`` (and its skip table to
    ``launches``)."""

    def recurrence(n_blocks, sms, arch, bv=None):
        twin_factory = TWIN_KERNELS["recurrence"](n_blocks, sms, arch)

        def factory(*cfg):
            kernel = twin_factory(*cfg)

            def launch(*args):
                calls.append(args[6].numel() - 1)  # pieces in the launch
                if launches is not None:  # (pieces, chunk_skip or None)
                    launches.append((args[6].numel() - 1, args[9].clone() if args[-1] else None))
                return kernel(*args)
            return launch
        return factory

    return ForwardKernels(TWIN_KERNELS["cumsum"], TWIN_KERNELS["kkt_solve"], recurrence, TWIN_KERNELS["correct"])


def _check_exact(q, k, v, g, beta, h0, cu, C, L, state_v_first=False, threshold=None):
    (gc, A, o, h, ht), plan = _run(q, k, v, g, beta, h0, cu, C, L, state_v_first=state_v_first,
                                threshold=threshold)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    ref = chunk_intermediates_ref(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu_t,
                                  state_v_first=state_v_first, chunk_size=C)
    end = cu[-1] if cu is not None else o.shape[0] * o.shape[1]

    def flat(x):
        return x.reshape(-1, *x.shape[2:])[:end]

    assert h is None
    assert (o - ref.o).abs().max() <= EXACT
    assert (ht - ref.final_state).abs().max() <= EXACT
    assert (flat(gc) - flat(ref.g_cumsum)).abs().max() <= EXACT
    assert (flat(A) - flat(ref.A)).abs().max() <= EXACT
    if cu is not None:
        assert torch.all(o.reshape(-1, *o.shape[2:])[end:] == 0), "padding tail of o not zero"
    return plan


def test_exact_single_sequence_with_h0():
    plan = _check_exact(*_inputs(300, 1, 2, h0_n=1), None, 8, 4)
    assert plan.enabled and plan.n_pieces == 10


def test_exact_dense_batch():
    _check_exact(*_inputs(150, 2, 2, B=2, h0_n=2), None, 8, 2)


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_exact_varlen_short_empty_tail_gqa(state_v_first):
    cu = [0, 100, 100, 130, 131, 300, 301]  # long, empty, shorter than a piece, 1 token, long, 1 token
    plan = _check_exact(*_inputs(320, 1, 4, h0_n=6, state_v_first=state_v_first), cu, 8, 4,
                        state_v_first=state_v_first)
    assert plan.pass1_wasted > 0  # short sequences between long ones run in the local pass too


def _expected_skips(g, cu, C, L, threshold, H):
    """Host walk over the raw gates (independent of forward_cp): per local-pass piece and head,
    (skip_local, skip_m, fallback) as forward_cp.warmup_skips documents them."""
    plan = build_plan(cu, L, C, "cpu")
    lo, hi = plan.pass1
    gf = g.reshape(-1, H)
    rows = []
    for j in range(lo, hi):
        bos, eos, n = plan.pieces[j]
        m = -(-(eos - bos) // C)
        needed = j + 1 < plan.n_pieces and plan.pieces[j + 1][2] == n
        row = []
        for h in range(H):
            chunk_decay = [float(gf[t:min(t + C, eos), h].sum()) for t in range(bos, eos, C)]
            total, n_fwd = 0.0, None
            for r, d in enumerate(reversed(chunk_decay)):
                total += d
                if threshold is not None and total < threshold:
                    n_fwd = r + 1
                    break
            if not needed:
                row.append((m, m, False))
            elif n_fwd is None:
                row.append((0, 0, True))
            else:
                row.append((m - n_fwd, m, False))
        rows.append(row)
    t = torch.tensor(rows, dtype=torch.int64)  # [P1, H, 3]
    return t[..., 0], t[..., 1], t[..., 2].bool()


def _check_tables(g, cu, C, L, threshold, H, launches=None):
    """warmup_skips against the host walk; the local / transition launches got those tables."""
    T_all = g.numel() // H
    cu = cu if cu is not None else [0, T_all]  # one dense sequence (B = 1)
    want = _expected_skips(g, cu, C, L, threshold, H)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    plan = plan_cp(cu_t, heads=H, sm_count=132, chunk_size=C, piece_chunks=L, enable=True)
    table = cp_chunk_table(cu_t, T_all, C)
    gc = TWIN_KERNELS["cumsum"](g.reshape(-1, H), table, C, "sm90")
    got = warmup_skips(plan, gc, threshold)
    assert got[0].dtype == got[1].dtype == torch.int32 and got[2].dtype == torch.bool
    for w, x in zip(want, got):
        assert torch.equal(x.to(w.dtype), w), (w, x)
    if launches is not None:
        skips = [sk for _, sk in launches if sk is not None]
        assert torch.equal(skips[0].long(), want[0]), "local pass launched with other skips"
        if len(skips) > 1:
            assert torch.equal(skips[1].long(), want[1]), "transition pass launched with other skips"
        assert launches[-1][1] is None, "the output pass runs every chunk (has_skip = 0)"
    return want


def cp_chunk_table(cu_t, n_tok, C):
    from qlabench.kernels.common.chunks import build_chunk_table

    return build_chunk_table(cu_t, n_tok, C)


def _ref(q, k, v, g, beta, h0, cu, C):
    cu_t = None if cu is None else torch.tensor(cu)
    return chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                      cu_seqlens=cu_t, chunk_size=C)


def test_warmup_skip_table_for_constructed_gates():
    """Chunk decays chosen by hand (C = 4, pieces of 4 chunks, threshold -10): the first count of
    chunks, walking back from the piece end, whose decay sum is strictly below -10."""
    C, L, H = 4, 4, 6
    cu = [0, 64, 72, 72 + 40]  # 16 chunks (4 pieces), 2 chunks (1 piece, in the range), 10 chunks (3 pieces)
    T = cu[-1]
    g = torch.zeros(1, T, H, dtype=F64)
    g[..., 0] = -3 / C  # -3 per chunk: -3, -6, -9, -12 -> n = 4 (reached on the first chunk: not fallback)
    g[..., 1] = -11 / C  # -11 per chunk -> n = 1
    # head 2: g = 0 -> fallback everywhere
    g[..., 3] = -1.25  # -5 per chunk: -5, -10 (not below), -15 -> n = 3
    g[0, 0:4, 4] = -50 / C  # piece 0: only its first chunk decays -> n = 4, skip 0, not fallback
    g[0, 16:20, 4] = -50 / C  # piece 1 likewise
    g[0, 30:32, 4] = -20  # piece 1's last chunk's last two tokens: n = 1
    g[..., 5] = -0.1  # -0.4 per chunk: never (fallback)
    want = _check_tables(g, cu, C, L, -10.0, H)
    skip_local, skip_m, fallback = want
    # pieces of the range: seq 0 pieces 0-3 (3 is last: wasted), seq 1 (wasted), seq 2 pieces 0-1
    assert skip_local.tolist() == [
        [0, 3, 0, 1, 0, 0], [0, 3, 0, 1, 3, 0], [0, 3, 0, 1, 0, 0], [4, 4, 4, 4, 4, 4],
        [2, 2, 2, 2, 2, 2], [0, 3, 0, 1, 0, 0], [0, 3, 0, 1, 0, 0]]
    f, t = False, True
    assert fallback.tolist() == [[f, f, t, f, f, t]] * 2 + [[f, f, t, f, t, t]] + [[f] * 6] * 2 + \
        [[f, f, t, f, t, t]] * 2
    assert torch.equal(skip_m, torch.where(fallback, 0, skip_m.amax(1, keepdim=True)))
    # the same tables with threshold None: every needed (piece, head) falls back
    skip_local, skip_m, fallback = _check_tables(g, cu, C, L, None, H)
    assert fallback.tolist() == [[True] * 6] * 3 + [[False] * 6] * 2 + [[True] * 6] * 2
    assert skip_local.tolist() == skip_m.tolist() == [[0] * 6] * 3 + [[4] * 6, [2] * 6] + [[0] * 6] * 2


def test_twin_chunk_skip_semantics():
    """The recurrence's chunk_skip (what the kernel must do, stated by its float64 twin): block
    (n, h) runs chunks skip .. of its sequence from h0, i.e. the reference on the tokens from
    bos + skip * C; o and h rows of skipped chunks stay untouched; h rows keep their chunk index."""
    C, H = 8, 2
    cu = [0, 37, 37, 100]  # 5 chunks (partial last), empty, 8 chunks (partial last)
    T = 104  # + a padding tail
    q, k, v, g, beta, h0 = _inputs(T, 1, H, h0_n=3, seed=5)
    skip = torch.tensor([[1, 4], [3, 0], [0, 9]], dtype=torch.int32)  # 9 > 8 chunks: nothing runs
    cu_t = torch.tensor(cu, dtype=torch.int32)
    table = cp_chunk_table(cu_t, T, C)
    q2, k2, v2 = q[0], k[0], v[0]
    g2, b2 = g[0], beta[0]
    gc = TWIN_KERNELS["cumsum"](g2, table, C, "sm90")
    A, Ag, Pm = (torch.zeros(T, H, C, dtype=F64) for _ in range(3))
    scale = 16 ** -0.5
    kkt = twin_kkt_solve_kernel(1, H, 16, C, "float64", "sm90")
    kkt(q2, k2, gc, b2, table.chunk_bounds, A, Ag, Pm, scale)
    o = torch.full((T, H, 16), 7.0, dtype=F64)
    h_out = torch.full((table.n_chunks_max, H, 16, 16), 7.0, dtype=F64)
    ht = torch.empty(3, H, 16, 16, dtype=F64)
    kernel = twin_chunk_fwd_kernel(1, H, 16, 16, 16, C, "float64", False, "sm90")
    kernel(q2, k2, v2, gc, Ag, Pm, cu_t, table.chunk_offsets, table.seq_order, skip, h0, o, ht, h_out, scale, 1, 1, 1, 1)
    offsets = table.chunk_offsets.tolist()
    for n, (bos, eos) in enumerate(itertools.pairwise(cu)):
        n_chunks = -(-(eos - bos) // C)
        for h in range(H):
            s = int(skip[n, h])
            start = min(bos + s * C, eos)
            assert torch.all(o[bos:start, h] == 7.0), "o of skipped chunks written"
            assert torch.all(h_out[offsets[n]:offsets[n] + min(s, n_chunks), h] == 7.0), "h of skipped chunks"
            if start == eos:
                assert torch.equal(ht[n, h], h0[n, h])
                continue
            hs = slice(h, h + 1)
            tok = slice(start, eos)
            ref = chunk_intermediates_ref(q[:, tok], k[:, tok], v[:, tok, hs], g[:, tok, hs], beta[:, tok, hs],
                                          initial_state=h0[n:n + 1, hs], chunk_size=C)
            assert (o[start:eos, h] - ref.o[0, :, 0]).abs().max() <= EXACT
            assert (ht[n, h] - ref.final_state[0, 0]).abs().max() <= EXACT
            rows = h_out[offsets[n] + s:offsets[n] + n_chunks, h]
            assert (rows - ref.h[:, 0]).abs().max() <= EXACT
    assert torch.all(o[cu[-1]:] == 0), "padding tail not zeroed"
    # has_skip = 0 with a [1, H] dummy: every chunk runs (equal to skip 0 everywhere)
    o2, ht2 = torch.empty_like(o), torch.empty_like(ht)
    dummy = torch.full((1, H), 5, dtype=torch.int32)
    kernel(q2, k2, v2, gc, Ag, Pm, cu_t, table.chunk_offsets, table.seq_order, dummy, h0, o2, ht2, h_out, scale, 1, 1, 0, 0)
    o3, ht3 = torch.empty_like(o), torch.empty_like(ht)
    zeros = torch.zeros(3, H, dtype=torch.int32)
    kernel(q2, k2, v2, gc, Ag, Pm, cu_t, table.chunk_offsets, table.seq_order, zeros, h0, o3, ht3, h_out, scale, 1, 1, 0, 1)
    assert torch.equal(o2, o3) and torch.equal(ht2, ht3)


def test_mixed_truncated_and_fallback_heads():
    """qwen-like heads (g ~ -20 per token) warm up over their last chunk only (dropped terms
    ~ e^-100: exact), zero-gate and moderate heads fall back (whole piece and M: exact)."""
    gates = ["zero", "qwen", "moderate", "qwen"]
    q, k, v, g, beta, h0 = _inputs(400, 2, 4, gates=gates, h0_n=2)
    cu = [0, 250, 400]
    calls, launches = [], []
    (_, _, o, _, ht), plan = _run(q, k, v, g, beta, h0, cu, 8, 4, threshold=-10.0,
                                  kernels=_counting_kernels(calls, launches))
    assert len(calls) == 3  # local pass, transition pass (fallback heads need M), output pass
    skip_local, skip_m, fallback = _check_tables(g, cu, 8, 4, -10.0, 4, launches)
    needed = plan.pass1_needed
    assert torch.all(fallback[needed][:, [0, 2]]) and not fallback[:, [1, 3]].any()
    assert torch.all(skip_local[needed][:, [1, 3]] == 3)  # 4-chunk pieces, warm-up over 1 chunk
    assert torch.all(skip_m[:, [1, 3]] == 4)  # no transition work for truncated heads
    ref_o, ref_s = _ref(q, k, v, g, beta, h0, cu, 8)
    assert (o - ref_o).abs().max() <= EXACT and (ht - ref_s).abs().max() <= EXACT
    _check_exact(q, k, v, g, beta, h0, cu, 8, 4, threshold=-10.0)


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_strong_decay_qwen_profile(state_v_first):
    """The suite's qwen gates (A_h ~ U(0, 16), first head A = 0, last A = 16), C = 16: strong heads
    truncate to short warm-ups, the A = 0 head falls back; error within the bound, A = 0 exact."""
    H, C, L, threshold = 6, 16, 4, -10.0
    q, k, v, _, beta, h0 = _inputs(700, 2, H, h0_n=2, state_v_first=state_v_first, seed=3)
    g = make_gate("qwen", 700, H, torch.Generator().manual_seed(3), "cpu").to(F64)
    cu = [0, 450, 700]
    (_, _, o, _, ht), plan = _run(q, k, v, g, beta, h0, cu, C, L, state_v_first=state_v_first,
                                  threshold=threshold)
    skip_local, _, fallback = _check_tables(g, cu, C, L, threshold, H)
    needed = plan.pass1_needed
    assert fallback[needed][:, 0].all() and not fallback[:, -1].any()
    assert (skip_local[needed][:, -1] == 3).all()  # A = 16: ~-20 per token, one chunk of warm-up
    _check_bound(q, k, v, g, beta, h0, cu, C, o, ht, threshold, state_v_first, exact_heads=[0])


def test_bench_gates_with_zero_gate_heads():
    """The suite's bench gates (logsigmoid(randn) / 16, 25% of heads at g = 0) at C = 64: ~-3.2 per
    chunk, so non-zero heads warm up over ~4 of the piece's 8 chunks; zero heads fall back (exact)."""
    H, C, L, threshold = 8, 64, 8, -10.0
    T = 64 * 40
    q, k, v, _, beta, h0 = _inputs(T, 2, H, h0_n=1, seed=4)
    g = make_gate("bench", T, H, torch.Generator().manual_seed(4), "cpu").to(F64)
    zero = [h for h in range(H) if bool((g[..., h] == 0).all())]
    assert len(zero) == 2
    calls, launches = [], []
    (_, _, o, _, ht), plan = _run(q, k, v, g, beta, h0, None, C, L, threshold=threshold,
                                  kernels=_counting_kernels(calls, launches))
    skip_local, skip_m, fallback = _check_tables(g, None, C, L, threshold, H, launches)
    decaying = [h for h in range(H) if h not in zero]
    needed = plan.pass1_needed
    assert torch.all(fallback[needed][:, zero]) and not fallback[:, decaying].any()
    warm = 8 - skip_local[needed][:, decaying]
    assert warm.min() >= 3 and warm.max() <= 5, warm  # 3-5 chunks of ~-3.2 to pass -10
    assert torch.all(skip_m[:, decaying] == 8)
    _check_bound(q, k, v, g, beta, h0, None, C, o, ht, threshold, False, exact_heads=zero)


def _check_bound(q, k, v, g, beta, h0, cu, C, o, ht, threshold, state_v_first, exact_heads=()):
    """Final state and outputs within the module docstring's bound (per sequence and head):
    e^threshold * max ||exact chunk-start state||_2 (scaled by scale ||q_t|| = scale for o)."""
    T = q.shape[1]
    cu = cu or [0, T]
    N = len(cu) - 1
    cu_t = torch.tensor(cu)
    ref = chunk_intermediates_ref(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu_t,
                                  state_v_first=state_v_first, chunk_size=C)
    lens = [b - a for a, b in itertools.pairwise(cu)]
    chunk_seq = torch.repeat_interleave(torch.arange(N), torch.tensor([math.ceil(n / C) for n in lens]))
    norms = torch.linalg.matrix_norm(ref.h, ord=2)  # [NT, H]
    bound = torch.stack([norms[chunk_seq == n].amax(0) for n in range(N)]) * math.exp(threshold)  # [N, H]
    err_final = torch.linalg.matrix_norm(ht - ref.final_state, ord=2)
    assert torch.all(err_final <= bound * (1 + 1e-9)), (err_final / bound).max()
    seq_of_token = torch.repeat_interleave(torch.arange(N), torch.tensor(lens))
    err_o = (o - ref.o)[0].norm(dim=-1)  # [T, H]; ||q_t|| = 1
    scale = q.shape[-1] ** -0.5
    assert torch.all(err_o <= scale * bound[seq_of_token] * (1 + 1e-9) + 1e-12)
    for h in exact_heads:
        assert err_final[:, h].max() <= EXACT and err_o[:, h].max() <= EXACT, f"head {h} not exact"
    return err_final, err_o


def test_transition_pass_skipped_when_every_head_decays():
    q, k, v, g, beta, h0 = _inputs(300, 1, 2, gates=["qwen", "qwen"], h0_n=1)
    for transition, launches in (("auto", 2), ("always", 3)):
        calls, args = [], []
        kernels = _counting_kernels(calls, args)
        (_, _, o, _, ht), _ = _run(q, k, v, g, beta, h0, None, 8, 4, threshold=-10.0, transition=transition,
                                   kernels=kernels)
        assert len(calls) == launches
        _check_tables(g, None, 8, 4, -10.0, 2, args)
        if transition == "always":  # runs, but every block skips all its chunks
            assert torch.all(args[1][1] == 4)  # 9 pieces of 4 chunks in the local range
        ref_o, ref_s = chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                  chunk_size=8)
        assert (o - ref_o).abs().max() <= EXACT and (ht - ref_s).abs().max() <= EXACT


def test_plan_off_runs_one_recurrence():
    q, k, v, g, beta, h0 = _inputs(200, 1, 2, h0_n=1)
    calls = []
    kernels = _counting_kernels(calls)
    (_, _, o, _, ht), plan = _run(q, k, v, g, beta, h0, None, 8, 4, enable=False, kernels=kernels)
    assert not plan.enabled and len(calls) == 1
    ref_o, ref_s = chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                              chunk_size=8)
    assert (o - ref_o).abs().max() <= EXACT and (ht - ref_s).abs().max() <= EXACT


def test_no_final_state():
    q, k, v, g, beta, h0 = _inputs(120, 1, 2)
    (_, _, o, _, ht), _ = _run(q, k, v, g, beta, h0, None, 8, 4, final=False)
    ref_o, _ = chunk_gated_delta_rule_ref(q, k, v, g, beta, chunk_size=8)
    assert ht is None and (o - ref_o).abs().max() <= EXACT


def test_without_a_same_output_and_no_a():
    """keep_a=False (a forward no backward follows): kkt_solve is asked not to write A, A comes back None,
    and o and the final state are exactly the keep_a=True call's."""
    q, k, v, g, beta, h0 = _inputs(300, 1, 2, h0_n=1)
    (_, A, o, _, ht), _ = _run(q, k, v, g, beta, h0, None, 8, 4)
    (_, A2, o2, _, ht2), _ = _run(q, k, v, g, beta, h0, None, 8, 4, keep_a=False)
    assert A is not None and A2 is None
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


def test_head_sharded_calls_match_the_unsharded_call():
    """With one plan (global head count) two 2-head shards reproduce the 4-head call per head."""
    q, k, v, g, beta, h0 = _inputs(300, 2, 4, gates=["zero", "strong", "moderate", "strong"], h0_n=1)
    (_, _, o, _, ht), _ = _run(q, k, v, g, beta, h0, None, 8, 4, threshold=-3.0)
    for s in range(2):
        heads = slice(2 * s, 2 * s + 2)
        (_, _, o_s, _, ht_s), _ = _run(q[:, :, s:s + 1], k[:, :, s:s + 1], v[:, :, heads], g[..., heads],
                                       beta[..., heads], h0[:, heads], None, 8, 4, threshold=-3.0)
        assert (o_s - o[:, :, heads]).abs().max() <= 1e-12
        assert (ht_s - ht[:, heads]).abs().max() <= 1e-12


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_truncation_error_within_bound(state_v_first):
    """threshold -2: warm-ups of a chunk or two make a clearly visible error, within
    e^threshold max_i ||S_t||_2 (exact chunk-start states); the zero-gate head is exact."""
    threshold = -2.0
    q, k, v, g, beta, h0 = _inputs(400, 1, 3, gates=["moderate", "moderate", "zero"], h0_n=2)
    g = g * 1.5
    cu = [0, 260, 400]
    (_, _, o, _, ht), plan = _run(q, k, v, g, beta, h0, cu, 8, 4, state_v_first=state_v_first,
                                  threshold=threshold)
    skip_local, _, fallback = _check_tables(g, cu, 8, 4, threshold, 3)
    needed = plan.pass1_needed
    assert (skip_local[needed][:, :2] > 0).float().mean() > 0.5, "warm-ups should be shorter than pieces"
    assert fallback[needed][:, 2].all()
    err_final, err_o = _check_bound(q, k, v, g, beta, h0, cu, 8, o, ht, threshold, state_v_first,
                                    exact_heads=[2])
    assert err_final.max() > 1e-3 and err_o.max() > 1e-4, "no visible truncation: the test tests nothing"
    # and threshold None is exact on the same inputs
    _check_exact(q, k, v, g, beta, h0, cu, 8, 4, state_v_first=state_v_first, threshold=None)


def test_exact_without_threshold_on_strong_gates():
    """decay_threshold None: every needed (piece, head) runs its whole piece and M, even where the
    gates would truncate; exact up to rounding."""
    q, k, v, g, beta, h0 = _inputs(300, 1, 3, gates=["qwen", "strong", "zero"], h0_n=1)
    calls, launches = [], []
    _run(q, k, v, g, beta, h0, None, 8, 4, threshold=None, kernels=_counting_kernels(calls, launches))
    assert len(calls) == 3
    assert torch.all(launches[0][1] == 0) and torch.all(launches[1][1] == 0)
    _check_tables(g, None, 8, 4, None, 3, launches)
    _check_exact(q, k, v, g, beta, h0, None, 8, 4, threshold=None)


def test_bad_arguments_are_named():
    q, k, v, g, beta, h0 = _inputs(64, 1, 2)
    with pytest.raises(ValueError, match="transition"):
        _run(q, k, v, g, beta, h0, None, 8, 4, transition="never")
    with pytest.raises(ValueError, match="decay_threshold"):
        _run(q, k, v, g, beta, h0, None, 8, 4, threshold=1.0)
    p = validate(q, k, v, g, beta)
    other = plan_cp(torch.tensor([0, 32, 64]), heads=2, sm_count=132, chunk_size=8)
    arch = types.SimpleNamespace(name="sm90", chunk_size=8)
    with pytest.raises(ValueError, match="plan is for"):
        _fwd_cp(q, k, v, g, beta, p, None, None, True, False, other, None, "auto",
                ForwardKernels(**TWIN_KERNELS), arch, 132)
