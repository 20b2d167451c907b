"""Upstream FlashQLA (PyPI ``flash-qla``): its high-level autograd ``chunk_gated_delta_rule``.

``import flash_qla`` raises at import time on a machine without a GPU (ValueError from its arch
detection), so the import happens inside ``available()`` and its failure becomes the reason.
"""

from __future__ import annotations

import contextlib

import torch

from qlabench.envinfo import library_versions
from qlabench.registry import Backend, register


@register("flash_qla")
class FlashQLA(Backend):
    description = "upstream FlashQLA (flash-qla, TileLang), auto CP on"

    _fn = None
    _has_cp_cache_opt = False

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if not ok:
            return ok, why
        try:
            import flash_qla
        except Exception as e:  # noqa: BLE001 - ImportError, or ValueError from its GPU detection
            return False, f"import flash_qla failed: {type(e).__name__}: {e}"
        fn = getattr(flash_qla, "chunk_gated_delta_rule", None)
        if fn is None:
            return False, "flash_qla has no chunk_gated_delta_rule"
        type(self)._fn = staticmethod(fn)  # a plain attribute would bind self as q
        import inspect

        with contextlib.suppress(TypeError, ValueError):
            type(self)._has_cp_cache_opt = "enable_fwd_cp_cache" in inspect.signature(fn).parameters
        return True, ""

    def version(self) -> str | None:
        return library_versions().get("flash_qla")

    def forward(self, w):
        if self._fn is None:
            ok, why = self.available("cuda")
            if not ok:
                raise RuntimeError(why)
        extra = {}
        if self._has_cp_cache_opt and not torch.is_grad_enabled():
            # inference forward (fwd phase): no CP cache for a backward that never comes, as in
            # FlashQLA's own forward benchmark; training (bwd, fwdbwd) keeps the library default
            extra["enable_fwd_cp_cache"] = False
        return self._fn(
            q=w.q, k=w.k, v=w.v, g=w.g, beta=w.beta, scale=w.scale, initial_state=w.h0,
            output_final_state=True, cu_seqlens=w.cu_seqlens, **extra,
        )
