"""hopper/chunk_fwd_ws (the manually warp-specialized forward recurrence) compiles for sm_90a on a
machine without a GPU, and its generated source has the structure its header promises: wgmma for all
five products, TMA loads on mbarriers, the register quotas, fences before tensor-core reads of
thread-written tiles, and no block-wide barrier inside the role branches (one kernel per test: about
20 s each on two cores)."""

from __future__ import annotations

import re

import pytest

from .compiled_source import SMEM_PER_BLOCK, dynamic_shared_memory

HK, HV, D, C = 16, 16, 128, 64


# one configuration in the default run (CI: the kernel builds); the rest behind `-m slow`
@pytest.mark.parametrize("BV,state_v_first", [pytest.param(32, False, id="bv32-kv", marks=pytest.mark.slow),
                                              pytest.param(64, False, id="bv64-kv"),
                                              pytest.param(32, True, id="bv32-vk", marks=pytest.mark.slow),
                                              pytest.param(64, True, id="bv64-vk", marks=pytest.mark.slow)])
def test_chunk_fwd_ws_compiles_sm90a(BV, state_v_first, tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("QLABENCH_WS_AUTO_SYNC", raising=False)
    from qlabench.kernels.hopper import chunk_fwd_ws as ws

    kernel = ws.chunk_fwd_ws_kernel(HK, HV, D, D, BV, C, "bfloat16", state_v_first, "sm90")
    src = kernel.get_kernel_source()

    assert "__launch_bounds__(384, 1)" in src  # producer + state + output warpgroups, no extra WG
    # five products per chunk, two ring slots (unrolled pair): 10 wgmma issue sites, N = BV
    assert len(re.findall(rf"wgmma_ss<[^>]*, 64, {BV}, 16,", src)) == 10
    # TMA loads into each slot: the chain's K, V, Ag counted on full[slot], the output's Q, Pm on full_o[slot]
    for desc, bar in (("k_desc", "full"), ("v_desc", "full"), ("Ag_desc", "full"), ("q_desc", "full_o"),
                      ("Pm_desc", "full_o")):
        assert src.count(f"tl::tma_load({desc}, {bar}[0]") == 1 and src.count(f"tl::tma_load({desc}, {bar}[1]") == 1
    # the bytes expected on each barrier are exactly one chunk of K, V, Ag (full) and of Q, Pm (full_o)
    for slot in (0, 1):
        for bar, nbytes in (("full", (C * D + C * BV + C * C) * 2), ("full_o", (C * D + C * C) * 2)):
            tx = sum(int(b) for b in re.findall(rf"\b{bar}\[{slot}\]\.expect_transaction\((\d+)\)", src))
            assert tx == nbytes, (bar, tx)
    # mbarriers with the documented arrive counts
    inits = dict(re.findall(r"(\w+)\[0\]\.init\((\d+)\)", src))
    assert inits == {"full": "128", "full_o": "128", "empty": "256", "s_ready": "128", "vd_ready": "128",
                     "o_free": "128"}
    for bar in inits:
        assert f"{bar}[0].wait(" in src and f"{bar}[1].wait(" in src, bar
        assert f"{bar}[0].arrive()" in src and f"{bar}[1].arrive()" in src, bar
    # register quotas: producer releases, state and output warpgroups take
    assert src.count("warpgroup_reg_dealloc<40>") == 1 and src.count("warpgroup_reg_alloc<216>") == 2
    # thread-written tiles (S_s, W_s, Vd_s / Vr_s) fenced before wgmma reads, 3 per chunk and slot
    assert src.count("__sync_thread_partial(1, 128)") == 6
    # whole chunks' O: staged in shared memory and TMA-stored (bar.sync 2 before and after the staging)
    assert src.count("tl::tma_store(o_desc") == 2 and src.count("__sync_thread_partial(2, 128)") == 4
    assert src.count("tl::fence_proxy_async();") >= 6
    # the only block-wide barrier is the one after the mbarrier init (a __syncthreads in a role
    # branch would deadlock); TileLang's automatic syncs are off
    assert src.count("__syncthreads()") == 1
    assert src.index("__syncthreads()") < src.index("warpgroup_reg_dealloc")
    assert "__sync_thread_partial(3" not in src and "__sync_thread_partial(4" not in src
    assert src.count("tl::tma_store_wait<0, true>()") == 3  # before each staging, and at the end

    smem = dynamic_shared_memory(kernel)
    assert smem == ws.shared_memory_bytes(D, BV, C), smem
    assert smem <= SMEM_PER_BLOCK - 4096
