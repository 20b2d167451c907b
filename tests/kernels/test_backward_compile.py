"""The four Hopper backward kernels compile for sm_90a on a machine without a GPU (about 1-2 minutes
on 2 cores with a cold TileLang cache), with wgmma, with the token count left dynamic and with the two
chunk recurrences TMA-pipelined (warp-specialised)."""

from __future__ import annotations

import re

from qlabench.kernels.backward import compile_backward_kernels

SM90A = {"kind": "cuda", "arch": "sm_90a"}


def test_compile_backward_kernels_sm90a():
    kernels = compile_backward_kernels(2, 4, scale=128**-0.5, dtype="bfloat16", state_v_first=False,
                                       target=SM90A)
    assert list(kernels) == ["bwd_prepare", "bwd_h", "bwd_dh", "bwd_chunk"]  # launch order
    for name, kernel in kernels.items():
        src = kernel.get_kernel_source()
        assert "wgmma" in src, f"{name}: no wgmma in the generated CUDA"
        # One kernel for every sequence length: the token count is a runtime argument.
        if name != "bwd_h":  # bwd_h reads tokens only through TMA descriptors (built on the host)
            assert re.search(r"int\s+n_tok", src), f"{name}: token count is not dynamic"
    for name in ("bwd_h", "bwd_dh"):
        src = kernels[name].get_kernel_source()
        assert "tma_load" in src and "warpgroup_reg_alloc" in src, f"{name}: loads are not TMA-pipelined"
    # Same compiled objects for the other layout, scale and the older positional form (lru_cache).
    again = compile_backward_kernels(2, 4, 0.5, "bfloat16", True, "sm90")
    assert all(again[n] is kernels[n] for n in kernels)
    assert compile_backward_kernels(2, 4, "bfloat16", True, SM90A)["bwd_h"] is kernels["bwd_h"]
