"""The backward's host side and kernel indexing on the CPU, with the kernels' torch twins.

``backward._bwd_impl`` is the exact code path of ``chunk_gated_delta_rule_bwd`` (flattening, chunk
tables, state layouts, buffer allocation, the five launches, GQA sums, padding tail); here it
launches ``emulate_bwd.KERNEL_TWINS``, torch functions with the compiled kernels' argument lists that
stage operands in the buffers' dtype (bf16). Every buffer starts as NaN, so an element a kernel
should write but does not shows up. The GPU twin of this file is ``test_backward_gpu.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from qlabench.kernels import backward
from qlabench.kernels.emulate_bwd import KERNEL_TWINS, SM100_TWINS
from qlabench.kernels.reference import chunk_gated_delta_rule_ref, chunk_intermediates_ref
from qlabench.kernels.validate import validate

from .gdn_inputs import rel_l2

F64 = torch.float64
NAMES = ("dq", "dk", "dv", "dbeta", "dg", "dh0")
TOL = 0.02


@dataclass(frozen=True)
class Case:
    T: int
    h_qk: int
    h_v: int
    B: int = 1
    cu_seqlens: tuple[int, ...] | None = None
    h0: bool = False
    dht: bool = True
    state_v_first: bool = False
    gate: str = "bench"
    seed: int = 0

    @property
    def id(self) -> str:
        parts = [f"B{self.B}", f"T{self.T}", f"H{self.h_qk}", f"HV{self.h_v}", self.gate]
        if self.cu_seqlens is not None:
            parts.append("varlen")
        for flag, name in ((self.h0, "h0"), (not self.dht, "nodht"), (self.state_v_first, "vfirst")):
            if flag:
                parts.append(name)
        return "-".join(parts)


def problem(case: Case, D: int = 128):
    """bf16 inputs, the float64 oracle's autograd gradients for them, and the backward's arguments."""
    gen = torch.Generator().manual_seed(case.seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    B, T = case.B, case.T
    q = F.normalize(randn(B, T, case.h_qk, D), dim=-1).bfloat16()
    k = F.normalize(randn(B, T, case.h_qk, D), dim=-1).bfloat16()
    v = randn(B, T, case.h_v, D).bfloat16()
    beta = torch.sigmoid(randn(B, T, case.h_v))
    if case.gate == "qwen":
        a_h = torch.rand(case.h_v, generator=gen) * 16
        g = -a_h * F.softplus(0.5 * randn(B, T, case.h_v) + 1)
    else:
        g = F.logsigmoid(randn(B, T, case.h_v)) / 16
    N = B if case.cu_seqlens is None else len(case.cu_seqlens) - 1
    h0 = randn(N, case.h_v, D, D) if case.h0 else None
    cu = None if case.cu_seqlens is None else torch.tensor(case.cu_seqlens, dtype=torch.int32)
    kw = {"initial_state": h0, "cu_seqlens": cu, "state_v_first": case.state_v_first}
    leaves = [x.to(F64).requires_grad_(True) for x in (q, k, v, g, beta)]
    h0_64 = h0.to(F64).requires_grad_(True) if case.h0 else None
    o, ht = chunk_gated_delta_rule_ref(*leaves, output_final_state=True, **{**kw, "initial_state": h0_64})
    do = randn(*o.shape).bfloat16()
    dht = randn(*ht.shape) if case.dht else None
    loss = (o * do.to(F64)).sum() + ((ht * dht.to(F64)).sum() if case.dht else 0)
    grads = torch.autograd.grad(loss, leaves + ([h0_64] if case.h0 else []))
    want = dict(zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads))
    with torch.no_grad():
        inter = chunk_intermediates_ref(q, k, v, g, beta, **kw)
    args = {"q": q, "k": k, "v": v, "g_cumsum": inter.g_cumsum.float(), "beta": beta,
            "A": inter.A.bfloat16(), "do": do, "dht": dht, **kw}
    return want, args


def run_twins(args, monkeypatch, twins=KERNEL_TWINS, host_bounds=True, lanes=None):
    """``host_bounds=False`` drops the host sequence bounds, as inside a CUDA-graph capture of an unseen
    cu_seqlens (the chunk table is then built on the device and has no ``tokens_end``); ``lanes``: the
    backward's lanes (`backward.backward_lanes`), or None."""
    def nan_alloc(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(backward, "_alloc", nan_alloc)
    p = validate(args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], None,
                 args["initial_state"], args["cu_seqlens"], args["state_v_first"], for_kernels=True)
    if not host_bounds:
        p = dataclasses.replace(p, seq_bounds=None)
    out = backward._bwd_impl(p, args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], args["A"],
                             args["do"], args["dht"], args["initial_state"], args["cu_seqlens"],
                             args["state_v_first"], 64, twins, lanes=lanes)
    return dict(zip(NAMES, out))



CASES = [
    Case(T=100, h_qk=1, h_v=2, B=2, h0=True),
    Case(T=260, h_qk=2, h_v=4, cu_seqlens=(0, 1, 34, 97, 161, 226, 226, 250)),  # 1,33,63,64,65,0,24 + tail 10
    Case(T=130, h_qk=1, h_v=2, h0=True, dht=False, state_v_first=True, gate="qwen", seed=1),
    Case(T=200, h_qk=2, h_v=2, cu_seqlens=(0, 65, 190), h0=True, gate="qwen", seed=2),
]


# sm90 launches bwd_chunk (dq, dk outputs at arguments 11, 12: `[T, H_qk, K]` in q's dtype, the group
# sum in the kernel); sm100 bwd_state + bwd_intra (11, 12: per v-head, fp32 with GQA)
_CHUNK_PATHS = {
    "sm90": ("bwd_chunk", 11, KERNEL_TWINS),
    "sm100": ("bwd_intra", 11, {**{n: f for n, f in KERNEL_TWINS.items() if n != "bwd_chunk"}, **SM100_TWINS}),
}


@pytest.mark.parametrize("path", list(_CHUNK_PATHS))
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_backward_host_with_kernel_twins(case, path, monkeypatch):
    want, args = problem(case)
    seen = {}
    last, i_dq, twins = _CHUNK_PATHS[path]

    def chunk(*a):  # the dq, dk buffers: q's dtype without GQA, fp32 (group-summed) with it
        seen["dq"], seen["dk"] = a[i_dq].dtype, a[i_dq + 1].dtype
        return twins[last](*a)

    got = run_twins(args, monkeypatch, {**twins, last: chunk})
    dqk = torch.bfloat16 if case.h_qk == case.h_v or path == "sm90" else torch.float32
    assert seen == {"dq": dqk, "dk": dqk}
    assert (got["dh0"] is None) == (not case.h0)
    assert got["dq"].dtype == got["dk"].dtype == got["dv"].dtype == torch.bfloat16
    assert got["dg"].dtype == torch.float32 and got["dbeta"].dtype == args["beta"].dtype
    errs = {n: rel_l2(got[n], want[n]) for n in NAMES if got[n] is not None}
    bad = {n: e for n, e in errs.items() if not e <= TOL}
    assert not bad, f"relative L2 over {TOL}: {bad} (all: {errs})"
    if case.h0:
        assert got["dh0"].shape == args["initial_state"].shape and got["dh0"].is_contiguous()
    if case.cu_seqlens is not None:
        end = case.cu_seqlens[-1]
        for n in ("dq", "dk", "dv", "dbeta", "dg"):
            assert (got[n].flatten(0, 1)[end:] == 0).all(), f"{n} not zero on the padding tail"


LANE_CASES = [c for c in CASES if c.cu_seqlens is not None] + [
    Case(T=400, h_qk=1, h_v=2, cu_seqlens=(0, 40, 300, 330, 390), h0=True, gate="qwen", seed=4),  # longest inside
]


@pytest.mark.parametrize("case", LANE_CASES, ids=[c.id for c in LANE_CASES])
def test_lanes_give_the_same_gradients(case, monkeypatch):
    """The backward's lanes (backward_lanes forced on: the longest chain's run of sequences, then the runs before
    and after it, each with its own recurrences and bwd_chunk over its chunk rows) give the one-launch gradients bit
    for bit, and bwd_chunk runs once per lane over exactly the lane's chunk rows, which together are every real
    chunk once."""
    _, args = problem(case)
    ref = run_twins(args, monkeypatch)
    rows = []

    def chunk(*a):
        rows.append(a[10].clone())  # chunk_bounds of the launch
        return KERNEL_TWINS["bwd_chunk"](*a)

    bounds = list(zip(case.cu_seqlens, case.cu_seqlens[1:]))
    monkeypatch.setenv("QLABENCH_BWD_LANES", "on")
    lanes, bv = backward.backward_lanes([-(-(e - b) // 64) for b, e in bounds], case.h_v, (64,), 132)
    assert lanes is not None and len(lanes) >= 2 and bv == 64
    got = run_twins(args, monkeypatch, {**KERNEL_TWINS, "bwd_chunk": chunk}, lanes=lanes)
    assert len(rows) == len(lanes)
    seen = sorted(tuple(r) for x in rows for r in x.tolist() if r[1] > r[0])
    assert seen == sorted((t, min(t + 64, e)) for b, e in bounds for t in range(b, e, 64))
    for n in NAMES:
        assert (got[n] is None) == (ref[n] is None)
        if got[n] is not None:
            assert torch.equal(got[n], ref[n]), n


def test_backward_lanes_rule(monkeypatch):
    """The runs: the longest chain's sequence (the first of equals), then the runs before and after it; none with
    one sequence. auto: at the first tile (the model's, then wider ones) where the longest chain's two recurrences
    (2 h_v V / BV blocks) leave half the SMs; QLABENCH_BWD_LANES on / off forces them at the first tile or off; a
    bad switch value is a ValueError naming it."""
    lanes = backward.backward_lanes
    monkeypatch.delenv("QLABENCH_BWD_LANES", raising=False)
    assert lanes([2, 5, 2], 16, (64,), 132) == (((1, 2), (0, 1), (2, 3)), 64)  # 64 blocks of 132
    assert lanes([5, 2], 16, (64,), 132) == (((0, 1), (1, 2)), 64)
    assert lanes([1, 1, 1], 4, (32, 64), 132) == (((0, 1), (1, 3)), 32)
    assert lanes([5, 2], 16, (32, 64), 132) == (((0, 1), (1, 2)), 64)  # 128 blocks at 32: lanes at 64 instead
    assert lanes([5, 2], 16, (32,), 132) == (None, 32)  # the tile forced (QLABENCH_BWD_BV)
    assert lanes([5, 2], 32, (64,), 132) == (None, 64)
    assert lanes([5], 4, (32, 64), 132) == (None, 32)
    assert lanes([], 4, (32, 64), 132) == (None, 32)
    monkeypatch.setenv("QLABENCH_BWD_LANES", "on")
    assert lanes([5, 2], 32, (64,), 132) == (((0, 1), (1, 2)), 64)
    assert lanes([5, 2], 16, (32, 64), 132) == (((0, 1), (1, 2)), 32)
    assert lanes([5], 4, (32,), 132) == (None, 32)
    monkeypatch.setenv("QLABENCH_BWD_LANES", "off")
    assert lanes([2, 5, 2], 16, (64,), 132) == (None, 64)
    monkeypatch.setenv("QLABENCH_BWD_LANES", "maybe")
    with pytest.raises(ValueError, match="QLABENCH_BWD_LANES.*'maybe'"):
        lanes([5, 2], 16, (64,), 132)


@pytest.mark.parametrize("host_bounds", [True, False], ids=["tokens_end", "device-mask"])
def test_padding_tail_zeroed(host_bounds, monkeypatch):
    """The padding tail after cu_seqlens[-1] is zero in every token-indexed gradient (NaN before the
    kernels run): by a slice memset with the host bounds, by a device mask without them."""
    case = Case(T=300, h_qk=1, h_v=1, cu_seqlens=(0, 100, 230), seed=3)  # tail of 70 tokens
    want, args = problem(case)
    got = run_twins(args, monkeypatch, host_bounds=host_bounds)
    for n in ("dq", "dk", "dv", "dbeta", "dg"):
        tail = got[n].flatten(0, 1)[230:]
        assert tail.numel() and (tail == 0).all(), f"{n} not zero on the padding tail"
        assert rel_l2(got[n], want[n]) <= TOL, n


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_kernels_pick_the_intra_output_dtype(arch, monkeypatch):
    """sm100: _kernels compiles bwd_intra with dq, dk in the inputs' dtype when H_v == H_qk (what
    _bwd_impl allocates then) and in fp32 for GQA. sm90: bwd_chunk always stores them in the inputs'
    dtype (it sums GQA groups itself) and has no variant. No compile here (the factories are recorded)."""
    calls = {}

    def factory(a, role):
        def make(*args, **kw):
            calls[role] = (args, kw)
            return role
        return make

    monkeypatch.setattr(backward, "kernel_factory", factory)
    for h_qk, h_v, dtype, want in ((4, 4, "bfloat16", "bfloat16"), (2, 2, "float16", "float16"),
                                   (2, 4, "bfloat16", "float32"), (1, 8, "float16", "float32")):
        backward._kernels(h_qk, h_v, dtype, arch)
        if arch == "sm90":
            assert calls["bwd_chunk"] == ((h_qk, h_v, 128, 128, 64, dtype, arch), {}), calls["bwd_chunk"]
            assert "bwd_state" not in calls and "bwd_intra" not in calls
        else:
            args, kw = calls["bwd_intra"]
            assert args[-1] == arch and kw == {"out_dtype": want}, (h_qk, h_v, dtype, calls["bwd_intra"])
    # the V tile reaches bwd_h and bwd_dh (argument BV after h_qk, h_v, K, V)
    for bv in backward.value_tiles(arch):
        backward._kernels(2, 4, "bfloat16", arch, bv)
        dh = "bwd_dh_ws" if arch == "sm90" else "bwd_dh"  # the default reverse pass
        assert calls["bwd_h"][0][4] == calls[dh][0][4] == bv


def test_value_tile_follows_the_grid():
    """bwd_h / bwd_dh take BV = 32 where the BV = 32 grid (4 blocks per (sequence, v-head) pair) is
    predicted to finish first (value_tile.py), on sm90; sm100's tcgen05 versions only take 64."""
    assert backward.value_tiles("sm90") == (32, 64) and backward.value_tiles("sm100") == (64,)
    # the two recurrences run side by side (streams.py): BV 32 while both grids fit one wave together
    assert backward._value_tile([512], 16, 132, "sm90") == 32  # hk16_hv16 1x32768: 2 x 4 x 16 = 128 blocks
    assert backward._value_tile([512], 17, 132, "sm90") == 64  # 136 blocks at BV 32 would need two waves
    assert backward._value_tile([512], 33, 132, "sm90") == 64  # 2 x 132 blocks at BV 32, 2 x 66 at BV 64
    assert backward._value_tile([512], 64, 132, "sm90") == 64  # hk16_hv64, one sequence
    assert backward._value_tile([512] * 4, 64, 132, "sm90") == 64
    assert backward._value_tile([448, 64], 32, 132, "sm90") == 64  # 28672+4096: 1228 vs 1720 us predicted
    assert backward._value_tile([512], 16, 148, "sm100") == 64
    with pytest.raises(NotImplementedError, match="sm120"):
        backward.value_tiles("sm120")
    with pytest.raises(ValueError, match="bv must be one of"):
        backward._kernels(2, 4, "bfloat16", "sm100", 32)  # refused before any compile
    with pytest.raises(ValueError, match="bv must be one of"):
        backward.compile_backward_kernels(2, 4, target="sm90", bv=128)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="h_v"):
        backward.compile_backward_kernels(2, 0)
    with pytest.raises(ValueError, match="multiple"):
        backward.compile_backward_kernels(3, 4)
    with pytest.raises(TypeError, match="float32"):
        backward.compile_backward_kernels(2, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match="target"):
        backward.compile_backward_kernels(2, 4, target={"kind": "cuda", "arch": "sm_75"})
    with pytest.raises(NotImplementedError, match="no backward kernels for sm120"):
        backward.compile_backward_kernels(2, 4, target="sm120")
    _, args = problem(Case(T=64, h_qk=1, h_v=1))
    with pytest.raises(ValueError, match="CUDA"):
        backward.chunk_gated_delta_rule_bwd(**args)
    with pytest.raises(TypeError, match="g_cumsum must be float32"):
        backward._check_inputs(**{**args, "g_cumsum": args["g_cumsum"].double()}, scale=None, C=64)
    with pytest.raises(ValueError, match="A must have shape"):
        backward._check_inputs(**{**args, "A": args["A"][..., :32]}, scale=None, C=64)


@pytest.mark.parametrize("variant", ["none", "pg"])
def test_forward_masks_replace_what_bwd_prepare_forms(variant, monkeypatch):
    """After the API's own forward, bwd_prepare forms only the masks kkt_solve did not write (sm90: "none" with
    Ag and Pm given, "pg" with Ag alone): the gradients are those of the full prepare, bit for bit, and the given
    masks are read, never written."""
    from qlabench.kernels.forward import KktMasks

    case = Case(T=260, h_qk=2, h_v=4, cu_seqlens=(0, 1, 34, 97, 161, 226, 226, 250), h0=True, seed=5)
    want, args = problem(case)
    staged = {}

    def full(q, k, g, b, A, bounds, Pg, Ag, fac, scale):
        KERNEL_TWINS["bwd_prepare"](q, k, g, b, A, bounds, Pg, Ag, fac, scale)
        staged["Pg"], staged["Ag"] = Pg.clone(), Ag.clone()

    ref = run_twins(args, monkeypatch, {**KERNEL_TWINS, "bwd_prepare": full})
    masks = KktMasks(staged["Ag"].clone(), staged["Pg"].clone() if variant == "none" else None)
    given = (masks.Ag.clone(), None if masks.Pm is None else masks.Pm.clone())

    def partial(q, k, g, b, A, bounds, Pg, Ag, fac, scale):  # writes fac (and Pg for "pg") only
        assert Ag is masks.Ag and (Pg is masks.Pm) == (variant == "none")
        Pg2, Ag2 = torch.full_like(Pg, float("nan")), torch.full_like(Ag, float("nan"))
        KERNEL_TWINS["bwd_prepare"](q, k, g, b, A, bounds, Pg2, Ag2, fac, scale)
        if variant == "pg":
            Pg.copy_(Pg2)

    assert backward._prepare_masks("sm90", masks) == (variant, masks)
    assert backward._prepare_masks("sm100", masks) == ("pg_ag", None)
    monkeypatch.setattr(backward, "_alloc", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype))
    p = validate(args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], None, args["initial_state"],
                 args["cu_seqlens"], args["state_v_first"], for_kernels=True)
    held = (masks.Ag, masks.Pm)
    out = backward._bwd_impl(p, args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], args["A"],
                             args["do"], args["dht"], args["initial_state"], args["cu_seqlens"],
                             args["state_v_first"], 64, {**KERNEL_TWINS, "bwd_prepare": partial}, masks)
    got = dict(zip(NAMES, out))
    def same(a, b):  # bit for bit; rows past the chunks' ends were never written (NaN) in both
        return torch.equal(torch.nan_to_num(a, nan=7.0), torch.nan_to_num(b, nan=7.0))

    assert same(held[0], given[0]) and (given[1] is None or same(held[1], given[1]))
    for n in NAMES:
        assert same(got[n], ref[n]), n
        assert rel_l2(got[n], want[n]) <= TOL, n


def test_bad_masks_raise():
    from qlabench.kernels.forward import KktMasks

    _, args = problem(Case(T=100, h_qk=1, h_v=2))
    p = validate(args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], None, None, None, False,
                 for_kernels=True)
    good = torch.zeros(100, 2, 64, dtype=torch.bfloat16)
    assert backward.check_masks(None, p, torch.bfloat16, good.device, 64) is None
    with pytest.raises(TypeError, match="KktMasks"):
        backward.check_masks((good, good), p, torch.bfloat16, good.device, 64)
    with pytest.raises(ValueError, match=r"masks.Pm must be a contiguous \(100, 2, 64\)"):
        backward.check_masks(KktMasks(good, good[:50]), p, torch.bfloat16, good.device, 64)
    with pytest.raises(ValueError, match="masks.Ag"):
        backward.check_masks(KktMasks(good.float(), None), p, torch.bfloat16, good.device, 64)
