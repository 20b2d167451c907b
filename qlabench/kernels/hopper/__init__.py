"""Hopper (sm90) kernels, forward and backward; dispatch.KERNEL_MODULES maps each role to its file.

Forward: kkt_solve, the chunk recurrences chunk_fwd_ws and chunk_fwd_wy (sm90's defaults at V tile 32
and 64), chunk_fwd_pipelined and chunk_fwd (KernelOptions.fwd_kernel).
Backward: bwd_prepare, bwd_h_ws, bwd_dh_pipelined (bwd_dh_ws: KernelOptions.bwd_dh), bwd_chunk (every
per-chunk gradient in one kernel); bwd_common holds their shared compile call.
"""
