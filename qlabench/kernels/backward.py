"""Low-level backward: prepare -> h recompute -> reverse dh pass -> per-chunk gradients.

Four launches on sm90 (``hopper/bwd_*.py``; five on sm100, whose per-chunk gradients are two kernels),
then (GQA only) the group sums of dq, dk in fp32 and their cast, and the zero padding tail (a slice
memset of the tail rows). The math of each kernel, step for step, is in ``emulate_bwd.py``:

    bwd_prepare  grid (NCmax, H_qk)      per chunk: Pg, Ag (bf16 C x C masks), factors e, r, beta of each
                                         v-head of the qk-head's GQA group (Q K^T once per group; sm100:
                                         grid (NCmax, H_v), one v-head per block). After the API's own
                                         forward (KernelOptions.bwd_masks = forward) Ag and Pg are
                                         kkt_solve's Ag and Pm, kept from it (`forward.KktMasks`), and on
                                         sm90 bwd_prepare forms only what is missing: the factors alone
                                         (one block per chunk over every v-head), or Pg and the factors
                                         where the BV-128 recurrence formed Pm on chip
    bwd_h        grid (V / BV, N * H_v)  forward over chunks: h (state at every chunk start) and
                                         nothing else; on sm90 ``hopper/bwd_h_ws.py`` (warp-
                                         specialized, the state-independent factor K^T A_k diag(beta)
                                         formed off the serial chain), on sm100
                                         ``blackwell/bwd_h_pipelined.py``
    bwd_dh       grid (V / BV, N * H_v)  reverse over chunks: dh (state grad at every chunk end),
                                         dV', dh0 (sm100: and dv); on sm90 ``hopper/bwd_dh_ws.py`` (warp-specialized;
                                         KernelOptions.bwd_dh = pipelined: ``bwd_dh_pipelined.py``),
                                         on sm100 ``blackwell/bwd_dh_pipelined.py``; both read Pg, Ag
                                         and the factors: no exp or mask in the serial loop
    bwd_chunk    grid (NCmax, H_qk)      sm90, per chunk, full V: dv = Ag^T dV' (over dV' in place: one
                                         buffer for both, `dv_in_chunk`), dq, dk summed over the GQA group,
                                         dbeta, dg (raw gate) with every intermediate on chip
                                         (``hopper/bwd_chunk.py``)
      sm100:     bwd_state (dAg, dPg, dq0, dk0, dgam0 in fp32 HBM) then bwd_intra (the rest)
    dq, dk: on sm90 bwd_chunk sums them over the GQA group in registers and stores them once in q's dtype;
    sm100's bwd_intra stores them in q's dtype when H_v == H_qk, in fp32 per v-head for GQA (summed over
    each group on the host); see `chunk_grads`.

V tile BV of bwd_h and bwd_dh (`_value_tile`): their N * H_v (sequence, v-head) pairs each walk all
of the sequence's chunks in order, so with few pairs the grid leaves most SMs idle; BV = 32 doubles
the blocks at a cheaper chunk step, taken where the two grids' predicted makespan (side by side, as they
run) says it finishes first (value_tile.py), BV = 64 otherwise. sm100's tcgen05 versions take BV = 64 only. Both tiles compute
the same values (every term is per V column).

bwd_h and bwd_dh read none of each other's outputs: bwd_dh runs on a second, high-priority stream beside
bwd_h (`streams.Beside`), so the blocks of one fill the SMs the other's longest chains leave idle.
Over sequences of unequal length sm90 may run in lanes instead (`backward_lanes`, `_by_lanes`): the longest
chain's sequence and the runs of sequences before and after it, each with its own bwd_dh, bwd_h and then
bwd_chunk over its chunk rows, the lanes side by side (`streams.Lanes`), so the other lanes' per-chunk
gradients run while the long chains finish.

Kernels keep every state in the `[K, V]` layout; for ``state_v_first`` the host transposes the
per-sequence h0 / dht / dh0 (small), so one compiled kernel set serves both layouts. Nothing here
syncs with the host (chunk tables are built on the device).
"""

from __future__ import annotations

import torch

from .common.chunks import chunk_table, f32_buffers
from .dispatch import arch_by_name, arch_for_device, env_choice, has_kernel, kernel_factory, require_backward
from .streams import Beside, Lanes
from .validate import validate
from .value_tile import chain_chunks

__all__ = ["chunk_gated_delta_rule_bwd", "compile_backward_kernels"]

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_HEAD_DIM = 128
# V tiles of the two chunk-recurrence kernels (bwd_h, bwd_dh) each arch's files compile, narrowest
# first: sm100's (blackwell/, tcgen05 into tensor memory) need BV >= 64 in TileLang 0.1.15. _BV, which
# every arch takes, is the default of `_kernels` / `compile_backward_kernels`.
_VALUE_TILES = {"sm90": (32, 64), "sm100": (64,)}
_BV = 64


def _alloc(shape, dtype, device) -> torch.Tensor:
    """Every output and intermediate buffer comes from here (tests swap in a NaN-filled version)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str) and dtype in _DTYPE_NAMES.values():
        return dtype
    if dtype in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype]
    raise TypeError(f"the backward kernels take bfloat16 or float16, got {dtype!r}")


def _arch_name(target) -> str:
    """An arch name ('sm90'), or an explicit target dict ({'kind': 'cuda', 'arch': 'sm_90a'})."""
    if isinstance(target, dict):
        for name in ("sm90", "sm100", "sm120"):
            if arch_by_name(name).target == target:
                return name
        raise ValueError(f"no qlabench architecture has the target {target!r}")
    if not isinstance(target, str):
        raise TypeError(f"target must be an arch name or a target dict, got {type(target).__name__}")
    return arch_by_name(target).name


def _intra_out_dtype(h_qk: int, h_v: int, dtype: str) -> str:
    """Dtype of bwd_intra's dq, dk: the inputs' dtype without GQA (they are the final gradients),
    float32 with it (the host sums each group of v-heads, then casts)."""
    return dtype if h_v == h_qk else "float32"


def value_tiles(arch: str) -> tuple[int, ...]:
    """The V tiles of bwd_h / bwd_dh the API may launch on ``arch`` (`qlabench aot` compiles each)."""
    a = arch_by_name(arch)
    require_backward(a)
    return _VALUE_TILES[a.name]


def _value_tile(chunks, h_v: int, sm_count: int, arch: str, longest_first: bool = False) -> int:
    """V tile of bwd_h / bwd_dh for chains of ``chunks`` chunks (one per sequence or piece) over
    ``h_v`` v-heads on ``arch``: the smaller predicted makespan (value_tile.py) among the tiles the
    arch's kernels take. QLABENCH_BWD_BV=32|64 forces a tile (the A/B switch; a tile ``arch`` has no kernels
    for is a ValueError)."""
    from .value_tile import BACKWARD_STEP_US, value_tile

    tiles = value_tiles(arch)
    forced = env_choice("QLABENCH_BWD_BV", ("auto", "32", "64"), "auto")
    if forced != "auto":
        if int(forced) not in tiles:
            raise ValueError(f"QLABENCH_BWD_BV={forced}: {arch} has bwd_h / bwd_dh kernels for V tiles {tiles} only")
        return int(forced)
    # ``longest_first``: the kernels dispatch the chains longest first (ChunkTable.seq_order), else in order
    chunks = sorted(chunks, reverse=True) if longest_first else chunks
    return value_tile(chunks, h_v, sm_count, {bv: BACKWARD_STEP_US[bv] for bv in tiles})


# bwd_prepare variants each arch's file compiles besides the full one ("pg_ag": Pg, Ag and fac): after the API's
# own forward, whose kkt_solve wrote Ag (and Pm = Pg unless the BV-128 recurrence formed it on chip), sm90
# forms only what is missing (hopper/bwd_prepare.py MASKS); sm100's file forms both always.
_PREPARE_VARIANTS = {"sm90": ("pg", "none"), "sm100": ()}


def prepare_variants(arch: str) -> tuple[str, ...]:
    """The partial bwd_prepare variants the API may launch on ``arch`` (`qlabench aot` compiles each)."""
    a = arch_by_name(arch)
    require_backward(a)
    return _PREPARE_VARIANTS[a.name]


def _prepare_masks(arch: str, masks) -> tuple[str, object]:
    """(the bwd_prepare variant, the masks it reads) of a call given the forward's ``masks`` (None or a
    `forward.KktMasks`): ("pg_ag", None) where there are none or the arch's bwd_prepare forms both itself."""
    if masks is None or not prepare_variants(arch):
        return "pg_ag", None
    return ("none" if masks.Pm is not None else "pg"), masks


def _kernels(h_qk: int, h_v: int, dtype: str, arch: str, bv: int = _BV, bwd_dh: str | None = None,
             prepare: str = "pg_ag") -> dict:
    """The compiled kernels of one configuration (each factory is lru_cached), in launch order;
    ``bv`` is the V tile of bwd_h and bwd_dh (one of `value_tiles`); ``bwd_dh`` as `_dh_role`; ``prepare``
    the bwd_prepare variant (`_prepare_masks`)."""
    a = arch_by_name(arch)
    require_backward(a)  # NotImplementedError on sm120 (forward only)
    if bv not in _VALUE_TILES[a.name]:
        raise ValueError(f"bv must be one of {_VALUE_TILES[a.name]} on {a.name}, got {bv!r}")

    def f(role):  # the arch's file for this kernel (dispatch.KERNEL_MODULES)
        return kernel_factory(a, role)

    K = V = _HEAD_DIM
    C = a.chunk_size
    kernels = {
        "bwd_prepare": f("bwd_prepare")(h_qk, h_v, K, C, dtype, a.name,
                                        *(() if prepare == "pg_ag" else (prepare,))),
        "bwd_h": f("bwd_h")(h_qk, h_v, K, V, bv, C, dtype, a.name),
        "bwd_dh": f(_dh_role(a, bwd_dh))(h_qk, h_v, K, V, bv, C, dtype, a.name),
    }
    if _dh_choice(bwd_dh) == "fused":  # the per-chunk gradients with the dS chain on chip (bwd_dh: CP's local passes)
        if not fused_fits(a, h_qk, h_v):
            raise ValueError(f"bwd_dh=fused needs sm90 and H_v == H_qk, got {a.name}, H_qk={h_qk}, H_v={h_v}")
        kernels["bwd_fused"] = f("bwd_fused")(h_qk, h_v, K, V, C, dtype, a.name)
    elif has_kernel(a, "bwd_chunk"):  # sm90: the per-chunk gradients in one kernel
        kernels["bwd_chunk"] = f("bwd_chunk")(h_qk, h_v, K, V, C, dtype, a.name)
    else:
        kernels["bwd_state"] = f("bwd_state")(h_qk, h_v, K, V, C, dtype, a.name)
        kernels["bwd_intra"] = f("bwd_intra")(h_qk, h_v, K, C, dtype, a.name,
                                              out_dtype=_intra_out_dtype(h_qk, h_v, dtype))
    return kernels


_DH_CHOICES = ("auto", "ws", "pipelined", "fused")


def _dh_choice(bwd_dh: str | None = None) -> str:
    """KernelOptions.bwd_dh, or without it QLABENCH_BWD_DH (ValueError outside _DH_CHOICES)."""
    choice = env_choice("QLABENCH_BWD_DH", _DH_CHOICES, "auto") if bwd_dh is None else bwd_dh
    if choice not in _DH_CHOICES:
        raise ValueError(f"bwd_dh must be one of {', '.join(_DH_CHOICES)}, got {choice!r}")
    return choice


# bwd_dh=auto takes hopper/bwd_fused for a CP backward of at most FUSED_MAX_CHAINS effective chains (cp.py's Be * H_v)
# where H_v == H_qk, measured on the H200 (h200-bwd hk16_hv16, backward time fused / the default's bwd_dh=ws over the
# same pieces). Sessions 28-30 found a tie at 18.6-20.5 chains and losses from 22.9 (1.07-1.17); session 31
# (results/h200/2026-12-04_s31/) dispatched the chains longest first (CPPlan.fused_chains: one block per SM walks a
# whole piece, and in token order the short last pieces of each sequence ran in a last wave) and stored dq / dk under
# the next chunk's loads: 8k_1seq 0.89, 8k_2seq 0.89, 8k_4seq (22.9 chains) 0.96, 32k_1seq 0.88, 32k_2seq (20.5) 0.85,
# 32k_4seq (38.3) 0.89, 32k_8seq (53.1) 0.93; only 8k_8seq (42.2 chains of at most 3157 tokens, where cp=auto takes
# no plan) lost, 1.03. So the bound is cp.py's own for a plan at 132 SMs (56 chains, `_ON_FRACTION_LONG`). Without
# CP, where one block walks a whole sequence, it lost 1.8-3.3x. It holds no dh buffer: 0.74-0.77x the default's peak
# memory.
FUSED_MAX_CHAINS = 56


def fused_fits(arch, h_qk: int, h_v: int) -> bool:
    """Whether hopper/bwd_fused can run a backward of this shape: ``arch`` has it (sm90) and H_v == H_qk (no GQA group
    reduction in it)."""
    return h_qk == h_v and has_kernel(arch, "bwd_fused")


def cp_dh_choice(arch, h_qk: int, h_v: int, plan, bwd_dh: str | None = None) -> str:
    """bwd_dh for a CP backward over ``plan``: ``fused`` where bwd_dh is auto and the rule above admits the call
    (sm90's bwd_fused, H_v == H_qk, at most FUSED_MAX_CHAINS effective chains), else ``bwd_dh`` as given
    (`_dh_choice`)."""
    from .cp import effective_chains

    choice = _dh_choice(bwd_dh)
    if (choice == "auto" and fused_fits(arch, h_qk, h_v) and plan.enabled
            and effective_chains(plan.seq_tokens, h_v, plan.chunk_size) <= FUSED_MAX_CHAINS):
        return "fused"
    return choice


def _dh_role(arch, bwd_dh: str | None = None) -> str:
    """bwd_dh's file for ``bwd_dh`` (KernelOptions.bwd_dh; None: QLABENCH_BWD_DH): ``auto`` takes
    hopper/bwd_dh_ws.py (manually warp-specialized, same signature) where the arch has it (sm90;
    faster than bwd_dh_pipelined on the H200, results/h200/NOTES.md session 5), else the arch's
    bwd_dh; ``ws`` forces it (sm90 only:
    elsewhere kernel_factory raises); ``pipelined`` takes the arch's bwd_dh; ``fused`` takes auto's file for the
    CP local passes (the final reverse pass runs inside bwd_fused)."""
    choice = _dh_choice(bwd_dh)
    if choice == "ws" or (choice in ("auto", "fused") and has_kernel(arch, "bwd_dh_ws")):
        return "bwd_dh_ws"
    return "bwd_dh"


def compile_backward_kernels(h_qk, h_v, scale=None, dtype="bfloat16", state_v_first=False, target="sm90", *,
                             bv=_BV, prepare="pg_ag", bwd_dh=None):
    """Compiles every backward kernel of one configuration for ``target`` (no GPU needed).

    ``scale`` and ``state_v_first`` do not specialise the kernels (scale is a runtime argument, the
    host transposes states) and are accepted for a uniform signature. The head counts do: with
    h_v == h_qk bwd_chunk (sm90) or bwd_intra (sm100) stores dq, dk in ``dtype``, with GQA in fp32 (`_intra_out_dtype`). ``bv``
    is the V tile of bwd_h and bwd_dh (`value_tiles(target)`; the API picks one per call from its
    grid, `_value_tile`). ``prepare`` is the bwd_prepare variant ("pg_ag", or one of
    `prepare_variants(target)`: what a backward after the API's own forward launches). ``bwd_dh`` as `_dh_role`
    (``fused``: bwd_fused in bwd_chunk's place, `cp_dh_choice`). The older
    positional form ``(h_qk, h_v, dtype, state_v_first, target)`` is also accepted.

    Returns:
        {kernel name: compiled TileLang kernel}.
    """
    if isinstance(scale, (str, torch.dtype)):  # (h_qk, h_v, dtype, state_v_first, target)
        scale, dtype, state_v_first, target = None, scale, dtype, state_v_first
    for name, x in (("h_qk", h_qk), ("h_v", h_v)):
        if not isinstance(x, int) or isinstance(x, bool) or x < 1:
            raise ValueError(f"{name} must be a positive int, got {x!r}")
    if h_v % h_qk:
        raise ValueError(f"H_v must be a multiple of H_qk, got H_v={h_v}, H_qk={h_qk}")
    if scale is not None and (not isinstance(scale, (int, float)) or not scale > 0):
        raise ValueError(f"scale must be a positive float or None, got {scale!r}")
    if not isinstance(state_v_first, bool):
        raise TypeError(f"state_v_first must be a bool, got {state_v_first!r}")
    arch = _arch_name(target)
    if prepare != "pg_ag" and prepare not in prepare_variants(arch):
        raise ValueError(f"prepare must be 'pg_ag' or one of {prepare_variants(arch)} on {arch}, got {prepare!r}")
    return _kernels(h_qk, h_v, _dtype_name(dtype), arch, bv, bwd_dh, prepare=prepare)


def _check_inputs(q, k, v, g_cumsum, beta, A, do, dht, scale, initial_state, cu_seqlens, state_v_first,
                  C: int):
    p = validate(q, k, v, g_cumsum, beta, scale, initial_state, cu_seqlens, state_v_first, for_kernels=True)
    if g_cumsum.dtype != torch.float32:
        raise TypeError(f"g_cumsum must be float32, got {g_cumsum.dtype}")
    for name, x, shape in (("A", A, (p.B, p.T, p.h_v, C)), ("do", do, (p.B, p.T, p.h_v, p.V))):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, q on {q.device}")
    if dht is not None:
        if not isinstance(dht, torch.Tensor):
            raise TypeError(f"dht must be a torch.Tensor or None, got {type(dht).__name__}")
        want = (p.N, p.h_v, p.V, p.K) if state_v_first else (p.N, p.h_v, p.K, p.V)
        if tuple(dht.shape) != want:
            raise ValueError(f"dht must have shape {want}, got {tuple(dht.shape)}")
        if dht.device != q.device:
            raise ValueError(f"dht is on {dht.device}, q on {q.device}")
    return p


def check_masks(masks, p, dtype, device, C: int):
    """The forward's kkt_solve masks handed to a backward: None, or a `forward.KktMasks` whose Ag (and Pm,
    unless None) are `[B * T, H_v, C]` in q's dtype on q's device (rows past each chunk's end are never read)."""
    if masks is None:
        return None
    from .forward import KktMasks

    if not isinstance(masks, KktMasks):
        raise TypeError(f"masks must be None or a forward.KktMasks, got {type(masks).__name__}")
    want = (p.B * p.T, p.h_v, C)
    for name, x in (("Ag", masks.Ag), ("Pm", masks.Pm)):
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"masks.{name} must be a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != want or x.dtype != dtype or x.device != device or not x.is_contiguous():
            raise ValueError(f"masks.{name} must be a contiguous {want} {dtype} tensor on {device}, got "
                             f"{tuple(x.shape)} {x.dtype} on {x.device}")
    return masks


def chunk_gated_delta_rule_bwd(q, k, v, g_cumsum, beta, A, do, dht=None, scale=None, initial_state=None,
                               cu_seqlens=None, state_v_first=False, *, options=None, masks=None):
    """Backward kernels without autograd (Hopper).

    Args:
        q, k: `[B, T, H_qk, 128]` bf16/fp16. v, do: `[B, T, H_v, 128]` (q's dtype).
        g_cumsum: `[B, T, H_v]` fp32 in-chunk cumulative log-gate (from the forward).
        beta: `[B, T, H_v]`. A: `[B, T, H_v, C]` gate-free inverse from the forward (q's dtype).
        dht: gradient of the final state, `[N, H_v, K, V]` (`[N, H_v, V, K]` with ``state_v_first``)
            or None (zero).
        initial_state: like dht, or None.
        cu_seqlens: `[N + 1]` int32/int64 boundaries of packed sequences (B must be 1) or None.
        options: `options.KernelOptions` (its ``bwd_dh`` picks the reverse pass); None: the
            QLABENCH_BWD_DH switch, read here.
        masks: the forward's kkt_solve masks (`forward.KktMasks`, from chunk_gated_delta_rule_fwd with
            return_masks) or None: its Ag and Pm are bwd_prepare's Ag and Pg, so on sm90 bwd_prepare
            forms only what is missing (None: both). Read, never written.

    Returns:
        (dq `[B, T, H_qk, K]`, dk `[B, T, H_qk, K]`, dv `[B, T, H_v, V]` in q's dtype,
         dbeta `[B, T, H_v]` in beta's dtype, dg `[B, T, H_v]` fp32 for the raw gate,
         dh0 in initial_state's layout and dtype, or None without initial_state).
        Every gradient is zero on the padding tail after cu_seqlens[-1].
    """
    arch = arch_for_device(q.device)
    require_backward(arch)
    p = _check_inputs(q, k, v, g_cumsum, beta, A, do, dht, scale, initial_state, cu_seqlens,
                      state_v_first, arch.chunk_size)
    from .forward import _sm_count

    masks = check_masks(masks, p, q.dtype, q.device, arch.chunk_size)
    chunks = chain_chunks(p.seq_bounds, p.N, arch.chunk_size)
    bv = _value_tile(chunks, p.h_v, _sm_count(q.device), arch.name, longest_first=True)
    prepare, masks = _prepare_masks(arch.name, masks)
    bwd_dh = None if options is None else options.bwd_dh
    kernels = _kernels(p.h_qk, p.h_v, _DTYPE_NAMES[q.dtype], arch.name, bv, bwd_dh, prepare)
    lanes = None
    if p.seq_bounds is not None and "bwd_chunk" in kernels:  # sm90's plain path with the host's bounds
        forced = env_choice("QLABENCH_BWD_BV", ("auto", "32", "64"), "auto") != "auto"
        tiles = (bv,) if forced else (bv, *(t for t in value_tiles(arch.name) if t > bv))
        lanes, lane_bv = backward_lanes(chunks, p.h_v, tiles, _sm_count(q.device))
        if lane_bv != bv:
            kernels = _kernels(p.h_qk, p.h_v, _DTYPE_NAMES[q.dtype], arch.name, lane_bv, bwd_dh, prepare)
    return _bwd_impl(p, q, k, v, g_cumsum, beta, A, do, dht, initial_state, cu_seqlens, state_v_first,
                     arch.chunk_size, kernels, masks, lanes)


def mask_buffers(masks, BT: int, H: int, C: int, dtype, device):
    """(Pg, Ag) for bwd_prepare and bwd_dh: the forward's (``masks``, a `forward.KktMasks`) where given, else
    new buffers bwd_prepare fills."""
    Ag, Pm = (None, None) if masks is None else (masks.Ag, masks.Pm)
    Pg = Pm if Pm is not None else _alloc((BT, H, C), dtype, device)
    return Pg, (Ag if Ag is not None else _alloc((BT, H, C), dtype, device))


def dv_in_chunk(kernels) -> bool:
    """Whether the per-chunk kernel forms dv = Ag^T dV' itself: sm90's bwd_chunk does, over dV' in place, so one
    `[T, H_v, V]` buffer holds dV' (written by bwd_dh) and then dv (one buffer less at the backward's peak);
    sm100's bwd_dh stores dV' and dv in two. bwd_fused (bwd_dh=fused) forms both itself: sm90's bwd_dh serves only
    CP's local passes there and stores no rows."""
    return "bwd_chunk" in kernels or "bwd_fused" in kernels


def dh_pass_rows(kernels, dh, dvp, dv) -> tuple:
    """bwd_dh's row outputs: (dh, dV'), and dv after them where the per-chunk kernel does not form it."""
    return (dh, dvp) if dv_in_chunk(kernels) else (dh, dvp, dv)


def _zero_padding_tail(table, n_tok: int, buffers) -> None:
    """Zeroes the padding tail (tokens from cu_seqlens[-1] on) of every ``[n_tok, ...]`` buffer in place.

    With the host value of cu_seqlens[-1] (``table.tokens_end``) only the tail rows are written (a
    slice memset, as common/cumsum.py does); without it (a CUDA-graph capture of an unseen cu_seqlens)
    a device mask over the whole buffers, no host sync. In place either way: every buffer is ours, and
    an out-of-place masked_fill would clone each tensor first.
    """
    end = table.tokens_end
    if end is not None:
        if end < n_tok:
            for x in buffers:
                x[end:].zero_()
        return
    tail = torch.arange(n_tok, device=table.cu_seqlens.device) >= table.cu_seqlens[-1]
    for x in buffers:
        x.masked_fill_(tail.view((n_tok,) + (1,) * (x.dim() - 1)), 0)


def chunk_grads(kernels, p, q2, k2, v2, do2, dvp, dv, g2, b2, A2, h, dh, bounds, C):
    """The per-chunk gradients (dq, dk `[BT, H_qk, K]` in q's dtype, dbeta, dg `[BT, H_v]` fp32;
    flattened token axis) from the states h, dh and bwd_dh's dV' (and dv). sm90: one launch of bwd_chunk,
    which turns dV' into dv in place (``dvp`` is ``dv``: `dv_in_chunk`) and sums dq, dk over each GQA group
    in registers. sm100: bwd_state then bwd_intra through fp32
    intermediates, dq, dk per v-head (in q's dtype when H_v == H_qk, else fp32 summed here)."""
    dev, f32 = q2.device, f32_buffers(q2.dtype)
    BT, H, K, G = q2.shape[0], p.h_v, p.K, p.group
    dbeta = _alloc((BT, H), f32, dev)
    dg = _alloc((BT, H), f32, dev)
    if "bwd_chunk" in kernels:
        dq = _alloc((BT, p.h_qk, K), q2.dtype, dev)
        dk = _alloc((BT, p.h_qk, K), q2.dtype, dev)
        if dvp is not dv:
            raise ValueError("bwd_chunk forms dv over dV' in place: dvp must be dv")
        kernels["bwd_chunk"](q2, k2, v2, do2, dv, g2, b2, A2, h, dh, bounds, dq, dk, dbeta, dg, p.scale)
        return dq, dk, dbeta, dg
    dq_v = _alloc((BT, H, K), q2.dtype if G == 1 else f32, dev)
    dk_v = _alloc((BT, H, K), dq_v.dtype, dev)
    dAg = _alloc((BT, H, C), f32, dev)
    dPg = _alloc((BT, H, C), f32, dev)
    dq0 = _alloc((BT, H, K), f32, dev)
    dk0 = _alloc((BT, H, K), f32, dev)
    dgam0 = _alloc((BT, H), f32, dev)
    kernels["bwd_state"](k2, v2, do2, dvp, dv, g2, b2, A2, h, dh, bounds, dAg, dPg, dq0, dk0, dgam0, p.scale)
    kernels["bwd_intra"](q2, k2, g2, b2, A2, dAg, dPg, dq0, dk0, dgam0, bounds, dq_v, dk_v, dbeta, dg, p.scale)
    if G > 1:
        dq_v = dq_v.view(BT, p.h_qk, G, K).sum(2)
        dk_v = dk_v.view(BT, p.h_qk, G, K).sum(2)
    return dq_v, dk_v, dbeta, dg


def _bwd_impl(p, q, k, v, g_cumsum, beta, A, do, dht, initial_state, cu_seqlens, state_v_first, C,
              kernels, masks=None, lanes=None):
    """Runs the kernels (``kernels`` maps names to callables with the compiled signatures; ``masks``: the
    forward's `forward.KktMasks` when kernels' bwd_prepare forms only the missing ones, else None; ``lanes``:
    `backward_lanes`' runs of sequences, or None)."""
    dev, dtype = q.device, q.dtype
    BT, H = p.B * p.T, p.h_v
    f32 = torch.float32
    q2 = q.reshape(BT, p.h_qk, p.K).contiguous()
    k2 = k.reshape(BT, p.h_qk, p.K).contiguous()
    v2 = v.reshape(BT, H, p.V).contiguous()
    do2 = do.reshape(BT, H, p.V).contiguous()
    g2 = g_cumsum.reshape(BT, H).contiguous()
    b2 = beta.reshape(BT, H).to(f32).contiguous()
    A2 = A.reshape(BT, H, C).contiguous()
    table = chunk_table(cu_seqlens, p.seq_bounds, p.B, p.T, C, dev)
    cu, offsets, bounds, ncmax = table.cu_seqlens, table.chunk_offsets, table.chunk_bounds, table.n_chunks_max

    def state_in(x):
        if x is None:
            return torch.zeros(p.N, H, p.K, p.V, dtype=f32, device=dev)
        return (x.transpose(-1, -2) if state_v_first else x).to(f32).contiguous()

    h0, dht2 = state_in(initial_state), state_in(dht)

    # h and dh: a row per real chunk (the chunk table numbers them first; with the host's bounds their count is
    # known here, else the launch bound NCmax); every kernel reads and writes only real chunks' rows
    chunks = None if p.seq_bounds is None else chain_chunks(p.seq_bounds, p.N, C)  # per sequence (host values)
    n_hc = ncmax if chunks is None else max(sum(chunks), 1)
    if "bwd_fused" in kernels:
        h = _alloc((n_hc, H, p.K, p.V), dtype, dev)
        return _bwd_fused(p, kernels, q2, k2, v2, do2, g2, b2, A2, table, h0, dht2, h, masks, cu_seqlens, beta,
                          initial_state, state_v_first, C)
    # one allocation for both: the caching allocator rounds each large block up to 2 MiB, so two buffers of an odd
    # number of MiB (hk16_hv16 8k_4seq: 130 rows, 65 MiB each) would hold 2 MiB more at the backward's peak
    h, dh = _alloc((2, n_hc, H, p.K, p.V), dtype, dev).unbind(0)
    dv = _alloc((BT, H, p.V), dtype, dev)
    dvp = dv if dv_in_chunk(kernels) else _alloc((BT, H, p.V), dtype, dev)  # dV', then (sm90) dv over it
    dh0 = _alloc((p.N, H, p.K, p.V), f32, dev)
    # masks and factors of every chunk in parallel, then the two pipelined chunk recurrences
    Pg, Ag = mask_buffers(masks, BT, H, C, dtype, dev)
    fac = _alloc((ncmax, H, 3, C), f32, dev)
    kernels["bwd_prepare"](q2, k2, g2, b2, A2, bounds, Pg, Ag, fac, p.scale)
    no_skip = torch.empty(1, p.h_v, dtype=torch.int32, device=q.device)  # has_skip = 0: never read
    order = table.seq_order  # longest chains first
    if lanes is not None:
        dq_v, dk_v, dbeta, dg = _by_lanes(kernels, lanes, table, p, q2, k2, v2, do2, g2, b2, A2, Pg, Ag, fac, no_skip,
                                          h0, dht2, h, dh, dv, dh0, chunks)
        del Pg, Ag, fac
    else:
        with Beside(dev) as beside:  # the two recurrences side by side (streams.py)
            with beside.side():
                kernels["bwd_dh"](q2, k2, do2, Pg, Ag, fac, cu, offsets, order, no_skip, dht2,
                                  *dh_pass_rows(kernels, dh, dvp, dv), dh0, p.scale, 0)
            kernels["bwd_h"](k2, v2, A2, fac, cu, offsets, order, h0, h)
        del Pg, Ag, fac  # before chunk_grads allocates dq, dk, dbeta, dg (the lanes allocate those before the fork)
        dq_v, dk_v, dbeta, dg = chunk_grads(kernels, p, q2, k2, v2, do2, dvp, dv, g2, b2, A2, h, dh, bounds, C)
    del h, dh, dvp
    return gradients_out(p, table, cu_seqlens, dq_v, dk_v, dv, dbeta, dg, dh0, beta, initial_state, state_v_first)


def backward_lanes(chunks, h_v: int, tiles: tuple[int, ...], sm_count: int,
                   V: int = _HEAD_DIM) -> tuple[tuple[tuple[int, int], ...] | None, int]:
    """The lanes of the plain sm90 backward (`_by_lanes`) for sequences of ``chunks`` chunks each (host values) and
    the V tile of their recurrences, from ``tiles`` (the makespan model's tile first, then wider ones it may take
    instead): (runs of sequences (a, b), the one with the longest chain (the first of equals) first, then the runs
    before and after it; tile), or (None, tiles[0]): one launch of each kernel over every sequence (also with one
    sequence).
    auto: lanes at the first tile where the longest chain's two recurrences (2 h_v V / tile blocks of one SM each)
    leave at least half of the SMs to the other lanes. Measured (H100, h200-bwd phase bwd, results/h200/
    2026-12-06_s50/): lanes on against off where they take 64 blocks or fewer of 132: 0.959 - 1.006 (hk16_hv16 8k_8seq
    0.959, hk8_hv16 32k_4seq 0.967); where they take 128 (BV 32 at h_v 16, or h_v 32): 0.997 - 1.040, the other lanes'
    blocks waiting for the 4 SMs left; hk16_hv16 / hk8_hv16 8k_4seq with lanes at BV 64 against one launch at the
    model's BV 32: 0.941 / 0.957. QLABENCH_BWD_LANES=on|off forces them on at tiles[0] (wherever there are two runs)
    or off."""
    choice = env_choice("QLABENCH_BWD_LANES", ("auto", "on", "off"), "auto")
    i = list(chunks).index(max(chunks)) if len(chunks) else 0
    runs = tuple(r for r in ((i, i + 1), (0, i), (i + 1, len(chunks))) if r[1] > r[0])
    if choice == "off" or len(runs) < 2:
        return None, tiles[0]
    if choice == "on":
        return runs, tiles[0]
    for bv in tiles:
        if 2 * h_v * (V // bv) <= sm_count // 2:
            return runs, bv
    return None, tiles[0]


def _by_lanes(kernels, lanes, table, p, q2, k2, v2, do2, g2, b2, A2, Pg, Ag, fac, no_skip, h0, dht2, h, dh, dv, dh0,
              chunks):
    """The two recurrences and bwd_chunk per lane, the lanes side by side (streams.Lanes): lane i's bwd_dh on
    stream 2 i, its bwd_h on stream 2 i + 1, then its bwd_chunk over its own chunk rows there once both are done.
    The first lane (the longest chain's) takes the high-priority streams: its blocks are dispatched first, and the
    other lanes' recurrences and per-chunk gradients fill the SMs its long chains leave idle, where with one launch
    of each kernel bwd_chunk would wait for the last chain of all. Same kernels, same values; the lanes' tables
    (common/chunks.lane_table) give each launch its sequences, and views give it its rows of the per-sequence and
    per-chunk tensors; ``chunks``: every sequence's chunk count (host values). Returns dq, dk, dbeta, dg (as
    `chunk_grads`)."""
    from .common.chunks import lane_table

    dev, f32 = q2.device, f32_buffers(q2.dtype)
    BT, H, K = q2.shape[0], p.h_v, p.K
    dq = _alloc((BT, p.h_qk, K), q2.dtype, dev)
    dk = _alloc((BT, p.h_qk, K), q2.dtype, dev)
    dbeta = _alloc((BT, H), f32, dev)
    dg = _alloc((BT, H), f32, dev)
    tabs = [lane_table(table, a, b, chunks) for a, b in lanes]
    with Lanes(dev, tuple(i == 0 for i in range(len(tabs)) for _ in range(2))) as ln:
        for i, t in enumerate(tabs):
            a, b, c0, c1 = t.a, t.b, t.c0, t.c1
            with ln.on(2 * i):
                kernels["bwd_dh"](q2, k2, do2, Pg, Ag, fac, t.cu_seqlens, t.chunk_offsets, t.seq_order, no_skip,
                                  dht2[a:b], *dh_pass_rows(kernels, dh, dv, dv), dh0[a:b], p.scale, 0)
            with ln.on(2 * i + 1):
                kernels["bwd_h"](k2, v2, A2, fac, t.cu_seqlens, t.chunk_offsets, t.seq_order, h0[a:b], h)
            ln.wait(2 * i + 1, 2 * i)
            with ln.on(2 * i + 1):
                kernels["bwd_chunk"](q2, k2, v2, do2, dv, g2, b2, A2, h[c0:c1], dh[c0:c1], table.chunk_bounds[c0:c1],
                                     dq, dk, dbeta, dg, p.scale)
    return dq, dk, dbeta, dg


def _bwd_fused(p, kernels, q2, k2, v2, do2, g2, b2, A2, table, h0, dht2, h, masks, cu_seqlens, beta, initial_state,
               state_v_first, C):
    """The plain backward with bwd_dh=fused: bwd_prepare's factors, bwd_h's states, then bwd_fused per (sequence,
    v-head) from dht (no dh buffer, no dV' round trip)."""
    dev, dtype = q2.device, q2.dtype
    BT, H = p.B * p.T, p.h_v
    Pg, Ag = mask_buffers(masks, BT, H, C, dtype, dev)
    fac = _alloc((table.n_chunks_max, H, 3, C), torch.float32, dev)
    kernels["bwd_prepare"](q2, k2, g2, b2, A2, table.chunk_bounds, Pg, Ag, fac, p.scale)
    kernels["bwd_h"](k2, v2, A2, fac, table.cu_seqlens, table.chunk_offsets, table.seq_order, h0, h)
    del Pg, Ag, fac
    chains = fused_chains(table.cu_seqlens, table.chunk_offsets, table.seq_order)
    dq, dk, dv, dbeta, dg, dh0 = fused_grads(kernels, p, q2, k2, v2, do2, g2, b2, A2, h, dht2, chains)
    return gradients_out(p, table, cu_seqlens, dq, dk, dv, dbeta, dg, dh0, beta, initial_state, state_v_first)


def fused_chains(cu: torch.Tensor, chunk_offsets: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """bwd_fused's chain table `[n, 4]` int32 (bos, eos, index of the chain's first chunk in h, chain) in the dispatch
    ``order`` (`[n]`, a chunk table's seq_order: longest first) from a cu_seqlens of the chains and their chunk
    offsets; a CP plan has its own (`CPPlan.fused_chains`)."""
    n = order.long()
    return torch.stack([cu[n], cu[n + 1], chunk_offsets[n], n], 1).to(torch.int32).contiguous()


def fused_grads(kernels, p, q2, k2, v2, do2, g2, b2, A2, h, dht, chains, dv=None):
    """bwd_fused over ``chains`` (`fused_chains`) from their end gradients ``dht`` `[n, H_v, K, V]` fp32: dq, dk, dv
    (into ``dv`` when given) in q's dtype, dbeta, dg fp32 (flattened token axis) and the chains' start gradients
    `[n, H_v, K, V]` fp32."""
    dev, dtype = q2.device, q2.dtype
    BT, H = q2.shape[0], p.h_v
    dq = _alloc((BT, p.h_qk, p.K), dtype, dev)
    dk = _alloc((BT, p.h_qk, p.K), dtype, dev)
    dv = _alloc((BT, H, p.V), dtype, dev) if dv is None else dv
    f32 = f32_buffers(dtype)
    dbeta = _alloc((BT, H), f32, dev)
    dg = _alloc((BT, H), f32, dev)
    dh0 = _alloc(tuple(dht.shape), f32, dev)
    kernels["bwd_fused"](q2, k2, v2, do2, g2, b2, A2, h, dht, chains, dq, dk, dv, dbeta, dg, dh0, p.scale)
    return dq, dk, dv, dbeta, dg, dh0


def gradients_out(p, table, cu_seqlens, dq_v, dk_v, dv, dbeta, dg, dh0, beta, initial_state, state_v_first):
    """The API's gradients from the flattened buffers (the plain and the CP backward alike): the padding tail
    zeroed, the `[B, T, ...]` shapes, dbeta in beta's dtype, dh0 (``[N, H_v, K, V]`` fp32) in initial_state's
    layout and dtype, or None without initial_state."""
    BT, H = p.B * p.T, p.h_v
    if cu_seqlens is not None:  # dense inputs have no padding tail
        _zero_padding_tail(table, BT, (dq_v, dk_v, dv, dbeta, dg))
    dq = dq_v.to(dv.dtype).reshape(p.B, p.T, p.h_qk, p.K)  # no copy: chunk_grads returns q's dtype
    dk = dk_v.to(dv.dtype).reshape(p.B, p.T, p.h_qk, p.K)
    dv = dv.reshape(p.B, p.T, H, p.V)
    dbeta = dbeta.to(beta.dtype).reshape(p.B, p.T, H)
    dg = dg.reshape(p.B, p.T, H)
    if initial_state is None:
        return dq, dk, dv, dbeta, dg, None
    dh0 = (dh0.transpose(-1, -2) if state_v_first else dh0).to(initial_state.dtype).contiguous()
    return dq, dk, dv, dbeta, dg, dh0
