"""``qla``: our TileLang kernels (``qlabench.kernels.chunk_gated_delta_rule``), with its kernel variants
(``qla:cp=on+bwd_dh=ws``: the fields of ``qlabench.kernels.KernelOptions``)."""

from __future__ import annotations

import torch

from qlabench.registry import Backend, register
from qlabench.workload import Workload


@register("qla")
class QlaBackend(Backend):
    """Our TileLang kernels (``qlabench.kernels.chunk_gated_delta_rule``); bwd through its autograd."""

    description = "qlabench TileLang kernels (ours); variants qla:key=value+... (qlabench list backends)"

    def __init__(self, options=None):
        from qlabench.kernels.options import KernelOptions

        self.options = KernelOptions() if options is None else options
        self.name = self.name_for(self.options)

    @staticmethod
    def name_for(options) -> str:
        """``qla`` for the default kernels, ``qla:cp=on+bwd_dh=ws`` for a variant."""
        label = options.label()
        return f"qla:{label}" if label else "qla"

    def with_options(self, spec: str) -> QlaBackend:
        from qlabench.kernels.options import parse_options

        return QlaBackend(parse_options(spec, base=self.options))

    def options_record(self) -> dict:
        return self.options.as_dict()

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if not ok:
            return ok, why
        try:
            from qlabench.kernels import kernels_available
        except (ImportError, AttributeError) as e:
            return False, f"kernels not built ({type(e).__name__}: {e})"
        try:
            res = kernels_available(torch.device(device))
        except Exception as e:  # noqa: BLE001 - any failure is a reason to report
            return False, f"kernels_available() failed: {type(e).__name__}: {e}"
        if isinstance(res, tuple):
            return bool(res[0]), str(res[1]) if len(res) > 1 else ""
        return bool(res), "" if res else "kernels_available() returned False"

    def version(self) -> str | None:
        import qlabench

        return qlabench.__version__

    def forward(self, w: Workload):
        from qlabench.kernels import chunk_gated_delta_rule

        return chunk_gated_delta_rule(
            w.q, w.k, w.v, w.g, w.beta, scale=w.scale, initial_state=w.h0, output_final_state=True,
            cu_seqlens=w.cu_seqlens, options=self.options,
        )
