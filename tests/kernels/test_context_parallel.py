"""Inter-card context parallelism equals the whole-sequence computation, forward and backward.

CPU: each configuration spawns its ranks once (gloo, one process per rank, float64 reference per
rank); the workers run every case of the configuration and save their slices of o, the final state
and the six gradients of a random linear functional of (o, final state). The parent compares the
assembled results with the single-process float64 reference on the whole sequence.

GPU (``gpu`` marker, >= 2 GPUs, NCCL): 131072 tokens split 2 and 4 ways on our kernels against the
single-GPU kernels, relative L2 <= 0.02.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from qlabench.kernels.context_parallel import CPContext, chunk_gated_delta_rule_cp, plan_truncation
from qlabench.kernels.reference import chunk_gated_delta_rule_ref

F64 = torch.float64
GRAD_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
# The chain S_in(r+1) = S_loc(r) + M(r) S_in(r) sums in another order than one pass: rounding only.
TOL = 1e-10


@dataclass(frozen=True)
class Case:
    lengths: tuple[int, ...]
    B: int = 1
    h_qk: int = 2
    h_v: int = 4
    K: int = 16
    V: int = 16
    C: int = 32
    h0: bool = False
    state_v_first: bool = False
    l2norm: bool = False
    gate: str = "mixed"  # per head: g = 0, strong (down to -20/token), logsigmoid, slow
    decay_threshold: float | None = None
    seed: int = 0

    @property
    def id(self) -> str:
        parts = [f"P{len(self.lengths)}", "-".join(map(str, self.lengths)), f"B{self.B}",
                 f"H{self.h_qk}", f"HV{self.h_v}", f"K{self.K}", f"V{self.V}", f"C{self.C}", self.gate]
        parts += [name for name, on in (("h0", self.h0), ("vfirst", self.state_v_first),
                                         ("l2norm", self.l2norm)) if on]
        if self.decay_threshold is not None:
            parts.append(f"trunc{self.decay_threshold:g}")
        return "-".join(parts)


def make_inputs(case: Case):
    """Whole-sequence float64 inputs and loss weights, identical in every process (seeded)."""
    gen = torch.Generator().manual_seed(case.seed)
    T = sum(case.lengths)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    q, k = randn(case.B, T, case.h_qk, case.K), randn(case.B, T, case.h_qk, case.K)
    if not case.l2norm:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = randn(case.B, T, case.h_v, case.V)
    u = torch.rand(case.B, T, case.h_v, generator=gen, dtype=F64)
    if case.gate == "mixed":
        profiles = (lambda h: torch.zeros_like(u[..., h]),              # no decay
                    lambda h: -20.0 * u[..., h],                        # strong, down to -20/token
                    lambda h: F.logsigmoid(randn(case.B, T)),
                    lambda h: F.logsigmoid(randn(case.B, T)) / 16)      # slow
        g = torch.stack([profiles[h % 4](h) for h in range(case.h_v)], -1)
    elif case.gate == "decay":
        g = -(0.5 + 2.5 * u)
    else:
        raise ValueError(case.gate)
    beta = torch.rand(case.B, T, case.h_v, generator=gen, dtype=F64)
    state = (case.B, case.h_v, case.V, case.K) if case.state_v_first else (case.B, case.h_v, case.K, case.V)
    h0 = randn(*state) if case.h0 else None
    w_o, w_f = randn(case.B, T, case.h_v, case.V), randn(*state)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta}, h0, w_o, w_f


def reference_result(case: Case):
    """o, final state and the six gradients of <o, w_o> + <final, w_f> on the whole sequence."""
    x, h0, w_o, w_f = make_inputs(case)
    leaves = {name: t.clone().requires_grad_() for name, t in x.items()}
    h0 = h0.clone().requires_grad_() if h0 is not None else None
    o, final = chunk_gated_delta_rule_ref(**leaves, initial_state=h0, output_final_state=True,
                                          state_v_first=case.state_v_first,
                                          use_qk_l2norm_in_kernel=case.l2norm, chunk_size=case.C)
    wrt = list(leaves.values()) + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad((o * w_o).sum() + (final * w_f).sum(), wrt)
    out = {"o": o.detach(), "final": final.detach()}
    out.update(dict(zip(GRAD_NAMES, grads)))
    return out


def run_rank(case: Case, ctx: CPContext):
    """This rank's slice of the case through chunk_gated_delta_rule_cp, with its gradients."""
    x, h0, w_o, w_f = make_inputs(case)
    t0, t1 = ctx.token_range(sum(case.lengths) // ctx.world_size)
    leaves = {name: t[:, t0:t1].clone().requires_grad_() for name, t in x.items()}
    h0 = h0.clone().requires_grad_() if (h0 is not None and ctx.rank == 0) else None
    o, final = chunk_gated_delta_rule_cp(**leaves, initial_state=h0, output_final_state=True,
                                         cp_context=ctx, impl="reference",
                                         use_qk_l2norm_in_kernel=case.l2norm,
                                         state_v_first=case.state_v_first,
                                         decay_threshold=case.decay_threshold, chunk_size=case.C)
    loss = (o * w_o[:, t0:t1]).sum()
    if final is not None:
        loss = loss + (final * w_f).sum()
    loss.backward()
    out = {"o": o.detach(), "final": None if final is None else final.detach()}
    out.update({f"d{name}": t.grad for name, t in leaves.items()})
    out["dh0"] = None if h0 is None else h0.grad
    return out


def _cpu_worker(rank: int, world: int, init_file: str, out_dir: str, cases: list[Case]):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    try:
        ctx = CPContext(lengths=cases[0].lengths)
        results = [run_rank(case, ctx) for case in cases]
        errors = []
        if rank == world - 1:  # raises before any collective, so no other rank waits on it
            x, _, _, _ = make_inputs(cases[0])
            h0 = torch.zeros(cases[0].B, cases[0].h_v, cases[0].K, cases[0].V, dtype=F64)
            try:
                t0, t1 = ctx.token_range()
                chunk_gated_delta_rule_cp(*(t[:, t0:t1] for t in x.values()), initial_state=h0,
                                          cp_context=ctx)
            except ValueError as exc:
                errors.append(str(exc))
        torch.save({"results": results, "errors": errors}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


CONFIGS = {  # lengths per rank -> the other fields of each case
    (128, 128): [{}, {"h0": True}, {"h0": True, "state_v_first": True, "l2norm": True},
                 {"B": 2, "h0": True, "h_qk": 4, "seed": 3}],
    (64, 64, 64, 64): [{}, {"h0": True, "seed": 1}, {"B": 2, "h0": True, "h_v": 8, "seed": 2}],
    (100, 37, 119, 64): [{}, {"h0": True, "seed": 4},
                         {"h0": True, "gate": "decay", "decay_threshold": -25.0, "seed": 5},
                         {"h0": True, "decay_threshold": -25.0, "seed": 6}],
}
CASES = [Case(lengths=lengths, **kw) for lengths, kws in CONFIGS.items() for kw in kws]


@pytest.fixture(scope="module")
def cp_runs(tmp_path_factory):
    """Spawns each configuration's ranks once; {lengths: {"results": [per case][per rank], "errors"}}."""
    runs = {}
    for lengths in CONFIGS:
        cases = [c for c in CASES if c.lengths == lengths]
        d = tmp_path_factory.mktemp("cp" + "-".join(map(str, lengths)))
        mp.spawn(_cpu_worker, args=(len(lengths), str(d / "init"), str(d), cases), nprocs=len(lengths),
                 join=True)
        per_rank = [torch.load(d / f"rank{r}.pt", weights_only=False) for r in range(len(lengths))]
        runs[lengths] = {
            "results": [[pr["results"][i] for pr in per_rank] for i in range(len(cases))],
            "errors": per_rank[-1]["errors"],
            "cases": cases,
        }
    return runs


def _assemble(per_rank: list[dict]) -> dict:
    out = {name: torch.cat([r[name] for r in per_rank], 1) for name in ("o", "dq", "dk", "dv", "dg", "dbeta")}
    out["final"] = per_rank[-1]["final"]
    out["dh0"] = per_rank[0]["dh0"]
    return out


def _max_rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cp_matches_whole_sequence(case, cp_runs):
    run = cp_runs[case.lengths]
    per_rank = run["results"][run["cases"].index(case)]
    for r, res in enumerate(per_rank):
        assert (res["final"] is None) == (r != len(case.lengths) - 1), f"final state on rank {r}"
        assert (res["dh0"] is None) == (r != 0 or not case.h0), f"dh0 on rank {r}"
    got, ref = _assemble(per_rank), reference_result(case)
    names = ("o", "final") + GRAD_NAMES if case.h0 else ("o", "final") + GRAD_NAMES[:-1]
    for name in names:
        assert got[name].shape == ref[name].shape, name
        err = _max_rel(got[name], ref[name])
        assert err <= TOL, f"{name}: max|cp - ref| / max|ref| = {err:.3e}"


def test_initial_state_off_rank0_is_rejected(cp_runs):
    for run in cp_runs.values():
        assert len(run["errors"]) == 1 and "rank 0" in run["errors"][0], run["errors"]


def test_plan_truncation():
    g = torch.full((1, 100, 2), -1.0)
    # tail sums: sum_{t >= s} g = -(100 - s); the largest multiple of 16 with -(100 - s) < -20 is 64
    assert plan_truncation(g, -20.0, 16) == 64
    assert plan_truncation(g, None, 16) is None
    g[..., 1] = 0.0  # a head that never decays: the whole slice is needed
    assert plan_truncation(g, -20.0, 16) is None
    case = CASES[-2]  # the truncation case: both middle slices truncate, one of them partly
    x, _, _, _ = make_inputs(case)
    starts = [plan_truncation(x["g"][:, a:a + n], case.decay_threshold, case.C)
              for a, n in ((100, 37), (137, 119))]
    assert starts[0] == 0 and starts[1] is not None and starts[1] > 0, starts


@pytest.fixture
def world1(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    yield CPContext()
    dist.destroy_process_group()


def test_world_size_one_is_the_plain_call(world1):
    case = Case(lengths=(96,), h0=True)
    ref = reference_result(case)
    got = _assemble([run_rank(case, world1)])
    for name in ("o", "final") + GRAD_NAMES:
        assert torch.equal(got[name], ref[name]), name


def test_bad_input(world1):
    x, _, _, _ = make_inputs(Case(lengths=(64,)))
    args = tuple(x.values())
    with pytest.raises(TypeError, match="CPContext"):
        chunk_gated_delta_rule_cp(*args, cp_context=None)
    with pytest.raises(ValueError, match="'triton'"):
        chunk_gated_delta_rule_cp(*args, cp_context=world1, impl="triton")
    with pytest.raises(ValueError, match="0.5"):
        chunk_gated_delta_rule_cp(*args, cp_context=world1, decay_threshold=0.5)
    with pytest.raises(ValueError, match="holds 64 tokens"):
        chunk_gated_delta_rule_cp(*args, cp_context=CPContext(lengths=(65,)))
    with pytest.raises(ValueError, match="2 entries"):
        CPContext(lengths=(32, 32))
    with pytest.raises(ValueError, match="at least one token"):
        CPContext(lengths=(0,))
    with pytest.raises(TypeError, match="ints"):
        CPContext(lengths=(64.0,))


def test_context_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        CPContext()


# ---------------------------------------------------------------------------------------------
# Multi-GPU: our kernels, NCCL. Not run on CPU-only machines.

GPU_TOKENS = 131072
GPU_TOL = 0.02


def _gpu_worker(rank: int, world: int, init_file: str):
    from qlabench.kernels import chunk_gated_delta_rule

    from .gdn_inputs import make_inputs as make_gpu_inputs
    from .gdn_inputs import rel_l2

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        dev = f"cuda:{rank}"
        x = make_gpu_inputs(GPU_TOKENS, 2, 4, h0=True, device=dev, seed=0)
        h0 = x.pop("initial_state")
        x.pop("state_v_first")
        gen = torch.Generator().manual_seed(1)
        w_o = torch.randn(1, GPU_TOKENS, 4, 128, generator=gen).to(dev)
        w_f = torch.randn(h0.shape, generator=gen).to(dev)

        def grads_of(xs, h, o, final):
            loss = (o.float() * w_o[:, t0:t1]).sum()
            if final is not None:
                loss = loss + (final * w_f).sum()
            wrt = list(xs.values()) + ([h] if h is not None else [])
            return torch.autograd.grad(loss, wrt)

        t0, t1 = 0, GPU_TOKENS
        xs = {n: t.clone().requires_grad_() for n, t in x.items()}
        h = h0.clone().requires_grad_()
        o_ref, f_ref = chunk_gated_delta_rule(**xs, initial_state=h, output_final_state=True)
        g_ref = grads_of(xs, h, o_ref, f_ref)

        ctx = CPContext()
        L = GPU_TOKENS // world
        t0, t1 = ctx.token_range(L)
        xs = {n: t[:, t0:t1].clone().requires_grad_() for n, t in x.items()}
        h = h0.clone().requires_grad_() if rank == 0 else None
        o, final = chunk_gated_delta_rule_cp(**xs, initial_state=h, output_final_state=True,
                                             cp_context=ctx, impl="kernels")
        grads = grads_of(xs, h, o, final)
        checks = {"o": (o, o_ref[:, t0:t1])}
        for name, got, want in zip(GRAD_NAMES, grads, g_ref):
            checks[name] = (got, want if name == "dh0" else want[:, t0:t1])
        if rank == world - 1:
            checks["final"] = (final, f_ref)
        for name, (got, want) in checks.items():
            err = rel_l2(got, want)
            assert err <= GPU_TOL, f"rank {rank} of {world}: {name} rel-L2 {err:.3e}"
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs >= 2 CUDA GPUs")
@pytest.mark.parametrize("world", [2, 4], ids=["P2", "P4"])
def test_cp_kernels_match_single_gpu(world, tmp_path):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, found {torch.cuda.device_count()}")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    mp.spawn(_gpu_worker, args=(world, str(tmp_path / "init")), nprocs=world, join=True)
