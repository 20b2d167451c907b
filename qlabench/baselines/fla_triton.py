"""flash-linear-attention's Triton ``chunk_gated_delta_rule`` (the "FLA" column).

FLA >= 0.6 silently dispatches this op to FlashQLA when flash-qla is installed. The column must be
FLA's own Triton path, so ``FLA_FLASH_QLA=0`` is set before FLA is first imported (the variable is
read by FLA only; no other backend sees it), and ``check_kernels`` verifies from the profiler's
kernel names that no TileLang/FlashQLA kernel ran and that FLA's Triton kernels did.
``import fla.ops.gated_delta_rule`` fails without triton (CPU machines): imported inside
``available()``.
"""

from __future__ import annotations

import os
import sys

from qlabench.envinfo import library_versions
from qlabench.registry import Backend, register

# substrings of kernel names that mean the FlashQLA / TileLang path ran
FOREIGN_KERNELS = ("tilelang", "flash_qla", "flashqla", "fused_gdr", "kkt_solve", "gdr_")
# FLA's own Triton kernels share some of those words (FLA 0.6 runs
# `chunk_gated_delta_rule_fwd_kkt_solve_kernel`, seen on the H200); its names carry this prefix
FLA_PREFIX = "chunk_gated_delta_rule_"
# substrings of FLA Triton kernel names, per phase (any one present is enough)
FLA_KERNELS = {
    "fwd": ("chunk_gated_delta_rule_fwd_kernel_h", "chunk_fwd_kernel_o", "recompute_w_u_fwd",
            "chunk_scaled_dot_kkt_fwd", "chunk_local_cumsum"),
    "bwd": ("chunk_gated_delta_rule_bwd_kernel_dhu", "chunk_bwd_kernel_dqkwg", "chunk_bwd_kernel_dv",
            "prepare_wy_repr_bwd", "chunk_local_cumsum"),
}
FLA_KERNELS["fwdbwd"] = FLA_KERNELS["fwd"] + FLA_KERNELS["bwd"]


def classify_kernels(phase: str, kernel_names) -> tuple[bool, str]:
    """(True, '') when only FLA Triton kernels ran; (False, why) otherwise. Pure: testable on CPU."""
    names = [str(n) for n in kernel_names]
    foreign = sorted({n for n in names if not n.lower().startswith(FLA_PREFIX)
                      and any(s in n.lower() for s in FOREIGN_KERNELS)})
    if foreign:
        return False, f"FLA dispatched to FlashQLA/TileLang kernels: {', '.join(foreign[:5])}"
    expected = FLA_KERNELS.get(phase, FLA_KERNELS["fwdbwd"])
    if not any(s in n for n in names for s in expected):
        shown = ", ".join(sorted(set(names))[:8]) or "(no kernels recorded)"
        return False, f"no FLA Triton kernel seen for {phase} (saw: {shown})"
    return True, ""


@register("fla")
class FlaTriton(Backend):
    description = "flash-linear-attention Triton chunk_gated_delta_rule (FlashQLA dispatch off)"

    _fn = None

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if not ok:
            return ok, why
        preloaded = "fla" in sys.modules and os.environ.get("FLA_FLASH_QLA") != "0"
        os.environ["FLA_FLASH_QLA"] = "0"
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        except Exception as e:  # noqa: BLE001 - ImportError without triton, or anything else at import
            return False, f"import fla.ops.gated_delta_rule failed: {type(e).__name__}: {e}"
        type(self)._fn = staticmethod(chunk_gated_delta_rule)  # a plain attribute would bind self as q
        if preloaded:
            # FLA was imported before the switch was set; the kernel-name check still guards the column
            return True, "warning: fla was imported before FLA_FLASH_QLA=0 was set"
        return True, ""

    def version(self) -> str | None:
        return library_versions().get("fla")

    def forward(self, w):
        if self._fn is None:
            ok, why = self.available("cuda")
            if not ok:
                raise RuntimeError(why)
        return self._fn(
            q=w.q, k=w.k, v=w.v, g=w.g, beta=w.beta, scale=w.scale, initial_state=w.h0,
            output_final_state=True, cu_seqlens=w.cu_seqlens,
        )

    def check_kernels(self, phase: str, kernel_names) -> tuple[bool, str]:
        return classify_kernels(phase, kernel_names)
