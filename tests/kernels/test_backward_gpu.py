"""Our backward kernels against autograd of the float64 reference on the GPU (rel-L2 <= 0.02 per gradient).

Run on an H200:  pytest -q -m gpu tests/kernels/test_backward_gpu.py

Every case draws fresh random inputs, runs our forward (for g_cumsum and A, as training does), then
``chunk_gated_delta_rule_bwd`` with every buffer it allocates filled with NaN first (an element a
kernel should write but does not fails the test; NaN never passes the metric). The reference is
``torch.autograd.grad`` of ``chunk_gated_delta_rule_ref`` in float64 on the same (bf16-rounded)
inputs. ``test_each_kernel_matches_its_twin`` diffs every kernel's outputs against its torch twin in
``emulate_bwd`` fed the kernel's own inputs, which localises a failure to one kernel.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from qlabench.kernels import backward
from qlabench.kernels.reference import chunk_gated_delta_rule_ref

from .gdn_inputs import rel_l2

pytestmark = pytest.mark.gpu
TOL = 0.02
F64 = torch.float64
NAMES = ("dq", "dk", "dv", "dbeta", "dg", "dh0")


def make_inputs(T, h_qk, h_v, *, B=1, cu_seqlens=None, gate="bench", h0=False, dht=True,
                state_v_first=False, D=128):
    """Fresh random inputs on the GPU (q, k l2-normalised; gate profiles as in the forward tests)."""
    dev = "cuda"
    q = F.normalize(torch.randn(B, T, h_qk, D, device=dev), dim=-1).bfloat16()
    k = F.normalize(torch.randn(B, T, h_qk, D, device=dev), dim=-1).bfloat16()
    v = torch.randn(B, T, h_v, D, device=dev).bfloat16()
    beta = torch.sigmoid(torch.randn(B, T, h_v, device=dev))
    if gate == "qwen":  # A_log-style: per-token log-gates down to about -20
        a_h = torch.rand(h_v, device=dev) * 16
        a_h[0], a_h[-1] = 0.0, 16.0
        g = -a_h * F.softplus(0.5 * torch.randn(B, T, h_v, device=dev) + 1.0)
    else:
        g = F.logsigmoid(torch.randn(B, T, h_v, device=dev)) / 16
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    state = (N, h_v, D, D)
    return {
        "q": q, "k": k, "v": v, "g": g.float(), "beta": beta.float(),
        "cu_seqlens": None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32, device=dev),
        "initial_state": torch.randn(state, device=dev) if h0 else None,
        "dht": torch.randn(state, device=dev) if dht else None,
        "state_v_first": state_v_first,
    }


def reference_grads(inp, do):
    """float64 autograd of the chunked reference on the same inputs."""
    leaves = [inp[n].to(F64).requires_grad_(True) for n in ("q", "k", "v", "g", "beta")]
    h0 = inp["initial_state"]
    h0 = None if h0 is None else h0.to(F64).requires_grad_(True)
    o, ht = chunk_gated_delta_rule_ref(*leaves, initial_state=h0, output_final_state=True,
                                       cu_seqlens=inp["cu_seqlens"], state_v_first=inp["state_v_first"])
    loss = (o * do.to(F64)).sum()
    if inp["dht"] is not None:
        loss = loss + (ht * inp["dht"].to(F64)).sum()
    grads = torch.autograd.grad(loss, leaves + ([h0] if h0 is not None else []))
    out = dict(zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads))
    out.setdefault("dh0", None)
    return out


def forward_for_backward(inp):
    from qlabench.kernels.forward import chunk_gated_delta_rule_fwd

    g_cumsum, A, _, _, _ = chunk_gated_delta_rule_fwd(
        inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], initial_state=inp["initial_state"],
        cu_seqlens=inp["cu_seqlens"], output_final_state=True, state_v_first=inp["state_v_first"])
    return g_cumsum, A


@pytest.fixture
def nan_buffers(monkeypatch):
    def nan_alloc(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(backward, "_alloc", nan_alloc)


def check_backward(inp):
    g_cumsum, A = forward_for_backward(inp)
    do = torch.randn(inp["v"].shape, device="cuda").bfloat16()
    got = dict(zip(NAMES, backward.chunk_gated_delta_rule_bwd(
        inp["q"], inp["k"], inp["v"], g_cumsum, inp["beta"], A, do, inp["dht"],
        initial_state=inp["initial_state"], cu_seqlens=inp["cu_seqlens"], state_v_first=inp["state_v_first"])))
    want = reference_grads(inp, do)
    assert (got["dh0"] is None) == (inp["initial_state"] is None)
    errs = {n: rel_l2(got[n], want[n]) for n in NAMES if want[n] is not None}
    if inp["cu_seqlens"] is not None:
        end = int(inp["cu_seqlens"][-1])
        for n in ("dq", "dk", "dv", "dbeta", "dg"):
            tail = got[n].flatten(0, 1)[end:]
            assert torch.all(tail == 0), f"{n} not zero on the padding tail"
    bad = {n: e for n, e in errs.items() if not e <= TOL}
    assert not bad, f"relative L2 over {TOL}: {bad} (all: {errs})"
    return errs


def _varlen(lengths, tail=0):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu, cu[-1] + tail


@pytest.mark.parametrize("h_qk,h_v", [(4, 4), (2, 8), (4, 16)], ids=["H4-HV4", "H2-HV8", "H4-HV16"])
@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_dense_T4096(h_qk, h_v, gate, nan_buffers):
    check_backward(make_inputs(4096, h_qk, h_v, gate=gate))


@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_dense_batch_partial_chunk(gate, nan_buffers):
    check_backward(make_inputs(1000, 2, 4, B=3, gate=gate, h0=True))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_varlen_with_tail(seed, nan_buffers):
    """10 sequences of 1-700 tokens x 8 v-heads (80 (sequence, v-head) pairs; the V tile of bwd_h /
    bwd_dh is the makespan model's, value_tile.py: 32 on the H200 for these lengths)."""
    rng = random.Random(seed)
    lengths = [1, 33, 63, 64, 65] + [rng.randint(1, 700) for _ in range(5)]
    rng.shuffle(lengths)
    cu, T = _varlen(lengths, tail=rng.randint(1, 100))
    check_backward(make_inputs(T, 2, 8, cu_seqlens=cu, gate=rng.choice(["bench", "qwen"]), h0=seed != 1))


def test_varlen_value_tile_64(nan_buffers):
    """8 sequences x 16 v-heads = 128 (sequence, v-head) pairs of up to 11 chunks: the makespan model
    (value_tile.py) takes BV = 64 for bwd_h / bwd_dh on the H200 (512 blocks at BV 32 are four waves,
    256 at BV 64 two), so the end-to-end backward runs that tile too."""
    from qlabench.kernels.forward import _sm_count

    lengths = [700, 650, 600, 640, 690, 512, 300, 65]
    if _sm_count(torch.device("cuda")) == 132:
        assert backward._value_tile([-(-n // 64) for n in lengths], 16, 132, "sm90") == 64
    cu, T = _varlen(lengths, tail=37)
    check_backward(make_inputs(T, 4, 16, cu_seqlens=cu, gate="qwen", h0=True))


@pytest.mark.parametrize("h_qk", [4, 1], ids=["H4-HV4", "H1-HV1"])
def test_varlen_tail_no_gqa(h_qk, nan_buffers):
    """H_v == H_qk (one v-head per block of bwd_chunk): dq, dk stored in bf16 by the kernel, and the
    padding tail of those bf16 buffers is zeroed by the host."""
    cu, T = _varlen([300, 1, 64, 129, 65], tail=37)
    check_backward(make_inputs(T, h_qk, h_qk, cu_seqlens=cu, gate="qwen", h0=True))


@pytest.mark.parametrize("dht", [True, False], ids=["dht", "nodht"])
@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_initial_state_and_layouts(dht, state_v_first, nan_buffers):
    cu, T = _varlen([300, 64, 129], tail=7)
    check_backward(make_inputs(T, 1, 4, cu_seqlens=cu, gate="qwen", h0=True, dht=dht,
                               state_v_first=state_v_first))


def test_strong_decay_long(nan_buffers):
    check_backward(make_inputs(2048, 2, 4, gate="qwen", h0=True))


def autograd_errors(inp, options=None):
    """Relative L2 of every gradient of `chunk_gated_delta_rule` under autograd (``options``: its KernelOptions)
    against the float64 reference's on the same do; asserts each <= TOL."""
    from qlabench.kernels import chunk_gated_delta_rule

    leaves = {n: inp[n].clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta", "initial_state")}
    o, ht = chunk_gated_delta_rule(**leaves, output_final_state=True, cu_seqlens=inp["cu_seqlens"], options=options)
    do = torch.randn_like(o)
    torch.autograd.backward([o, ht], [do, inp["dht"]])
    want = reference_grads(inp, do)
    got = {"dq": leaves["q"].grad, "dk": leaves["k"].grad, "dv": leaves["v"].grad, "dg": leaves["g"].grad,
           "dbeta": leaves["beta"].grad, "dh0": leaves["initial_state"].grad}
    errs = {n: rel_l2(got[n], want[n]) for n in NAMES}
    bad = {n: e for n, e in errs.items() if not e <= TOL}
    assert not bad, f"relative L2 over {TOL}: {bad} (all: {errs})"
    return errs


def test_autograd_path():
    """`chunk_gated_delta_rule` under autograd returns the same gradients as the reference."""
    cu, T = _varlen([200, 65, 1], tail=5)
    autograd_errors(make_inputs(T, 2, 4, cu_seqlens=cu, gate="qwen", h0=True))


# Output argument positions of each kernel and how their rows are indexed ("tok" or "chunk").
_KERNEL_OUTPUTS = {
    "bwd_prepare": {6: "tok", 7: "tok", 8: "chunk"},
    "bwd_h": {8: "chunk"},  # after seq_order (argument 6)
    "bwd_dh": {11: "chunk", 12: "tok", 13: "seq"},  # after chunk_skip (argument 9); dV' only, no dv
    "bwd_chunk": {4: "tok", 11: "tok", 12: "tok", 13: "tok", 14: "tok"},  # 4: dV' in, dv out (in place)
}


@pytest.mark.parametrize("bv", [32, 64], ids=["BV32", "BV64"])
@pytest.mark.parametrize("h_qk,h_v", [(2, 4), (2, 2)], ids=["H2-HV4", "H2-HV2"])
def test_each_kernel_matches_its_twin(h_qk, h_v, bv, monkeypatch):
    """Each compiled kernel vs its torch twin fed the same inputs (bf16 staging in both); H2-HV4 has
    bwd_chunk sum a group of two v-heads, H2-HV2 one; both V tiles of bwd_h / bwd_dh (the API picks
    one by the grid's predicted makespan, backward._value_tile)."""
    from qlabench.kernels.emulate_bwd import KERNEL_TWINS

    cu, T = _varlen([1, 33, 63, 64, 65, 150], tail=9)
    inp = make_inputs(T, h_qk, h_v, cu_seqlens=cu, gate="qwen", h0=True)
    g_cumsum, A = forward_for_backward(inp)
    do = torch.randn(inp["v"].shape, device="cuda").bfloat16()
    real_tokens, real_chunks = cu[-1], sum(-(-n // 64) for n in [1, 33, 63, 64, 65, 150])
    gpu = backward._kernels(h_qk, h_v, "bfloat16", "sm90", bv)
    errs = {}

    def wrap(name):
        def run(*args):
            cpu_args = [a.detach().cpu().clone() if isinstance(a, torch.Tensor) else a for a in args]
            gpu[name](*args)
            torch.cuda.synchronize()
            KERNEL_TWINS[name](*cpu_args)
            for i, rows in _KERNEL_OUTPUTS[name].items():
                n = {"tok": real_tokens, "chunk": real_chunks, "seq": len(cu) - 1}[rows]
                errs[f"{name}[{i}]"] = rel_l2(args[i][:n].cpu(), cpu_args[i][:n])
        return run

    monkeypatch.setattr(backward, "_alloc", lambda shape, dtype, device: torch.full(
        shape, float("nan"), dtype=dtype, device=device))
    backward._bwd_impl(
        backward._check_inputs(inp["q"], inp["k"], inp["v"], g_cumsum, inp["beta"], A, do, inp["dht"], None,
                               inp["initial_state"], inp["cu_seqlens"], False, 64),
        inp["q"], inp["k"], inp["v"], g_cumsum, inp["beta"], A, do, inp["dht"], inp["initial_state"],
        inp["cu_seqlens"], False, 64, {name: wrap(name) for name in gpu})
    bad = {n: e for n, e in errs.items() if not e <= 1e-2}
    assert not bad, f"kernel vs twin rel-L2 over 1e-2: {bad} (all: {errs})"


@pytest.mark.parametrize("h_qk,h_v", [(2, 4), (16, 32)], ids=["H2-HV4", "H16-HV32"])
def test_factors_kernel_matches_the_full_prepare(h_qk, h_v):
    """bwd_prepare's factors-only variant ("none": one block per chunk over every v-head, what the API's backward
    launches after its own forward) stores the full kernel's factor table bit for bit, partial chunks included (their
    rows past the end, the next sequence's or the padding tail's, read clamped or zeroed)."""
    from qlabench.kernels.common.chunks import build_chunk_table

    lengths = [1, 33, 63, 64, 65, 150, 300]
    cu, T = _varlen(lengths, tail=9)
    inp = make_inputs(T, h_qk, h_v, cu_seqlens=cu, gate="qwen")
    g_cumsum, A = forward_for_backward(inp)
    table = build_chunk_table(inp["cu_seqlens"], T, 64)
    args = [inp["q"].reshape(T, h_qk, 128), inp["k"].reshape(T, h_qk, 128), g_cumsum.reshape(T, h_v),
            inp["beta"].reshape(T, h_v), A.reshape(T, h_v, 64), table.chunk_bounds]
    facs = []
    for prepare in ("pg_ag", "none"):
        kernel = backward.compile_backward_kernels(h_qk, h_v, target="sm90", prepare=prepare)["bwd_prepare"]
        Pg, Ag = (torch.zeros(T, h_v, 64, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        fac = torch.full((table.n_chunks_max, h_v, 3, 64), float("nan"), device="cuda")
        kernel(*args, Pg, Ag, fac, 128**-0.5)
        facs.append(fac)
    real = table.chunk_bounds[:, 1] > table.chunk_bounds[:, 0]
    assert real.sum() == sum(-(-n // 64) for n in lengths)
    assert not torch.isnan(facs[0][real]).any()
    assert torch.equal(facs[1][real], facs[0][real])
