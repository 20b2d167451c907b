"""chunk_fwd for sm120 / sm121: hopper/chunk_fwd.py (same signature, same chunk recurrence, chunk
skip included) compiled for sm_120a at C = 32, where its products are mma.sync and the pipelined
variant's loads TMA, with the shared-memory budget of one sm120 block (99 KB) checked on every
compiled kernel (see the package docstring)."""

import functools

from ..hopper import chunk_fwd as _hopper
from . import check_shared_memory


@functools.cache
def chunk_fwd_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, state_v_first: bool,
                     arch: str, pipelined: bool = False):
    kernel = _hopper.chunk_fwd_kernel(h_qk, h_v, K, V, BV, C, dtype, state_v_first, arch, pipelined)
    name = "chunk_fwd_pipelined" if pipelined else "chunk_fwd"
    return check_shared_memory(kernel, f"{name} hk{h_qk}_hv{h_v} BV={BV} C={C} {dtype}")


@functools.cache
def chunk_fwd_pipelined_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str,
                               state_v_first: bool, arch: str):
    """The pipelined variant (its own kernel role in dispatch)."""
    return chunk_fwd_kernel(h_qk, h_v, K, V, BV, C, dtype, state_v_first, arch, True)
