"""hopper/bwd_h_ws (the backward's h-only, manually warp-specialized state recompute) compiles for
sm_90a on a machine without a GPU, and its generated source has the structure its header promises:
three products per chunk on wgmma, TMA loads on mbarriers, the register quotas, the named barriers of
the two compute warpgroups, and no block-wide barrier inside the role branches (about 20 s per tile
on two cores). Its values are checked on the GPU by test_backward_gpu.py (bwd_h is every backward's
state recompute on sm90) and test_dg_stress_gpu.py."""

from __future__ import annotations

import re

import pytest

from .compiled_source import SMEM_PER_BLOCK, dynamic_shared_memory

HK, HV, D, C = 2, 4, 128, 64


# BV 64 in the default run (CI: the kernel builds); BV 32 behind `-m slow`
@pytest.mark.parametrize("BV", [pytest.param(32, id="bv32", marks=pytest.mark.slow), pytest.param(64, id="bv64")])
def test_bwd_h_ws_compiles_sm90a(BV, tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "cache"))
    from qlabench.kernels.hopper import bwd_h_ws as ws

    kernel = ws.bwd_h_ws_kernel(HK, HV, D, D, BV, C, "bfloat16", "sm90")
    src = kernel.get_kernel_source()

    assert "__launch_bounds__(384, 1)" in src  # producer + state + transition warpgroups
    assert "q_desc" not in src and "Pm" not in src  # h only: no Q, no output mask, no o
    # per chunk and ring slot (unrolled pair): K S and X^T Y with N = BV, X = A^T K with N = K
    assert len(re.findall(rf"wgmma_ss<[^>]*, 64, {BV}, 16,", src)) == 4
    assert len(re.findall(rf"wgmma_ss<[^>]*, 64, {D}, 16,", src)) == 2
    for desc in ("k_desc", "v_desc", "A_desc"):
        assert src.count(f"tl::tma_load({desc}, full[0]") == 1 and src.count(f"tl::tma_load({desc}, full[1]") == 1
    for slot in (0, 1):  # one chunk of K, V, A per slot
        tx = sum(int(b) for b in re.findall(rf"full\[{slot}\]\.expect_transaction\((\d+)\)", src))
        assert tx == (C * D + C * BV + C * C) * 2, tx
    inits = dict(re.findall(r"(\w+)\[0\]\.init\((\d+)\)", src))
    assert inits == {"full": "128", "empty": "256", "s_ready": "128", "x_ready": "128", "x_free": "128",
                     "h_free": "128"}
    for bar in inits:
        assert f"{bar}[0].wait(" in src and f"{bar}[1].wait(" in src, bar
        assert f"{bar}[0].arrive()" in src and f"{bar}[1].arrive()" in src, bar
    assert src.count("warpgroup_reg_dealloc<40>") == 1 and src.count("warpgroup_reg_alloc<216>") == 2
    # each compute warpgroup's own smem writes fenced and synced before its wgmma reads: 2 per chunk
    # and slot in each of the state (id 1) and transition (id 2) warpgroups
    assert src.count("__sync_thread_partial(1, 128)") == 4
    assert src.count("__sync_thread_partial(2, 128)") == 4
    assert src.count("tl::fence_proxy_async();") >= 8
    assert src.count("__syncthreads()") == 1
    assert src.index("__syncthreads()") < src.index("warpgroup_reg_dealloc")

    smem = dynamic_shared_memory(kernel)
    assert smem == ws.shared_memory_bytes(D, BV, C), smem
    assert smem <= SMEM_PER_BLOCK - 4096
