"""hopper/kkt_solve_grouped (kkt_solve with one block per chunk and qk-head, looping over the GQA
group's v-heads) compiles for sm_90a on a machine without a GPU, and its generated source has the
structure its header promises: the two products once on wgmma before the loops, the tf32 merge
inside, a block barrier at the top of every v-head iteration (v-head g + 1 rewrites b_s, gam_s, L_s,
X_s that v-head g's last step read) and after each beta / gam load, shared memory as kkt_solve's,
no local memory (cuobjdump -res-usage, where installed). One kernel per compile (~20 s on two cores).

GPU (not yet run): ``test_grouped_matches_kkt_solve`` runs both kernels on the same inputs made by the
forward's own preprocessing into NaN-filled outputs and diffs A, Ag, Pm; ``test_forward_grouped``
runs the whole forward with QLABENCH_KKT=grouped against the float64 reference.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .compiled_source import SMEM_PER_BLOCK, dynamic_shared_memory

D, C = 128, 64
SMEM_PER_SM = 233472  # 228 KB per SM on the H200; each resident block also reserves 1 KB
SMEM_KKT_SOLVE = 37376  # hopper/kkt_solve.py as compiled for sm_90a (TileLang 0.1.15)


def _resource_usage(cache: Path) -> list[dict[str, int]] | None:
    """cuobjdump -res-usage of every cubin under a TileLang cache directory (REG, STACK, LOCAL, ...);
    None without cuobjdump or without cubins (kernel served from TileLang's in-memory cache)."""
    from .test_aot_blackwell import _cuobjdump

    tool = _cuobjdump()
    cubins = list(cache.rglob("*.cubin"))
    if tool is None or not cubins:
        return None
    out = []
    for cubin in cubins:
        text = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True,
                              timeout=120).stdout
        for line in re.findall(r"REG:\d+.*", text):
            out.append({k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line)})
    return out


def _loop_bodies(src: str, n: int) -> list[list[str]]:
    """The lines of each top-level ``for (int g... < n; ...)`` loop body of the v-heads."""
    lines = [ln.strip() for ln in src.splitlines()]
    bodies = []
    for i, ln in enumerate(lines):
        if re.fullmatch(rf"for \(int g(_\d+)? = 0; g(_\d+)? < {n}; \+\+g(_\d+)?\) {{", ln):
            depth, body = 1, []
            for ln2 in lines[i + 1:]:
                depth += ln2.count("{") - ln2.count("}")
                if depth == 0:
                    break
                body.append(ln2)
            bodies.append(body)
    return bodies


# one configuration in the default run (CI: the kernel builds); the rest behind `-m slow`
@pytest.mark.parametrize("HK,HV,split,kkt_shared", [
    pytest.param(2, 8, 1, True, id="hk2_hv8"),
    pytest.param(16, 64, 1, True, id="hk16_hv64", marks=pytest.mark.slow),
    pytest.param(4, 8, 1, True, id="hk4_hv8", marks=pytest.mark.slow),
    pytest.param(2, 8, 2, True, id="hk2_hv8-split2", marks=pytest.mark.slow),
    pytest.param(2, 8, 1, False, id="hk2_hv8-kkt_reg", marks=pytest.mark.slow),
])
def test_kkt_solve_grouped_compiles_sm90a(HK, HV, split, kkt_shared, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(cache))
    from qlabench.kernels.hopper.kkt_solve_grouped import kkt_solve_grouped_kernel

    kernel = kkt_solve_grouped_kernel(HK, HV, D, C, "bfloat16", "sm90", split, kkt_shared)
    src = kernel.get_kernel_source()
    per_block = HV // HK // split

    assert "__launch_bounds__(128, 1)" in src
    # K K^T and Q K^T: one wgmma loop each (64 x 64 x 16 steps over K = 128), before the v-head loops
    assert len(re.findall(r"tl::wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, "
                          r"tl::DataType::kFloat32, 64, 64, 16,", src)) == 2
    bodies = _loop_bodies(src, per_block)
    assert len(bodies) == 2, "expected the Pm loop and the inverse loop over the v-heads"
    assert not any("wgmma" in ln for body in bodies for ln in body), "a product of the group recomputed per v-head"
    first_loop = src.index(f"< {per_block}; ++g")
    assert src.rindex("tl::wgmma_ss<", 0, first_loop) < first_loop
    # the 32 -> 64 merge (tf32 mma.sync) runs per v-head in the second loop
    assert sum("tl::mma_sync<tl::DataType::kTensorFloat32" in ln for ln in bodies[1]) == 4
    for body in bodies:
        # a barrier opens every iteration (the previous v-head's reads of b_s / gam_s / L_s / X_s; at
        # g = 0 the products' reads of K_s, Q_s, which L_s and X_s overlap) ...
        first = next(ln for ln in body if not ln.startswith("#pragma"))
        assert first == "__syncthreads();", body[:3]
        # ... and one follows the beta / gam load, before anything reads them
        k = next(i for i, ln in enumerate(body) if "((float*)gam_s)[((int)threadIdx.x)] = " in ln)
        rest = body[k + 1:]
        assert rest[:2] == ["}", "__syncthreads();"], rest[:3]
    # Pm in the first loop only; A, Ag in the second only (16-byte row stores from the stage tiles)
    def stores(body, out):
        return any(ln.startswith(f"*(uint4*)({out} + ") for ln in body)

    assert stores(bodies[0], "Pm") and not stores(bodies[1], "Pm")
    assert stores(bodies[1], "A") and stores(bodies[1], "Ag")
    # beta / gam / outputs of v-head h = hk * group + (y % split) * per_block + g
    group = HV // HK
    assert "blockIdx.y" in src and f"g < {per_block}" in src
    if split == 1:
        assert f"(((int64_t)((int)blockIdx.y)) * (int64_t){group})" in src

    smem = dynamic_shared_memory(kernel)
    assert smem <= SMEM_PER_BLOCK
    # kkt_solve's, K K^T in fp32 (16 KB, kkt_shared) and the three bf16 stage tiles of the row stores
    # (24 KB; kkt_solve overlaps them with dead buffers, the v-head loops here keep fewer dead): 3 blocks
    # per SM
    assert smem <= SMEM_KKT_SOLVE + (4 * C * C if kkt_shared else 0) + 6 * C * C, smem
    assert 3 * (smem + 1024) <= SMEM_PER_SM, smem

    usage = _resource_usage(cache)
    if usage is None:
        pytest.skip("no cuobjdump or no cubin in the cache directory: local memory not checked")
    assert len(usage) == 1, usage
    u = usage[0]
    assert u["LOCAL"] == 0 and u["STACK"] == 0, u
    # registers per thread for 4 (kkt_shared) / 3 (K K^T in a fragment) blocks of 128 threads per SM
    assert u["REG"] <= (128 if kkt_shared else 168), u


def test_kkt_role(monkeypatch):
    """QLABENCH_KKT=grouped picks kkt_solve_grouped for GQA on sm90 only; default and group 1 keep
    kkt_solve; another value raises ValueError. The factory comes from the sm90 table."""
    from qlabench.kernels.dispatch import kernel_factory
    from qlabench.kernels.forward import kkt_group_split, kkt_role

    monkeypatch.delenv("QLABENCH_KKT", raising=False)
    assert kkt_role("sm90", 4) == "kkt_solve"
    monkeypatch.setenv("QLABENCH_KKT", "default")
    assert kkt_role("sm90", 4) == "kkt_solve"
    monkeypatch.setenv("QLABENCH_KKT", "grouped")
    assert kkt_role("sm90", 4) == "kkt_solve_grouped"
    assert kkt_role("sm90", 2) == "kkt_solve_grouped"
    assert kkt_role("sm90", 1) == "kkt_solve"
    assert kkt_role("sm100", 4) == "kkt_solve"
    assert kkt_role("sm120", 4) == "kkt_solve"
    f = kernel_factory("sm90", "kkt_solve_grouped")
    assert f.__module__ == "qlabench.kernels.hopper.kkt_solve_grouped"
    with pytest.raises(ValueError, match="'kkt_solve_grouped'"):
        kernel_factory("sm100", "kkt_solve_grouped")
    monkeypatch.setenv("QLABENCH_KKT", "shared")
    with pytest.raises(ValueError, match="'shared'"):
        kkt_role("sm90", 4)
    assert kkt_group_split(64, 132, 4) == 2 and kkt_group_split(8192, 132, 4) == 1
    assert kkt_group_split(64, 132, 2) == 1 and kkt_group_split(64, 132, 3) == 1


def test_factory_rejects_bad_split():
    from qlabench.kernels.hopper.kkt_solve_grouped import kkt_solve_grouped_kernel

    with pytest.raises(ValueError, match="split"):
        kkt_solve_grouped_kernel(2, 6, D, C, "bfloat16", "sm90", 2)
    with pytest.raises(ValueError, match="chunk sizes"):
        kkt_solve_grouped_kernel(2, 8, D, 48, "bfloat16", "sm90")


# ------------------------------------------------------------------------------------------------
# GPU (not yet run)

TOL_AB = 1e-3


def _kkt_inputs(inp, arch):
    """The forward's own preprocessing (forward.chunk_gated_delta_rule_fwd): flattened q, k, fp32 g,
    beta, the chunk table and the in-chunk cumsum of g."""
    import torch

    from qlabench.kernels.common.chunks import chunk_table
    from qlabench.kernels.common.cumsum import chunk_local_cumsum
    from qlabench.kernels.validate import validate

    q, k, v, g, beta = (inp[n] for n in ("q", "k", "v", "g", "beta"))
    cu = inp.get("cu_seqlens")
    p = validate(q, k, v, g, beta, None, None, cu, False, for_kernels=True)
    BT = p.B * p.T
    q2 = q.reshape(BT, p.h_qk, p.K).contiguous()
    k2 = k.reshape(BT, p.h_qk, p.K).contiguous()
    g2 = g.reshape(BT, p.h_v).to(torch.float32).contiguous()
    beta2 = beta.reshape(BT, p.h_v).to(torch.float32).contiguous()
    table = chunk_table(cu, p.seq_bounds, p.B, p.T, C, q.device)
    g_cumsum = chunk_local_cumsum(g2, table, C, arch)
    return p, q2, k2, g_cumsum, beta2, table


@pytest.mark.gpu
@pytest.mark.parametrize("kkt_shared", [True, False], ids=["kkt_smem", "kkt_reg"])
@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("h_qk,h_v", [(2, 8), (4, 16)], ids=["H2-HV8", "H4-HV16"])
@pytest.mark.parametrize("case", ["varlen", "dense"])
def test_grouped_matches_kkt_solve(case, h_qk, h_v, split, kkt_shared):
    """kkt_solve and kkt_solve_grouped on the same inputs into NaN-filled A, Ag, Pm. varlen: cu = [0,
    100, 229, 1000] in T = 1037 (partial last chunks, one ending mid-chunk before the next sequence,
    a 37-token padding tail whose q, k, beta, g_cumsum rows are NaN: the masked loads must not let
    them in); dense: T = 4096; qwen gates. Checks: the same elements written (NaN pattern equal),
    every row of a sequence written, relative L2 <= 1e-3 per output (both store the same fp32 values
    rounded to bf16: the products' summation order is the same wgmma; equal up to ties)."""
    import torch

    from qlabench.kernels.hopper.kkt_solve import kkt_solve_kernel
    from qlabench.kernels.hopper.kkt_solve_grouped import kkt_solve_grouped_kernel

    from .gdn_inputs import make_inputs, rel_l2

    if case == "varlen":
        cu, T = [0, 100, 229, 1000], 1037
        inp = make_inputs(T, h_qk, h_v, cu_seqlens=cu, gate="qwen", seed=1)
    else:
        cu, T = None, 4096
        inp = make_inputs(T, h_qk, h_v, gate="qwen", seed=2)
    end = T if cu is None else cu[-1]
    p, q2, k2, g_cumsum, beta2, table = _kkt_inputs(inp, "sm90")
    for x in (q2, k2, g_cumsum, beta2):
        x[end:] = float("nan")
    scale = p.scale
    outs = {}
    for name, kernel in (("plain", kkt_solve_kernel(h_qk, h_v, D, C, "bfloat16", "sm90")),
                         ("grouped", kkt_solve_grouped_kernel(h_qk, h_v, D, C, "bfloat16", "sm90", split,
                                                                        kkt_shared))):
        A, Ag, Pm = (torch.full((T, h_v, C), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(3))
        kernel(q2, k2, g_cumsum, beta2, table.chunk_bounds, A, Ag, Pm, scale)
        torch.cuda.synchronize()
        outs[name] = {"A": A, "Ag": Ag, "Pm": Pm}
    errs = {}
    for key in ("A", "Ag", "Pm"):
        ref, got = outs["plain"][key], outs["grouped"][key]
        assert torch.equal(torch.isnan(ref), torch.isnan(got)), f"{key}: kkt_solve_grouped writes other elements"
        assert not torch.isnan(got[:end]).any(), f"{key}: rows of a sequence not written"
        assert torch.isnan(got[end:]).all(), f"{key}: padding tail written"
        errs[key] = rel_l2(got[:end], ref[:end])
    bad = {n: e for n, e in errs.items() if not e <= TOL_AB}
    assert not bad, f"kkt_solve_grouped vs kkt_solve rel-L2 over {TOL_AB}: {bad} (all: {errs})"


@pytest.mark.gpu
def test_forward_grouped(monkeypatch):
    """The whole forward with QLABENCH_KKT=grouped against the float64 reference (o, final state, h,
    g_cumsum, A: relative L2 <= 0.02, as test_forward_gpu) at one GQA case with varlen, partial
    chunks, an empty sequence, a padding tail and h0; the forward really took the grouped kernel."""
    from qlabench.kernels import forward

    from .gdn_inputs import make_inputs
    from .test_forward_gpu import _check_forward

    monkeypatch.setenv("QLABENCH_KKT", "grouped")
    monkeypatch.delenv("QLABENCH_CP", raising=False)  # the CP forward keeps kkt_solve
    assert forward.kkt_role("sm90", 4) == "kkt_solve_grouped"
    roles = []
    factory = forward.kernel_factory

    def spy(arch, role):
        roles.append(role)
        return factory(arch, role)

    monkeypatch.setattr(forward, "kernel_factory", spy)
    cu = [0, 100, 100, 229, 1000, 2497]
    _check_forward(make_inputs(2600, 2, 8, cu_seqlens=cu, gate="qwen", h0=True), 2600)
    assert "kkt_solve_grouped" in roles and "kkt_solve" not in roles, roles
