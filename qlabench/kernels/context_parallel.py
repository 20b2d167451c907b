"""Inter-card context parallelism (CP) for Gated DeltaNet over torch.distributed.

One long sequence is cut into contiguous slices, one per rank of a process group, in rank order
(rank r holds tokens [o_r, o_r + L_r) with o_r = L_0 + ... + L_{r-1}). Per v-head the recurrence is
affine in the state, so a slice maps its incoming state S_in to its outgoing state as

    S_out = M S_in + S_loc,       M = prod over the slice's chunks of M_c   (K x K)
                                  M_c = exp(gam_C) (I - K^T A_k diag(beta) K)

where S_loc (K x V) is the slice's final state from a zero start. Both come out of ONE run of the
recurrence on the slice with values [V | 0] (width V + K) from the initial state [0 | I]: the first
V columns evolve into S_loc, the last K columns (no value input, identity start) into M.

Forward, on every rank r of P (world size 1 is the plain call):
1. local pass: rank 0 runs its slice from the user's h0 and keeps its final state S_out(0) (its
   outputs are final already); ranks 1..P-2 compute [S_loc(r) | M(r)]; rank P-1 sends nothing
   useful (no one reads it) and skips the pass.
2. exchange: one all-gather of the `[B, H_v, K, V + K]` payloads (tiny next to the activations).
3. chain: S_in(1) = S_out(0), S_in(j+1) = S_loc(j) + M(j) S_in(j), up to j = r - 1.
4. output pass: ranks r >= 1 rerun their slice from S_in(r); the last rank's final state is the
   sequence's final state (returned there, None elsewhere).
Critical path: two slice passes per rank, whatever P; the chain is P small matmuls.

Backward is autograd through the same graph, which is the mirror image: the chain's backward sends
dS_in(j) = M(j)^T dS_in(j+1) from the last rank towards rank 0 and dM(j) = dS_in(j+1) S_in(j)^T; the
all-gather's backward all-reduces the gradient of the gathered payloads so that rank j receives the
gradient of (S_loc(j), M(j)) from every later rank, then backpropagates it through its local pass.
dq, dk, dv, dg, dbeta come out per rank for its slice, dh0 on rank 0. The backward contains a
collective, so every rank must backpropagate through its `o` (as usual with CP losses that are sums
over ranks); a rank that skips its backward leaves the others waiting.

Gate-decay truncation (optional, ``decay_threshold``): if for every (sequence, head) the slice's
tokens [s, L) alone decay the state below exp(threshold), i.e. sum_{t >= s} g_t < threshold, the
middle ranks run the local pass on [s, L) only (s chunk-aligned, as large as possible) and send
M = 0. With ||k_t||_2 = 1 and 0 <= beta_t <= 2 every factor I - beta_t k_t k_t^T is non-expansive,
so ||M_[s,L)||_2 <= exp(sum_{t>=s} g_t) < exp(threshold) and the error this makes in S_in(r+1) is at
most exp(threshold) (||S_[0,s)||_2 + ||S_in(r)||_2) (spectral norms; S_[0,s) the local state after
token s - 1 from a zero start); later transitions do not amplify it under the same conditions. Without
normalised keys the bound does not hold; the default (None) is exact.

Per-rank compute (``impl``): "reference" runs the float64 chunked oracle (CPU or GPU, any head
dims; returns float64); "kernels" runs `qlabench.kernels.chunk_gated_delta_rule` (bf16/fp16, K = V =
128, CUDA), where [S_loc | M] needs two calls (v from 0, and v = 0 from I) because the kernels fix
the value width at 128. The gloo/CPU tests cover "reference"; "kernels" is untested without GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .reference import chunk_gated_delta_rule_ref
from .validate import validate

__all__ = [
    "CPContext",
    "chunk_gated_delta_rule_cp",
    "plan_truncation",
]

IMPLS = ("reference", "kernels")


@dataclass(frozen=True)
class CPContext:
    """Where this rank's slice sits in the one sequence that the group's ranks share.

    Args:
        group: the `torch.distributed` process group of the CP ranks (None: the default group).
            Rank order in the group is sequence order.
        lengths: tokens per rank, in rank order (uneven splits). None: every rank holds the same
            number of tokens (not checked across ranks).

    Raises:
        ValueError: torch.distributed is not initialised, or ``lengths`` has the wrong count or a
            non-positive entry.
        TypeError: ``lengths`` holds non-integers.
    """

    group: Any = None
    lengths: tuple[int, ...] | None = None

    def __post_init__(self):
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("CPContext needs an initialised torch.distributed process group "
                             "(call torch.distributed.init_process_group first)")
        if self.lengths is not None:
            lengths = tuple(self.lengths)
            for n in lengths:
                if not isinstance(n, int) or isinstance(n, bool):
                    raise TypeError(f"lengths must hold ints, got {lengths!r}")
                if n < 1:
                    raise ValueError(f"every rank needs at least one token, got lengths={lengths}")
            if len(lengths) != self.world_size:
                raise ValueError(f"lengths has {len(lengths)} entries for a group of "
                                 f"{self.world_size} ranks: {lengths}")
            object.__setattr__(self, "lengths", lengths)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    def token_range(self, local_len: int | None = None) -> tuple[int, int]:
        """[start, end) of this rank's slice in the whole sequence; ``local_len`` is needed (and
        used for every rank) when ``lengths`` is None."""
        if self.lengths is not None:
            start = sum(self.lengths[: self.rank])
            return start, start + self.lengths[self.rank]
        if local_len is None:
            raise ValueError("token_range needs local_len when the context has no lengths")
        return self.rank * local_len, (self.rank + 1) * local_len


class _AllGather(torch.autograd.Function):
    """Stacks every rank's `x` into `[P, *x.shape]`; backward all-reduces the incoming gradient (each
    rank's loss may read every rank's payload) and returns this rank's row."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


class _DependOn(torch.autograd.Function):
    """Identity on `x` that makes `x` depend on `anchor` in the autograd graph (zero gradient), so
    that every rank reaches the exchange's collective backward, also rank 0, whose outputs do not
    read the exchange."""

    @staticmethod
    def forward(ctx, x, anchor):
        ctx.anchor_meta = (anchor.shape, anchor.dtype, anchor.device)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        shape, dtype, device = ctx.anchor_meta
        return grad, torch.zeros(shape, dtype=dtype, device=device)


def plan_truncation(g: torch.Tensor, threshold: float | None, chunk_size: int) -> int | None:
    """First token of the truncated local pass, or None when the whole slice is needed.

    Returns the largest chunk-aligned s < L with sum_{t >= s} g[b, t, h] < threshold for every
    (b, h) of `g` `[B, L, H_v]` (reads g on the host).
    """
    if threshold is None:
        return None
    L = g.shape[1]
    tail = g.detach().double().flip(1).cumsum(1).flip(1)  # tail[:, s] = sum_{t >= s} g_t
    worst = tail.amax(dim=(0, 2)).cpu()
    for s in range((L - 1) // chunk_size * chunk_size, -1, -chunk_size):
        if worst[s] < threshold:
            return s
    return None


def _local_pass(q, k, v, g, beta, scale, initial_state, output_final_state, impl, l2norm, chunk_size):
    """One slice's recurrence from `initial_state` (`[B, H_v, K, V]`, key-first, or None)."""
    if impl == "reference":
        return chunk_gated_delta_rule_ref(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                          output_final_state=output_final_state,
                                          use_qk_l2norm_in_kernel=l2norm, chunk_size=chunk_size)
    from . import chunk_gated_delta_rule

    return chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state, use_qk_l2norm_in_kernel=l2norm)


def _slice_map(q, k, v, g, beta, scale, impl, l2norm, chunk_size, state_dtype):
    """`[B, H_v, K, V + K]` = [S_loc | M]: the slice's state map S_in -> M S_in + S_loc."""
    B, _, H, V = v.shape
    K = k.shape[-1]
    eye = torch.eye(K, dtype=state_dtype, device=v.device).expand(B, H, K, K)
    if impl == "reference":
        v_ext = torch.cat([v, v.new_zeros(v.shape[:3] + (K,))], dim=-1)
        h_ext = torch.cat([eye.new_zeros(B, H, K, V), eye], dim=-1)
        _, state = _local_pass(q, k, v_ext, g, beta, scale, h_ext, True, impl, l2norm, chunk_size)
        return state
    _, S_loc = _local_pass(q, k, v, g, beta, scale, None, True, impl, l2norm, chunk_size)
    _, M = _local_pass(q, k, torch.zeros_like(v), g, beta, scale, eye.contiguous(), True, impl, l2norm,
                       chunk_size)
    return torch.cat([S_loc, M], dim=-1)


def chunk_gated_delta_rule_cp(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, cp_context,
    impl=None, use_qk_l2norm_in_kernel=False, state_v_first=False, decay_threshold=None, chunk_size=64,
):
    """Gated DeltaNet over one sequence split across the ranks of ``cp_context`` (this rank's slice).

    Args:
        q, k: `[B, L, H_qk, K]` this rank's tokens. v: `[B, L, H_v, V]`. g, beta: `[B, L, H_v]`.
            Each of the B rows is one sequence, split across the ranks the same way.
        scale: defaults to K^-1/2.
        initial_state: `[B, H_v, K, V]` (`[B, H_v, V, K]` with ``state_v_first``), given on rank 0
            only (the sequence starts there); must be None on other ranks.
        output_final_state: return the sequence's final state on the last rank (None elsewhere).
        cp_context: a `CPContext`.
        impl: "reference" (float64 oracle; default for CPU tensors) or "kernels" (our GPU kernels;
            default for CUDA tensors).
        decay_threshold: None (exact) or a negative float enabling the gate-decay truncation (see the
            module docstring for the error bound).
        chunk_size: the reference's chunk size, and the alignment of the truncated pass.

    Returns:
        (o `[B, L, H_v, V]` for this rank's tokens, final_state `[B, H_v, K, V]` or None); float64
        with "reference", q's dtype / fp32 with "kernels".

    Raises:
        TypeError / ValueError for bad input, naming the value.
    """
    if not isinstance(cp_context, CPContext):
        raise TypeError(f"cp_context must be a CPContext, got {type(cp_context).__name__}")
    if impl is None:
        impl = "kernels" if q.device.type == "cuda" else "reference"
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if decay_threshold is not None:
        if not isinstance(decay_threshold, (int, float)) or isinstance(decay_threshold, bool):
            raise TypeError(f"decay_threshold must be a float or None, got {decay_threshold!r}")
        if not decay_threshold < 0:
            raise ValueError(f"decay_threshold must be negative, got {decay_threshold}")
    rank, P = cp_context.rank, cp_context.world_size
    if rank != 0 and initial_state is not None:
        raise ValueError(f"initial_state belongs to the start of the sequence, held by rank 0; "
                         f"got one on rank {rank}")
    p = validate(q, k, v, g, beta, scale, initial_state, None, state_v_first,
                 for_kernels=impl == "kernels")
    if cp_context.lengths is not None and p.T != cp_context.lengths[rank]:
        raise ValueError(f"rank {rank} holds {p.T} tokens, but cp_context.lengths says "
                         f"{cp_context.lengths[rank]} ({cp_context.lengths})")
    h0 = initial_state.transpose(-1, -2) if (initial_state is not None and state_v_first) else initial_state
    state_dtype = torch.float64 if impl == "reference" else torch.float32
    args = (p.scale, impl, use_qk_l2norm_in_kernel, chunk_size)

    def finish(o, final):
        if final is not None and state_v_first:
            final = final.transpose(-1, -2)
        return o, (final if output_final_state else None)

    if P == 1:
        return finish(*_local_pass(q, k, v, g, beta, p.scale, h0, output_final_state, impl,
                                   use_qk_l2norm_in_kernel, chunk_size))

    o = final = None
    if rank == 0:
        o, final = _local_pass(q, k, v, g, beta, p.scale, h0, True, impl, use_qk_l2norm_in_kernel,
                               chunk_size)
        payload = torch.cat([final, final.new_zeros(p.B, p.h_v, p.K, p.K)], dim=-1)
        final = None
    elif rank < P - 1:
        s = plan_truncation(g, decay_threshold, chunk_size)
        if s is None:
            payload = _slice_map(q, k, v, g, beta, *args, state_dtype)
        else:
            tail = (x[:, s:].contiguous() for x in (q, k, v, g, beta))
            _, S_loc = _local_pass(*tail, p.scale, None, True, impl, use_qk_l2norm_in_kernel, chunk_size)
            payload = torch.cat([S_loc, S_loc.new_zeros(p.B, p.h_v, p.K, p.K)], dim=-1)
    else:
        payload = torch.zeros(p.B, p.h_v, p.K, p.V + p.K, dtype=state_dtype, device=q.device)
        # The exchange's backward is a collective: the last rank must reach it too, although no
        # one reads its payload, so the payload joins the graph whenever the inputs do.
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, g, beta))
        payload.requires_grad_(needs_grad)

    gathered = _AllGather.apply(payload.to(state_dtype), cp_context.group)
    if rank > 0:
        S_in = gathered[0, ..., : p.V]
        for j in range(1, rank):
            S_in = gathered[j, ..., : p.V] + gathered[j, ..., p.V:] @ S_in
        o, final = _local_pass(q, k, v, g, beta, p.scale, S_in, output_final_state and rank == P - 1,
                               impl, use_qk_l2norm_in_kernel, chunk_size)
    return finish(_DependOn.apply(o, gathered), final)
