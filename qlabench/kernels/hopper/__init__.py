"""Hopper (sm90) kernels, forward and backward; dispatch.KERNEL_MODULES maps each role to its file.

Forward: kkt_solve, the chunk recurrences chunk_fwd_ws, chunk_fwd_wy and chunk_fwd_v128 (sm90's defaults at V
tile 32, 64 and 128), chunk_fwd_pipelined and chunk_fwd (KernelOptions.fwd_kernel).
Backward: bwd_prepare, bwd_h_ws, bwd_dh_pipelined (bwd_dh_ws: KernelOptions.bwd_dh), bwd_chunk (every
per-chunk gradient in one kernel); bwd_common holds their shared compile call.
"""
