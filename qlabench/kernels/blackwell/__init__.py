"""sm100 / sm103 (datacenter Blackwell) kernels: the forward's kkt_solve and chunk recurrence with
their products as tcgen05 MMAs into tensor-memory accumulators (compiled only; see each header).
The sm100 backward still compiles the Hopper files for sm_100a (dispatch.KERNEL_MODULES)."""
