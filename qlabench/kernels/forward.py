"""Low-level forward: chunk_local_cumsum -> kkt_solve -> chunk recurrence (3 launches).

Nothing here syncs with the host: chunk tables are built on the device from cu_seqlens, so a call
can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from .common.chunks import chunk_table
from .common.cumsum import chunk_local_cumsum
from .dispatch import Arch, arch_for_device, kernel_factory
from .validate import validate

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def value_tile(n_blocks: int, sm_count: int = 132) -> int:
    """V tile width: wide tiles when the (sequence, head) blocks alone fill the GPU, narrow otherwise."""
    return 64 if n_blocks >= sm_count // 2 else 32


def chunk_gated_delta_rule_fwd(
    q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, output_final_state=True,
    output_h=False, state_v_first=False, arch: Arch | None = None,
):
    """Forward kernels without autograd.

    Args:
        q, k: `[B, T, H_qk, 128]` bf16/fp16. v: `[B, T, H_v, 128]`. g, beta: `[B, T, H_v]`.
        initial_state: `[N, H_v, K, V]` (`[N, H_v, V, K]` with ``state_v_first``), any float dtype.
        output_h: also return the per-chunk start states.

    Returns:
        (g_cumsum `[B, T, H_v]` fp32, A `[B, T, H_v, C]` gate-free inverse in q's dtype (rows of the
        padding tail unspecified), o `[B, T, H_v, V]` in q's dtype, h `[NCmax, H_v, K, V]` in q's
        dtype or None (chunk i of sequence n at row chunk_offsets[n] + i; rows past the real chunk
        count, ceil(T / C) + N bound, are unspecified), final_state `[N, H_v, K, V]` fp32 or None)
    """
    p = validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first, for_kernels=True)
    arch = arch or arch_for_device(q.device)
    kkt_solve_kernel = kernel_factory(arch, "kkt_solve")

    C = arch.chunk_size
    dtype = _DTYPE_NAMES[q.dtype]
    dev = q.device
    BT = p.B * p.T
    q2 = q.reshape(BT, p.h_qk, p.K).contiguous()
    k2 = k.reshape(BT, p.h_qk, p.K).contiguous()
    v2 = v.reshape(BT, p.h_v, p.V).contiguous()
    g2 = g.reshape(BT, p.h_v).to(torch.float32).contiguous()
    beta2 = beta.reshape(BT, p.h_v).to(torch.float32).contiguous()
    table = chunk_table(cu_seqlens, p.seq_bounds, p.B, p.T, C, dev)

    g_cumsum = chunk_local_cumsum(g2, table, C, arch.name)
    A, Ag, Pm = (torch.empty(BT, p.h_v, C, dtype=q.dtype, device=dev) for _ in range(3))
    kkt_solve_kernel(p.h_qk, p.h_v, p.K, C, dtype, arch.name)(
        q2, k2, g_cumsum, beta2, table.chunk_bounds, A, Ag, Pm, p.scale)

    state = (p.h_v, p.V, p.K) if state_v_first else (p.h_v, p.K, p.V)
    has_h0 = initial_state is not None
    h0 = initial_state.to(torch.float32).contiguous() if has_h0 else torch.empty((1,) + state, device=dev)
    ht = torch.empty((p.N if output_final_state else 1,) + state, dtype=torch.float32, device=dev)
    n_h = table.n_chunks_max if output_h else 1
    h = torch.empty((n_h,) + state, dtype=q.dtype, device=dev)
    o = torch.empty(BT, p.h_v, p.V, dtype=q.dtype, device=dev)
    sms = _sm_count(dev)
    BV = value_tile(p.N * p.h_v, sms)
    chunk_fwd_kernel = recurrence_kernel((p.V // BV) * p.N * p.h_v, sms, arch)
    kernel = chunk_fwd_kernel(p.h_qk, p.h_v, p.K, p.V, BV, C, dtype, state_v_first, arch.name)
    no_skip = torch.empty(1, p.h_v, dtype=torch.int32, device=dev)  # has_skip = 0: never read
    kernel(q2, k2, v2, g_cumsum, Ag, Pm, table.cu_seqlens, table.chunk_offsets, no_skip, h0, o, ht, h,
           p.scale, int(has_h0), int(bool(output_final_state)), int(bool(output_h)), 0)
    return (
        g_cumsum.reshape(p.B, p.T, p.h_v),
        A.reshape(p.B, p.T, p.h_v, C),
        o.reshape(p.B, p.T, p.h_v, p.V),
        h if output_h else None,
        ht if output_final_state else None,
    )


_RECURRENCE_ROLES = {
    "auto": "chunk_fwd_pipelined",
    "pipelined": "chunk_fwd_pipelined",
    "simple": "chunk_fwd",
    "ws": "chunk_fwd_ws",
}


def recurrence_role(n_blocks: int, sm_count: int) -> str:
    """Kernel role of the chunk recurrence for a grid of ``n_blocks`` blocks: the TMA-pipelined one.

    Measured on the H200 (tools/fwd_variants.py, results/h200/NOTES.md) the pipelined variant (one
    block per SM by its shared memory, loads of chunk c + 1 overlapping chunk c) beats the plain one
    (also one block per SM, by its registers; loads exposed every chunk) on every grid tried, from 64 blocks (1x32768
    hk16_hv16: 1.45 vs 2.10 ms for the whole forward) to 512 (1x32768 hk16_hv64: 3.60 vs 5.09 ms).
    QLABENCH_FWD_KERNEL=simple|pipelined forces one (the plain variant stays as the A/B baseline);
    QLABENCH_FWD_KERNEL=ws opts into the manually warp-specialized recurrence (hopper/chunk_fwd_ws.py,
    sm90 only, not the default: not yet measured on a GPU).
    """
    import os

    del n_blocks, sm_count  # the choice no longer depends on the grid (kept for the A/B switch)
    choice = os.environ.get("QLABENCH_FWD_KERNEL", "auto")
    if choice not in _RECURRENCE_ROLES:
        raise ValueError(f"QLABENCH_FWD_KERNEL must be auto, simple, pipelined or ws, got {choice!r}")
    return _RECURRENCE_ROLES[choice]


def recurrence_kernel(n_blocks: int, sm_count: int, arch: Arch | str):
    """The chunk-recurrence kernel factory of ``arch`` for a grid of ``n_blocks`` blocks."""
    return kernel_factory(arch, recurrence_role(n_blocks, sm_count))


_SM_COUNTS: dict = {}


def _sm_count(device) -> int:
    key = str(device)
    if key not in _SM_COUNTS:
        _SM_COUNTS[key] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNTS[key]
