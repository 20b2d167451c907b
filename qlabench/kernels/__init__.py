"""Gated DeltaNet chunked prefill: public API behind FLA's `chunk_gated_delta_rule` signature."""

from __future__ import annotations

from .validate import validate

__all__ = ["chunk_gated_delta_rule"]


def chunk_gated_delta_rule(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False,
):
    """Gated DeltaNet over packed or dense sequences, on our TileLang kernels.

    Args:
        q, k: `[B, T, H_qk, 128]` bf16/fp16. v: `[B, T, H_v, 128]`, same dtype.
        g: `[B, T, H_v]` natural-log gate (fp32). beta: `[B, T, H_v]`.
        scale: defaults to K^-1/2.
        initial_state: `[N, H_v, K, V]` fp32 (`[N, H_v, V, K]` with ``state_v_first``).
        output_final_state: also return the state after the last token of each sequence.
        use_qk_l2norm_in_kernel: L2-normalise q and k first.
        cu_seqlens: `[N + 1]` int32/int64 sequence boundaries (B must be 1).

    Returns:
        (o `[B, T, H_v, V]` in q's dtype, final_state `[N, H_v, K, V]` fp32 or None)
    """
    validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first, for_kernels=True)
    from .dispatch import arch_for_device

    arch = arch_for_device(q.device)
    raise NotImplementedError(f"qlabench kernels for {arch.name} are not built yet; use "
                              "qlabench.kernels.reference.chunk_gated_delta_rule_ref")
