"""kkt_solve for sm120 / sm121: hopper/kkt_solve.py compiled for sm_120a at C = 32 (two 16 x 16
diagonal blocks and one 16 -> 32 merge on CUDA cores; K K^T and Q K^T as mma.sync), with the
shared-memory budget of one sm120 block checked on the compiled kernel (see the package docstring)."""

import functools

from ..hopper import kkt_solve as _hopper
from . import check_shared_memory


@functools.cache
def kkt_solve_kernel(h_qk: int, h_v: int, K: int, C: int, dtype: str, arch: str, store_a: bool = True):
    kernel = _hopper.kkt_solve_kernel(h_qk, h_v, K, C, dtype, arch, store_a)
    return check_shared_memory(kernel, f"kkt_solve hk{h_qk}_hv{h_v} C={C} {dtype}")
