"""sm100 / sm103 (datacenter Blackwell) kernels: the forward (kkt_solve, chunk recurrence) and the five
backward kernels with their matrix products as tcgen05 MMAs into tensor-memory accumulators, completion
on mbarriers, tcgen05.ld read-back. Same factories and kernel signatures as the Hopper files they
replace (dispatch.KERNEL_MODULES). Compiled only (never run on Blackwell); each header lists the
evidence from the generated source and SASS."""
