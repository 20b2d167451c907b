"""Facts read from a compiled TileLang kernel's generated sources, shared by the compile tests."""

from __future__ import annotations

import re

SMEM_PER_BLOCK = 232448  # 227 KB: the most shared memory one block may opt into on the H200


def dynamic_shared_memory(kernel) -> int:
    """Dynamic shared memory (bytes) the generated host code launches the kernel with: the last launch
    argument filled in before the packed kernel call."""
    host = kernel.get_host_source()
    call = re.search(r"TVMFFIFunctionCall\((\w+)_kernel_packed, \(TVMFFIAny\*\) stack_ffi_any, (\d+)", host)
    assert call is not None, "no kernel launch in the host code"
    last = int(call.group(2)) - 1
    sizes = re.findall(rf"stack_ffi_any\)\[{last}\]\.v_int64\) = \(\(int64_t\)(\d+)\)", host[:call.start()])
    assert sizes, "no dynamic shared memory size in the host code"
    return int(sizes[-1])
