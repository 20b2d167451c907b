"""Hopper (sm90) kernels: kkt_solve and the chunk-recurrence forward."""
