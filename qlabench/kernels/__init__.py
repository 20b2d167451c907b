"""Gated DeltaNet chunked prefill: public API behind FLA's `chunk_gated_delta_rule` signature."""

from __future__ import annotations

import torch

from .options import KernelOptions, option_value
from .validate import validate

__all__ = ["KernelOptions", "chunk_gated_delta_rule", "kernels_available"]


def kernels_available(device=None) -> tuple[bool, str]:
    """(True, "") when our kernels can run on ``device`` (default: the current CUDA device)."""
    if not torch.cuda.is_available():
        return False, "no CUDA device (use qlabench.kernels.reference for CPU)"
    try:
        import tilelang  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure makes the kernels unavailable
        return False, f"tilelang does not import: {exc}"
    from .dispatch import arch_for_device

    try:
        arch_for_device(torch.device("cuda") if device is None else device)
    except ValueError as exc:
        return False, str(exc)
    return True, ""


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """Differentiable L2 normalisation in fp32, returned in x's dtype (autograd gives its backward)."""
    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + 1e-6)).to(x.dtype)


def cp_mode(options: KernelOptions | None = None) -> str:
    """Intra-card CP switch of the forward and its backward: ``options.cp``, or without options
    QLABENCH_CP: auto (the default: `cp_rule`), on (cp.py's pieces wherever a sequence can be cut) or
    off."""
    return option_value(options, "cp")


# cp=auto's rule (the default), measured on the H200 (results/h200/NOTES.md, sessions 6, 8 and 9): CP pays
# where few (sequence, v-head) chains run long, and its backward gains more than its forward. Kernel sums,
# off vs on, us: forward / backward at 8 chains hk2_hv8 1x8192 236 vs 263 / 645 vs 421, 1x16384 463 vs
# 375 / 1256 vs 725, 12288+4096 (10.7 effective chains) 367 vs 346 / 1036 vs 700; at 16 chains hk16_hv16
# 1x16384 530 vs 596 / 1764 vs 1513 (hk4_hv16 alike), 1x32768 1034 vs 1003 / 3487 vs 2885; at 32+
# chains both lost. Timed end to end (CUDA graph, h200-fwd) the CP forward also pays ~40 us of launch
# gaps over its kernel sum: hk2_hv8 1x16384 0.462 -> 0.422 ms and 24576+8192 0.716 -> 0.682, but
# 12288+4096 0.365 -> 0.395; so the forward-only entries start at 16384 tokens (8 chains) and 24576
# (12 chains). A call takes CP when cp.py's plan turns on and some (chains, tokens) entry of the
# rule admits it: at most that many effective chains (H_v * total chunks / the longest sequence's chunks,
# cp.py's Be * H) and a sequence of at least that many tokens. A forward whose inputs require grad takes
# the training entries (its backward reuses the pieces), an inference forward the forward-only ones.
CP_RULE_FORWARD = ((8, 16384), (12, 24576), (16, 28672))
# The training entries were refitted in session 25 on the kernels of 09b0d35 (results/h200/2026-12-04_s25/cp-ab.json:
# h200-bwd's 40 cases, cp=on against cp=off + bwd_cp=off in one call, forward + backward time on / off; session 16's
# fit, results/h200/2026-12-02_s16/cp-ab.json, predates the cheaper CP glue of sessions 22-23): CP won at <= 10.3
# effective chains from 5809 tokens (0.33-0.74), 11.4 chains of 5809 (0.89), 13.3 of 9932 (0.76), 16 from 8192
# (0.71-0.86), 18.6 of 7053 (0.92-0.93), 19.1 of 13725 (0.89), 20.5 of 25556 (0.83-0.84) and 26.6 of 9932 (0.92);
# it lost at 10.6 chains of 3157 tokens (1.01), 21.1 of 3157 (1.26), 22.9 of 5809 (1.09) and at 32+ chains
# (1.03-1.34). Every measured case falls on its winning side. Re-measured in session 43 with the cheaper glue of
# sessions 40-42 (results/h200/2026-12-06_s43/call1/cp_on_vs_auto.txt, H100, cp=on against auto at the 10 h200-bwd
# rows auto leaves off with at most 56 effective chains): CP still lost every training step (1.14-1.42) and every
# backward measured (1.08-1.26; 9 rows), so the entries stand.
CP_RULE_TRAINING = ((6, 4096), (12, 5120), (20, 6144), (28, 9216))
# Where the backward takes hopper/bwd_fused (sm90, H_v == H_qk, bwd_dh auto or fused; backward.cp_dh_choice) the
# training rule also admits up to 56 effective chains (cp.py's own bound for 128+ chunks at 132 SMs) with a sequence
# of 9216+ tokens, measured in session 31 (results/h200/2026-12-04_s31/, hk16_hv16, cp=on with bwd_fused against
# cp=auto's plain path): 32k_4seq (38.3 chains) backward 1.331 -> 1.177 ms, forward + backward 1.890 -> 1.893; 32k_8seq
# (53.1) 1.295 -> 1.210 and 1.816 -> 1.898 (1.05x), with peak memory 908 -> 700 / 916 -> 708 MiB (backward) and
# 1234 -> 1063 / 1246 -> 1078 (forward + backward): the plain path's per-chunk dh buffer is what kept those rows over
# 1.25x flash-qla's peak, so the 32k_8seq training step trades 5% of its time for it. Without a 9216-token sequence
# CP lost the step: 8k_4seq (22.9 chains of 5809) 1.13x, 8k_8seq 1.24x. Only measured at 16 v-heads (several
# sequences), so the entry stops there: more heads take CP_RULE_TRAINING alone.
CP_RULE_TRAINING_FUSED = ((56, 9216),)
CP_RULE_TRAINING_FUSED_MAX_HEADS = 16
# The training plan's piece length, measured in session 27 (results/h200/2026-12-04_s27/alpha/: h200-bwd's CP presets,
# cp.py's alpha 6 against its ALPHA = 3, i.e. pieces twice as long, forward + backward time a6 / a3): longer pieces
# won where few long chains run, with the longest sequence holding at least half the tokens (Be <= 2): 4-11.4
# effective chains 0.89-0.96 (hk4_hv8 8k_1seq 0.479 -> 0.425 ms, 32k_1seq 1.281 -> 1.173; hk2_hv4 32k_1seq 0.791 ->
# 0.730), 16 chains of one 32768-token sequence 0.99 (hk16_hv16 2.145 -> 2.125, hk8_hv16 2.059 -> 2.037; backward
# alone 0.98). They lost at 16 chains of 8192 tokens (1.01-1.03), 18.6-20.5 chains of two sequences (1.01-1.03) and
# on 32768 tokens in 4 or 8 sequences (9.6-26.6 chains, Be 2.4-3.3: 0.99-1.08). Entries (most effective chains,
# fewest tokens of the longest sequence), each with Be <= CP_LONG_MAX_BATCH, as CP_RULE_TRAINING's.
CP_LONG_PIECES = ((12, 0), (16, 32768))
CP_LONG_MAX_BATCH = 2.0
CP_ALPHA_LONG = 6.0


def _cp_rule_admits(chains: float, longest: int, for_backward: bool, fused: bool = False) -> bool:
    """Some entry of the table (training, with ``fused`` also CP_RULE_TRAINING_FUSED's, or forward-only) admits
    ``chains`` effective chains whose longest sequence has ``longest`` tokens."""
    rule = (CP_RULE_TRAINING + (CP_RULE_TRAINING_FUSED if fused else ())) if for_backward else CP_RULE_FORWARD
    return any(chains <= max_chains and longest >= min_tokens for max_chains, min_tokens in rule)


def cp_rule(plan, heads: int, for_backward: bool = False, fused: bool = False) -> bool:
    """cp=auto's decision for an enabled cp.py ``plan`` of a call with ``heads`` v-heads (see above);
    ``for_backward``: the call's backward will run (the training entries); ``fused``: that backward can take
    bwd_fused (`_fused_backward`)."""
    from .cp import effective_chains

    tokens = plan.seq_tokens
    chains = effective_chains(tokens, heads, plan.chunk_size)
    return _cp_rule_admits(chains, max(tokens, default=0), for_backward, fused)


def training_alpha(chains: float, heads: int, longest: int) -> float:
    """cp.py's piece-length factor for a forward whose backward follows, with ``chains`` effective chains over
    ``heads`` v-heads and a longest sequence of ``longest`` tokens: CP_ALPHA_LONG where an entry of CP_LONG_PIECES
    admits the call (see above), else cp.ALPHA."""
    from .cp import ALPHA

    if chains > CP_LONG_MAX_BATCH * heads:
        return ALPHA
    long = any(chains <= max_chains and longest >= min_tokens for max_chains, min_tokens in CP_LONG_PIECES)
    return CP_ALPHA_LONG if long else ALPHA


def _forward(q, k, v, g, beta, *, scale, initial_state, cu_seqlens, output_final_state, output_h, state_v_first,
             options: KernelOptions | None = None, for_backward: bool = False):
    """The forward kernels, with intra-card CP (forward_cp.py) when the plan turns it on (``for_backward``:
    a backward will follow, `cp_rule`; without it A is neither written nor returned: None).

    Returns chunk_gated_delta_rule_fwd's five entries plus ``cp`` = (plan, h0_pieces, transitions) when CP ran,
    else None: the backward runs its CP mirror (backward_cp.py) from the same pieces; and with ``for_backward``
    kkt_solve's masks (`forward.KktMasks`: the backward's bwd_prepare forms only what is missing), else None.
    """
    from .forward import chunk_gated_delta_rule_fwd

    plan = _cp_plan(q, v, cu_seqlens, options, for_backward=for_backward) if not output_h else None
    if plan is not None:
        from .forward_cp import chunk_gated_delta_rule_fwd_cp

        *out, h0_pieces, transitions, masks = chunk_gated_delta_rule_fwd_cp(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
            output_final_state=output_final_state, state_v_first=state_v_first, plan=plan,
            transition="always", return_piece_states=True, options=options,  # "always": no host read
            keep_a=for_backward, return_masks=True)
        return (*out, (plan, h0_pieces, transitions), masks if for_backward else None)
    *out, masks = chunk_gated_delta_rule_fwd(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
        output_final_state=output_final_state, output_h=output_h, state_v_first=state_v_first,
        options=options, keep_a=for_backward, return_masks=True)
    return (*out, None, masks if for_backward else None)


def _fused_backward(q, v, options: KernelOptions | None = None) -> bool:
    """Whether a CP backward of this call can take hopper/bwd_fused (backward.cp_dh_choice's conditions other than the
    chain count): the device's arch has it, H_v == H_qk and bwd_dh is auto or fused."""
    from .backward import _dh_choice, fused_fits
    from .dispatch import arch_for_device

    bwd_dh = None if options is None else options.bwd_dh
    return _dh_choice(bwd_dh) in ("auto", "fused") and fused_fits(arch_for_device(q.device), q.shape[2], v.shape[2])


def _cp_plan(q, v, cu_seqlens, options: KernelOptions | None = None, mode: str | None = None,
             for_backward: bool = False):
    """The CP plan of a call when ``mode`` (default: the cp option, QLABENCH_CP without options) and
    the plan's rule (`cp_rule` with ``for_backward``) turn CP on, else None."""
    mode = cp_mode(options) if mode is None else mode
    if mode == "off":
        return None
    B, T, H = v.shape[:3]
    fused = for_backward and H <= CP_RULE_TRAINING_FUSED_MAX_HEADS and _fused_backward(q, v, options)
    if mode == "auto" and not _cp_rule_admits(H, T, for_backward, fused):
        return None  # cp_rule decided from shapes alone (chains >= H_v, longest <= T): no plan, no host read
    from .cp import plan_cp
    from .dispatch import arch_for_device
    from .forward import _sm_count

    plan = plan_cp(cu_seqlens, heads=H, sm_count=_sm_count(q.device),
                   chunk_size=arch_for_device(q.device).chunk_size, B=B, T=T, device=q.device,
                   enable=True if mode == "on" else None)
    if not plan.enabled or (mode == "auto" and not cp_rule(plan, H, for_backward, fused)):
        return None
    if mode == "auto" and for_backward:
        from .cp import ALPHA, effective_chains

        tokens = plan.seq_tokens
        alpha = training_alpha(effective_chains(tokens, H, plan.chunk_size), H, max(tokens, default=0))
        if alpha != ALPHA:
            longer = plan_cp(cu_seqlens, heads=H, sm_count=_sm_count(q.device),
                             chunk_size=arch_for_device(q.device).chunk_size, B=B, T=T, device=q.device, alpha=alpha)
            plan = longer if longer.enabled else plan
    return plan


# bwd_cp=auto's rule, measured on the H200 (results/h200/NOTES.md, session 5): the backward's own pieces
# (piece states recomputed) paid only for one 32768-token sequence over 4 v-heads (2.23 -> 1.62 ms at
# hk2_hv4); at 16 chains (hk16_hv16 1x32768, hk2_hv4 8192x4) and for 8192-token sequences they cost more
# (recompute, batched correction, transition passes) than the split serial passes saved.
BWD_CP_MAX_CHAINS = 4
BWD_CP_MIN_TOKENS = 32768


def bwd_cp_plan(q, v, cu_seqlens, options: KernelOptions | None = None):
    """The CP plan of the backward of a forward that ran without CP, or None (the plain backward).

    ``options.bwd_cp`` (QLABENCH_BWD_CP without options): off; on (cp.py's pieces whenever a sequence
    is long enough to cut); auto (the default): cp.py's plan where it is enabled, the call has at most
    BWD_CP_MAX_CHAINS (sequence, v-head) chains and its longest sequence has at least BWD_CP_MIN_TOKENS
    tokens (the measured rule above), else None.
    """
    mode = option_value(options, "bwd_cp")
    B, T, H = v.shape[:3]
    n_seqs = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if mode == "auto" and (n_seqs * H > BWD_CP_MAX_CHAINS or T < BWD_CP_MIN_TOKENS):
        return None  # decided from shapes alone: no plan, no host read in the common case
    plan = _cp_plan(q, v, cu_seqlens, mode=mode)
    if plan is None:
        return None
    if mode == "auto" and max(plan.seq_tokens) < BWD_CP_MIN_TOKENS:
        return None
    return plan


class ChunkGatedDeltaRuleFunction(torch.autograd.Function):
    """Forward on our kernels; backward on `backward_cp.chunk_gated_delta_rule_bwd_cp` over the
    forward's pieces when the forward ran CP, else over `bwd_cp_plan`'s pieces (the piece initial
    states recomputed) when it plans any, else on `backward.chunk_gated_delta_rule_bwd` (recomputing
    h)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, state_v_first,
                options=None, records=True):
        # any differentiable input (q, k, v, g, beta, initial_state) while autograd records: a backward may
        # follow (cp_rule, and A is kept). needs_input_grad does not see torch.no_grad (and forward() itself
        # always runs without grad), so the caller's grad mode comes in as ``records``.
        for_backward = records and any(ctx.needs_input_grad[i] for i in (0, 1, 2, 3, 4, 6))
        g_cumsum, A, o, _, final_state, ctx.cp, masks = _forward(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
            output_final_state=output_final_state, output_h=False, state_v_first=state_v_first,
            options=options, for_backward=for_backward,
        )
        ctx.options = options  # the backward runs the variants the forward was called with
        # kkt_solve's masks for the backward's bwd_prepare (bwd_masks=forward), saved with the inputs: every
        # backward of a retained graph reads them, and they are freed with the graph's other saved tensors
        keep = masks is not None and option_value(options, "bwd_masks") == "forward"
        ctx.save_for_backward(q, k, v, g_cumsum, beta, A, initial_state, cu_seqlens,
                              masks.Ag if keep else None, masks.Pm if keep else None)
        ctx.scale = scale
        ctx.state_v_first = state_v_first
        ctx.g_dtype = g.dtype
        return o, final_state

    @staticmethod
    def backward(ctx, do, dht):
        from .backward import chunk_gated_delta_rule_bwd
        from .forward import KktMasks

        q, k, v, g_cumsum, beta, A, initial_state, cu_seqlens, Ag, Pm = ctx.saved_tensors
        args = (q, k, v, g_cumsum, beta, A, do.contiguous(), dht)
        masks = None if Ag is None else KktMasks(Ag, Pm)  # the forward's kkt_solve masks (bwd_masks=forward)
        kw = {"scale": ctx.scale, "initial_state": initial_state, "cu_seqlens": cu_seqlens,
              "state_v_first": ctx.state_v_first, "options": getattr(ctx, "options", None), "masks": masks}
        plan, h0_pieces, transitions = (ctx.cp if ctx.cp is not None
                                        else (bwd_cp_plan(q, v, cu_seqlens, kw["options"]), None, None))
        if plan is not None:  # the forward's pieces (piece states, chain transitions), or the backward's own
            from .backward_cp import chunk_gated_delta_rule_bwd_cp

            dq, dk, dv, dbeta, dg, dh0 = chunk_gated_delta_rule_bwd_cp(
                *args, **kw, plan=plan, h0_pieces=h0_pieces, transitions=transitions, transition="always")
        else:
            dq, dk, dv, dbeta, dg, dh0 = chunk_gated_delta_rule_bwd(*args, **kw)
        return (dq, dk, dv, dg.to(ctx.g_dtype), dbeta.to(beta.dtype), None,
                dh0 if initial_state is not None else None, None, None, None, None, None)


def chunk_gated_delta_rule(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False, options: KernelOptions | None = None,
):
    """Gated DeltaNet over packed or dense sequences, on our TileLang kernels.

    Args:
        q, k: `[B, T, H_qk, 128]` bf16/fp16. v: `[B, T, H_v, 128]`, same dtype.
        g: `[B, T, H_v]` natural-log gate (fp32). beta: `[B, T, H_v]`.
        scale: defaults to K^-1/2.
        initial_state: `[N, H_v, K, V]` fp32 (`[N, H_v, V, K]` with ``state_v_first``).
        output_final_state: also return the state after the last token of each sequence.
        use_qk_l2norm_in_kernel: L2-normalise q and k first.
        cu_seqlens: `[N + 1]` int32/int64 sequence boundaries (B must be 1).
        options: the kernel variants (`KernelOptions`); None: read once here from the QLABENCH_*
            switches (unset: the default kernels), and the backward runs the same ones.

    Returns:
        (o `[B, T, H_v, V]` in q's dtype, final_state `[N, H_v, K, V]` fp32 or None)

    Raises:
        ValueError / TypeError for bad input (naming the argument and value), and ValueError when
        the tensors are not on a CUDA device with kernels (use `reference` on the CPU).
    """
    if options is None:
        options = KernelOptions.from_env()
    elif not isinstance(options, KernelOptions):
        raise TypeError(f"options must be a qlabench.kernels.KernelOptions, got {type(options).__name__}")
    p = validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first, for_kernels=True)
    from .dispatch import arch_for_device

    arch_for_device(q.device)
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    o, final_state = ChunkGatedDeltaRuleFunction.apply(
        q, k, v, g, beta, p.scale, initial_state, bool(output_final_state), cu_seqlens, state_v_first, options,
        torch.is_grad_enabled(),
    )
    return o, (final_state if output_final_state else None)
