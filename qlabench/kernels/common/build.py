"""One place that turns a TileLang prim_func into a compiled kernel for an explicit target."""

from __future__ import annotations

import tilelang

from ..dispatch import arch_by_name

PASS_CONFIGS = {
    tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True,
}


def compile_for(prim_func, arch: str, pass_configs: dict | None = None):
    """Compiles ``prim_func`` for the architecture named ``arch`` (its explicit target dict)."""
    configs = dict(PASS_CONFIGS)
    configs.update(pass_configs or {})
    return tilelang.compile(prim_func, out_idx=None, target=arch_by_name(arch).target, pass_configs=configs)
