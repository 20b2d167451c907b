"""Low-level forward: chunk_local_cumsum -> kkt_solve -> chunk recurrence (3 launches; the recurrence
is hopper/chunk_fwd_ws.py (V tile 32), chunk_fwd_wy.py (64) or chunk_fwd_v128.py (128) on sm90, the tile
from the grid's predicted makespan (forward_value_tile), the TMA-pipelined chunk_fwd elsewhere: recurrence_role,
chosen by ``options`` (options.KernelOptions), or by QLABENCH_FWD_KERNEL without it).

Nothing here syncs with the host: chunk tables are built on the device from cu_seqlens, so a call
can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from .common.chunks import chunk_table
from .common.cumsum import chunk_local_cumsum
from .dispatch import Arch, arch_for_device, env_choice, has_kernel, kernel_factory
from .options import KernelOptions
from .validate import validate
from .value_tile import FORWARD_STEP_US, chain_chunks, value_tile

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def chunk_gated_delta_rule_fwd(
    q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, output_final_state=True,
    output_h=False, state_v_first=False, arch: Arch | None = None, options: KernelOptions | None = None,
    keep_a: bool = True, return_masks: bool = False,
):
    """Forward kernels without autograd.

    Args:
        q, k: `[B, T, H_qk, 128]` bf16/fp16. v: `[B, T, H_v, 128]`. g, beta: `[B, T, H_v]`.
        initial_state: `[N, H_v, K, V]` (`[N, H_v, V, K]` with ``state_v_first``), any float dtype.
        output_h: also return the per-chunk start states.
        options: the kernel variants (``fwd_kernel``; ``cp`` is the API's business); None: the
            QLABENCH_FWD_KERNEL switch, read here.
        keep_a: also return A (only the backward reads it); False: kkt_solve does not write it and A is
            returned as None (a forward no backward follows: one C x C bf16 tile per chunk and v-head
            less to store).
        return_masks: also return kkt_solve's Ag and Pm as a sixth entry (`KktMasks`), for the backward
            (backward.chunk_gated_delta_rule_bwd's ``masks``: its bwd_prepare then forms only what is missing).

    Returns:
        (g_cumsum `[B, T, H_v]` fp32, A `[B, T, H_v, C]` gate-free inverse in q's dtype (rows of the
        padding tail unspecified), o `[B, T, H_v, V]` in q's dtype, h `[NCmax, H_v, K, V]` in q's
        dtype or None (chunk i of sequence n at row chunk_offsets[n] + i; rows past the real chunk
        count, ceil(T / C) + N bound, are unspecified), final_state `[N, H_v, K, V]` fp32 or None)
    """
    p = validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first, for_kernels=True)
    arch = arch or arch_for_device(q.device)

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

    sms = _sm_count(dev)
    BV = forward_value_tile(sorted(chain_chunks(p.seq_bounds, p.N, C), reverse=True), p.h_v, sms, arch, p.V,
                            None if options is None else options.fwd_kernel)
    chunk_fwd_kernel = recurrence_kernel((p.V // BV) * p.N * p.h_v, sms, arch,
                                         None if options is None else options.fwd_kernel, BV)
    keep_pm = not forms_pm(chunk_fwd_kernel)

    g_cumsum = chunk_local_cumsum(g2, table, C, arch.name)
    kkt_kernel = kernel_factory(arch, "kkt_solve")(p.h_qk, p.h_v, p.K, C, dtype, arch.name, keep_a,
                                                   *(() if keep_pm else (False,)))
    A, Ag, Pm = solve_chunks(kkt_kernel, q2, k2, g_cumsum, beta2, table.chunk_bounds, C, p.scale, keep_a, keep_pm)

    state = (p.h_v, p.V, p.K) if state_v_first else (p.h_v, p.K, p.V)
    has_h0 = initial_state is not None
    h0 = initial_state.to(torch.float32).contiguous() if has_h0 else torch.empty((1,) + state, device=dev)
    ht = torch.empty((p.N if output_final_state else 1,) + state, dtype=torch.float32, device=dev)
    n_h = table.n_chunks_max if output_h else 1
    h = torch.empty((n_h,) + state, dtype=q.dtype, device=dev)
    o = torch.empty(BT, p.h_v, p.V, dtype=q.dtype, device=dev)
    kernel = chunk_fwd_kernel(p.h_qk, p.h_v, p.K, p.V, BV, C, dtype, state_v_first, arch.name)
    no_skip = torch.empty(1, p.h_v, dtype=torch.int32, device=dev)  # has_skip = 0: never read
    # the blocks run the sequences longest chain first (table.seq_order), as the V tile's makespan assumes
    kernel(q2, k2, v2, g_cumsum, Ag, Ag if Pm is None else Pm, table.cu_seqlens, table.chunk_offsets, table.seq_order,
           no_skip, h0, o, ht, h, p.scale, int(has_h0), int(bool(output_final_state)), int(bool(output_h)), 0)
    out = (
        g_cumsum.reshape(p.B, p.T, p.h_v),
        None if A is None else A.reshape(p.B, p.T, p.h_v, C),
        o.reshape(p.B, p.T, p.h_v, p.V),
        h if output_h else None,
        ht if output_final_state else None,
    )
    return out + (KktMasks(Ag, Pm),) if return_masks else out


class KktMasks:
    """kkt_solve's gated masks of one forward, handed to its backward: Ag = Gam .* A .* beta_col and Pm =
    scale Gam .* Q K^T (`[B * T, H_v, C]` in q's dtype; Pm None where the BV-128 recurrence formed it on chip),
    which are bwd_prepare's Ag and Pg (Ag here from the fp32 inverse, bwd_prepare's from its bf16 A)."""

    __slots__ = ("Ag", "Pm")

    def __init__(self, Ag: torch.Tensor, Pm: torch.Tensor | None):
        self.Ag, self.Pm = Ag, Pm


def solve_chunks(kkt_kernel, q2, k2, g_cumsum, beta2, chunk_bounds, C: int, scale: float, keep_a: bool,
                 keep_pm: bool = True):
    """Runs kkt_solve over every chunk and returns its outputs A, Ag, Pm (`[n_tok, H_v, C]` each, q's dtype).
    A is None unless ``keep_a``: the kernel then gets Ag in A's place and, compiled with store_a False, never
    writes it (a forward no backward follows). Pm likewise unless ``keep_pm`` (kkt_solve compiled with
    store_pm False: the recurrence forms Pm on chip, `forms_pm`); the recurrence then gets Ag in Pm's place."""
    n_tok, h_v = beta2.shape
    A, Ag, Pm = (torch.empty(n_tok, h_v, C, dtype=q2.dtype, device=q2.device) if keep else None
                 for keep in (keep_a, True, keep_pm))
    kkt_kernel(q2, k2, g_cumsum, beta2, chunk_bounds, Ag if A is None else A, Ag, Ag if Pm is None else Pm, scale)
    return A, Ag, Pm


def forms_pm(recurrence_factory) -> bool:
    """Whether a chunk-recurrence kernel factory forms Pm = scale Gam .* Q K^T itself (its kernels never read
    the Pm argument: hopper's chunk_fwd_v128), so kkt_solve need not write it. Marked by the factory's
    ``forms_pm`` attribute."""
    return bool(getattr(recurrence_factory, "forms_pm", False))


_RECURRENCE_ROLES = {
    "pipelined": "chunk_fwd_pipelined",
    "simple": "chunk_fwd",
    "ws": "chunk_fwd_ws",
    "wy": "chunk_fwd_wy",
}


def _recurrence_choice(fwd_kernel: str | None) -> str:
    """``fwd_kernel``, or the QLABENCH_FWD_KERNEL switch without it: "auto" or a key of _RECURRENCE_ROLES
    (anything else is a ValueError naming it)."""
    choices = ("auto",) + tuple(_RECURRENCE_ROLES)
    choice = env_choice("QLABENCH_FWD_KERNEL", choices, "auto") if fwd_kernel is None else fwd_kernel
    if choice not in choices:
        raise ValueError(f"fwd_kernel must be one of {', '.join(choices)}, got {choice!r}")
    return choice


def recurrence_role(n_blocks: int, sm_count: int, arch: Arch | str | None = None,
                    fwd_kernel: str | None = None, bv: int | None = None) -> str:
    """Kernel role of the chunk recurrence at V tile ``bv``: on sm90 the manually warp-specialized
    ones, chunk_fwd_v128 at BV = 128 (auto only), chunk_fwd_wy (the WY form of the state chain) at BV = 64
    and chunk_fwd_ws at BV = 32 (or ``bv`` None); elsewhere the TMA-pipelined one.

    Measured on the H200 (results/h200/NOTES.md): the warp-specialized recurrence (producer / state /
    output warpgroups: only the state path on the per-chunk critical path) against the pipelined one,
    recurrence kernel alone, ms (f7c378e): 1x32768 hk16_hv16 0.819 vs 0.976, hk2_hv8 0.815 vs 0.972,
    hk16_hv64 1.650 vs 1.951, 8192x4 hk16_hv16 0.416 vs 0.494, 1x2048 hk2_hv8 0.053 vs 0.062. The WY
    form (session 8, us, chunk_fwd_wy vs chunk_fwd_ws): hk16_hv64 1x32768 (BV 64) 1219 vs 1335; at BV 32
    its fourth warpgroup (W = Ag diag(e) K per chunk, the same work at either tile) is the slowest
    role: hk16_hv16 1x32768 918 vs 778, hk2_hv8 1x32768 898 vs 773, hk2_hv8 1x8192 225 vs 195. The
    pipelined variant in turn beat the plain one on every grid tried. QLABENCH_FWD_KERNEL=ws|wy|
    pipelined|simple forces one (the A/B switch; ws and wy raise ValueError on archs without them);
    auto (the default) takes the rule above. ``fwd_kernel`` (KernelOptions.fwd_kernel) replaces the
    switch when given. ``n_blocks`` and ``sm_count`` are kept for grid-dependent rules.
    """
    del n_blocks, sm_count
    choice = _recurrence_choice(fwd_kernel)
    if choice == "auto":
        if arch is None or not has_kernel(arch, "chunk_fwd_ws"):
            return "chunk_fwd_pipelined"
        if bv == 128 and has_kernel(arch, "chunk_fwd_v128"):
            return "chunk_fwd_v128"
        return "chunk_fwd_wy" if bv == 64 and has_kernel(arch, "chunk_fwd_wy") else "chunk_fwd_ws"
    return _RECURRENCE_ROLES[choice]


def recurrence_kernel(n_blocks: int, sm_count: int, arch: Arch | str, fwd_kernel: str | None = None,
                      bv: int | None = None):
    """The chunk-recurrence kernel factory of ``arch`` for a grid of ``n_blocks`` blocks at V tile
    ``bv`` (``fwd_kernel``, ``bv``: as recurrence_role)."""
    return kernel_factory(arch, recurrence_role(n_blocks, sm_count, arch, fwd_kernel, bv))


def forward_value_tile(chunks, h_v: int, sm_count: int, arch: Arch, V: int, fwd_kernel: str | None = None) -> int:
    """V tile of the forward's recurrence (a launch without the transition mode): value_tile over the
    tiles ``arch`` has recurrences for, BV 128 (chunk_fwd_v128) only under the auto recurrence rule
    (``fwd_kernel`` as recurrence_role; the A/B recurrences run 32 / 64). QLABENCH_FWD_BV=32|64|128
    forces a tile (the A/B switch; 128 with a forced recurrence other than auto raises ValueError)."""
    choice = _recurrence_choice(fwd_kernel)
    wide = choice == "auto" and has_kernel(arch, "chunk_fwd_v128")
    forced = env_choice("QLABENCH_FWD_BV", ("auto", "32", "64", "128"), "auto")
    if forced == "128" and not wide:
        raise ValueError(f"QLABENCH_FWD_BV=128 needs chunk_fwd_v128 (sm90, fwd_kernel auto), got {arch.name} "
                         f"with fwd_kernel {choice!r}")
    if forced != "auto":
        return int(forced)
    steps = {bv: us for bv, us in FORWARD_STEP_US.items() if bv != 128 or wide}
    return value_tile(chunks, h_v, sm_count, steps, V)


_SM_COUNTS: dict = {}


def _sm_count(device) -> int:
    key = str(device)
    if key not in _SM_COUNTS:
        _SM_COUNTS[key] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNTS[key]
