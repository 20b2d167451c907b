"""sm120 / sm121 (consumer Blackwell) forward kernels, chunk size 32; no backward.

sm120 has neither Hopper's wgmma nor sm100's tcgen05 / tensor memory: its tensor cores are driven by
warp-level mma.sync, and TMA exists. The Hopper forward files are already written for that subset
(plain ``T.gemm`` with shared-memory operands lowers to mma.sync there, the pipelined recurrence's
loads to TMA), so this package re-exports them, compiled for ``sm_120a`` at C = 32, and adds the one
check that is specific to the chip: a block may use at most 99 KB (101,376 B) of shared memory, about
half of Hopper's 227 KB. Each factory compiles the Hopper kernel and reads the launch's dynamic shared
memory from the generated host code; a kernel over the budget raises ValueError at compile time
instead of failing to launch on the device.

Measured with TileLang 0.1.15 / nvcc 13.0 on a CPU-only machine (compiled only, never run on sm120):
at C = 32 the largest forward kernel (chunk_fwd_pipelined, BV = 64) asks for about 78 KB.
The backward is not implemented for sm120: ``dispatch.kernel_factory`` raises NotImplementedError for
its roles, and the API raises before any work.
"""

from __future__ import annotations

import re

SMEM_PER_BLOCK = 101376  # bytes of shared memory one block may opt into on sm_120 / sm_121 (99 KB)


def dynamic_shared_memory(kernel) -> int:
    """Dynamic shared memory (bytes) the host code of a compiled TileLang kernel launches it with.

    The generated host wrapper fills the launch arguments into ``stack_ffi_any`` and passes the
    dynamic shared memory size as the last one before calling ``<name>_kernel_packed``."""
    host = kernel.get_host_source()
    call = re.search(r"TVMFFIFunctionCall\((\w+)_kernel_packed, \(TVMFFIAny\*\) stack_ffi_any, (\d+)", host)
    if call is None:
        raise RuntimeError("no kernel launch found in the generated host code")
    last = int(call.group(2)) - 1
    sizes = re.findall(rf"stack_ffi_any\)\[{last}\]\.v_int64\) = \(\(int64_t\)(\d+)\)", host[:call.start()])
    if not sizes:
        raise RuntimeError("no dynamic shared memory size found in the generated host code")
    return int(sizes[-1])


def check_shared_memory(kernel, what: str):
    """``kernel`` if its dynamic shared memory fits one sm120 block, else ValueError naming ``what``."""
    used = dynamic_shared_memory(kernel)
    if used > SMEM_PER_BLOCK:
        raise ValueError(f"{what} needs {used} B of shared memory per block; sm120 allows {SMEM_PER_BLOCK} B")
    return kernel
