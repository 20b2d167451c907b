"""Shared pieces of the Hopper backward kernels: the compile call and the chunk-shape constants.

The backward kernels keep every state-like tensor (h, dh, h0, dht, dh0) in the `[K, V]` layout; the
host transposes the small per-sequence states for ``state_v_first`` so one compiled kernel serves
both layouts.
"""

from __future__ import annotations

import tilelang

from ..dispatch import arch_by_name

PASS_CONFIGS = {
    tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True,
}


def compile_bwd(prim_func, arch: str):
    """Compiles one backward prim_func for the architecture named ``arch`` (explicit target dict)."""
    return tilelang.compile(prim_func, out_idx=None, target=arch_by_name(arch).target,
                            pass_configs=dict(PASS_CONFIGS))
