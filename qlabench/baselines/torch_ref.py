"""The float64 chunked reference as a backend: runs on CPU and GPU; also the run's oracle."""

from __future__ import annotations

from qlabench.kernels.reference import chunk_gated_delta_rule_ref
from qlabench.registry import Backend, register


@register("torch")
class TorchReference(Backend):
    description = "float64 torch reference (qlabench.kernels.reference), the oracle"
    expects_cuda = False

    def available(self, device: str) -> tuple[bool, str]:
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                return False, "no CUDA GPU visible to torch"
        return True, ""

    def version(self) -> str:
        import torch

        return f"torch {torch.__version__} float64"

    def forward(self, w):
        return chunk_gated_delta_rule_ref(
            w.q, w.k, w.v, w.g, w.beta, scale=w.scale, initial_state=w.h0, output_final_state=True,
            cu_seqlens=w.cu_seqlens,
        )
