"""Input validation for the Gated DeltaNet API, shared by the reference and the kernels.

Every violation raises ``ValueError`` or ``TypeError`` naming the argument and the offending value,
before any device work is done.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

KERNEL_DTYPES = (torch.bfloat16, torch.float16)
KERNEL_HEAD_DIM = 128


@dataclass(frozen=True)
class Problem:
    """Sizes of one validated call.

    ``seq_bounds`` holds the (bos, eos) token range of each of the N sequences in the flattened
    ``[B*T]`` token axis; tokens outside every range (the varlen padding tail) produce zero output.
    """

    B: int
    T: int
    h_qk: int
    h_v: int
    K: int
    V: int
    N: int
    seq_bounds: tuple[tuple[int, int], ...] | None  # None only inside CUDA-graph capture
    scale: float

    @property
    def group(self) -> int:
        return self.h_v // self.h_qk


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def _check_tensor(name: str, x, ndim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {_shape(x)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


_HOST_VALUES: dict = {}


def _host_values(cu_seqlens: torch.Tensor) -> list[int] | None:
    """cu_seqlens as host ints. Reading a CUDA tensor syncs, which CUDA-graph capture forbids: while
    capturing, the values remembered from an earlier (eager) call with the same tensor are used, and
    None is returned when there is none (the value checks are then skipped; the kernels never need
    host values)."""
    key = (cu_seqlens.data_ptr(), str(cu_seqlens.device), cu_seqlens.numel(), cu_seqlens._version)
    if cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return _HOST_VALUES.get(key)
    values = [int(x) for x in cu_seqlens.tolist()]
    if cu_seqlens.is_cuda:
        if len(_HOST_VALUES) >= 64:
            _HOST_VALUES.pop(next(iter(_HOST_VALUES)))
        _HOST_VALUES[key] = values
    return values


def sequence_bounds(cu_seqlens, B: int, T: int) -> tuple[tuple[int, int], ...] | None:
    """Validates ``cu_seqlens`` and returns the (bos, eos) range of every sequence (None while a
    CUDA graph is being captured and the tensor was not seen before; see ``_host_values``)."""
    if cu_seqlens is None:
        return tuple((b * T, (b + 1) * T) for b in range(B))
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1:
        raise ValueError(f"cu_seqlens must be 1-D, got shape {_shape(cu_seqlens)}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens needs at least 2 entries, got {cu_seqlens.tolist()}")
    if B != 1:
        raise ValueError(f"with cu_seqlens the batch size B must be 1, got B={B}")
    cu = _host_values(cu_seqlens)
    if cu is None:
        return None
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[0]} (cu_seqlens={cu})")
    for a, b in itertools.pairwise(cu):
        if b < a:
            raise ValueError(f"cu_seqlens must be non-decreasing, got {cu}")
    if cu[-1] > T:
        raise ValueError(f"cu_seqlens ends at {cu[-1]}, beyond the token count T={T}")
    return tuple(itertools.pairwise(cu))


def validate(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    cu_seqlens=None,
    state_v_first: bool = False,
    for_kernels: bool = False,
) -> Problem:
    """Checks shapes, dtypes and their agreement; returns the problem sizes.

    Args:
        q: `[B, T, H_qk, K]`. k: `[B, T, H_qk, K]`. v: `[B, T, H_v, V]`.
        g: `[B, T, H_v]` natural-log gate. beta: `[B, T, H_v]`.
        initial_state: `[N, H_v, K, V]` (`[N, H_v, V, K]` with ``state_v_first``).
        for_kernels: also enforce what the GPU kernels need (bf16/fp16 q, k, v; K == V == 128).
    """
    for name, x, nd in (("q", q, 4), ("k", k, 4), ("v", v, 4), ("g", g, 3), ("beta", beta, 3)):
        _check_tensor(name, x, nd)
    if _shape(k) != _shape(q):
        raise ValueError(f"k must have the shape of q {_shape(q)}, got {_shape(k)}")
    B, T, h_qk, K = _shape(q)
    if v.shape[0] != B or v.shape[1] != T:
        raise ValueError(f"v must be [B={B}, T={T}, H_v, V], got {_shape(v)}")
    h_v, V = v.shape[2], v.shape[3]
    if h_qk == 0 or h_v % h_qk != 0:
        raise ValueError(f"H_v must be a multiple of H_qk, got H_v={h_v}, H_qk={h_qk}")
    for name, x in (("g", g), ("beta", beta)):
        if _shape(x) != (B, T, h_v):
            raise ValueError(f"{name} must be [B, T, H_v] = {(B, T, h_v)}, got {_shape(x)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got q={q.dtype}, k={k.dtype}, v={v.dtype}")
    devices = {x.device for x in (q, k, v, g, beta)}
    if len(devices) != 1:
        raise ValueError(f"q, k, v, g, beta must be on one device, got {sorted(map(str, devices))}")
    if for_kernels:
        if q.dtype not in KERNEL_DTYPES:
            raise TypeError(f"the kernels take bf16 or fp16 q, k, v, got {q.dtype}")
        if K != KERNEL_HEAD_DIM or V != KERNEL_HEAD_DIM:
            raise ValueError(f"the kernels need K == V == {KERNEL_HEAD_DIM}, got K={K}, V={V}")
    if scale is None:
        scale = K**-0.5
    elif not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    elif not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    if not isinstance(state_v_first, bool):
        raise TypeError(f"state_v_first must be a bool, got {state_v_first!r}")
    bounds = sequence_bounds(cu_seqlens, B, T)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if initial_state is not None:
        _check_tensor("initial_state", initial_state, 4)
        want = (N, h_v, V, K) if state_v_first else (N, h_v, K, V)
        if _shape(initial_state) != want:
            layout = "[N, H_v, V, K]" if state_v_first else "[N, H_v, K, V]"
            raise ValueError(f"initial_state must be {layout} = {want} for N={N} sequences, "
                             f"got {_shape(initial_state)}")
        if initial_state.device != q.device:
            raise ValueError(f"initial_state is on {initial_state.device}, q on {q.device}")
    return Problem(B=B, T=T, h_qk=h_qk, h_v=h_v, K=K, V=V, N=N, seq_bounds=bounds, scale=float(scale))
