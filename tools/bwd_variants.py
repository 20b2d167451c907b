"""Backward variants on the GPU: agreement with the float64 reference, time, per-kernel split.

    python tools/bwd_variants.py [--cases hk16_hv16:32k_1seq,...] [--variants auto,dh_ws,...] [--split auto]

Variants (environment switches of qlabench/kernels/backward.py and forward.py, read at call time):
    auto          the backward as the API runs it (sm90: h recomputed by hopper/bwd_h_ws.py, h only)
    dh_ws         QLABENCH_BWD_DH=ws (hopper/bwd_dh_ws.py: warp-specialized reverse pass, opt-in)
Each case: the suite's `bench` inputs with h0 and a random dht; the forward runs once outside the
timed region (autograd graph kept); the time is triton's do_bench median (CUDA events, no graph) of
torch.autograd.grad over (q, k, v, g, beta, h0), as the suite's `bwd` phase. Errors are relative L2
of every gradient against the float64 reference's autograd (computed once per case on the GPU).
--split prints the per-kernel device time (torch.profiler, mean of 5 calls) of the named variants,
one line each, so a whole run's output fits in one log file. A developer tool: the suite's numbers
come from `qlabench run`, where the same A/B is `--phase bwd --backends qla,qla:bwd_dh=ws --kernel-split`.
"""

from __future__ import annotations

import argparse
import os

import torch
from variants_common import kernel_split, rel_l2

from qlabench.workload import make_workload, parse_pattern

ENV = {
    "auto": {},
    "dh_ws": {"QLABENCH_BWD_DH": "ws"},
}
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
DEFAULT_CASES = "hk16_hv16:8k_1seq,hk16_hv16:32k_1seq,hk2_hv4:32k_1seq,hk16_hv32:32k_8seq"


def _set_env(name):
    for key in ("QLABENCH_BWD_DH",):
        os.environ.pop(key, None)
    os.environ.update(ENV[name])


def _leaves(w):
    return [x.detach().clone().requires_grad_(True) for x in (w.q, w.k, w.v, w.g, w.beta, w.h0)]


def _reference(w, do, dht):
    from qlabench.kernels.reference import chunk_gated_delta_rule_ref

    leaves = [x.double() for x in _leaves(w)]
    for x in leaves:
        x.requires_grad_(True)
    o, ht = chunk_gated_delta_rule_ref(*leaves[:5], initial_state=leaves[5], cu_seqlens=w.cu_seqlens,
                                       output_final_state=True)
    return torch.autograd.grad((o, ht), leaves, (do.double(), dht.double()))


def main():
    from triton.testing import do_bench

    from qlabench.kernels import chunk_gated_delta_rule

    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--variants", default="auto,dh_ws")
    ap.add_argument("--split", default="", help="comma list of variants to profile per kernel")
    args = ap.parse_args()
    for case in args.cases.split(","):
        cfg, pat = case.split(":")
        h_qk, h_v = (int(x) for x in cfg[2:].split("_hv"))
        w = make_workload(h_qk, h_v, parse_pattern(pat).seqlens, gate_profile="bench", device="cuda", seed=1)
        gen = torch.Generator(device="cuda").manual_seed(2)
        do = torch.randn(w.v.shape, device="cuda", generator=gen).to(w.v.dtype)
        dht = torch.randn(w.h0.shape, device="cuda", generator=gen)
        ref = _reference(w, do, dht)
        line = [f"{cfg:>10} {pat:>9}"]
        for name in args.variants.split(","):
            _set_env(name)
            try:
                leaves = _leaves(w)
                o, ht = chunk_gated_delta_rule(*leaves[:5], initial_state=leaves[5], cu_seqlens=w.cu_seqlens,
                                               output_final_state=True)

                def bwd(o=o, ht=ht, leaves=leaves, do=do, dht=dht):
                    return torch.autograd.grad((o, ht), leaves, (do, dht), retain_graph=True)

                errs = [rel_l2(g, r) for g, r in zip(bwd(), ref)]
                ms = do_bench(bwd, rep=40)  # events: the backward is not graph-capturable here (cuBLAS/alloc)
                bad = [n for n, e in zip(NAMES, errs) if not e <= 0.02]
                line.append(f"{name} {ms:.3f}ms" + (f" BAD {bad}" if bad else "")
                            + " (" + " ".join(f"{n} {e:.1e}" for n, e in zip(NAMES, errs)) + ")")
                if name in args.split.split(","):
                    top = list(kernel_split(bwd).items())[:8]
                    print(f"   split {cfg} {pat} {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in top), flush=True)
            except Exception as exc:  # noqa: BLE001 - a variant's failure is reported, the rest go on
                line.append(f"{name} ERR {type(exc).__name__}: {str(exc)[:120]}")
        _set_env("auto")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
