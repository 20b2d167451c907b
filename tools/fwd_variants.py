"""Forward variants on the GPU: correctness against the float64 reference, time, per-kernel split.

    python tools/fwd_variants.py [--cases hk16_hv16:1x32768,...] [--variants auto,simple,...]

Variants (environment switches of qlabench/kernels/forward.py, read at call time):
    auto        forward.chunk_gated_delta_rule_fwd as the API calls it (sm90: the ws recurrence)
    simple      QLABENCH_FWD_KERNEL=simple (plain recurrence for every grid)
    pipelined   QLABENCH_FWD_KERNEL=pipelined
    ws          QLABENCH_FWD_KERNEL=ws (hopper/chunk_fwd_ws.py: manually warp-specialized recurrence,
                producer / state / output warpgroups; sm90 only)
    ws_autosync ws compiled with TileLang's automatic shared-memory syncs back on
                (QLABENCH_WS_AUTO_SYNC=1): the race-debugging A/B of ws
    kkt_grouped kkt_solve_grouped for GQA (QLABENCH_KKT=grouped: K K^T and Q K^T once per qk-head)
    cp          forward_cp.chunk_gated_delta_rule_fwd_cp with the model's plan (warm-up truncation at -10)
    cp_exact    cp with decay_threshold=None (every head runs whole pieces and the transition: the A/B
                baseline of the warm-up truncation)
    cp_pipelined  cp with QLABENCH_FWD_KERNEL=pipelined
Times are CUDA-graph replay medians (triton.testing.do_bench_cudagraph), inputs as the suite's
`bench` gates, h0 on. A developer tool: the suite's numbers come from `qlabench run`, where these
variants are backends (`--backends qla,qla:fwd_kernel=pipelined,qla:kkt=grouped,qla:cp=on --kernel-split`,
docs/api.md "Kernel options"); only ws_autosync and cp_exact are here alone.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from variants_common import kernel_split, rel_l2

from qlabench.workload import make_workload, parse_pattern

ENV = {
    "auto": {},
    "simple": {"QLABENCH_FWD_KERNEL": "simple"},
    "pipelined": {"QLABENCH_FWD_KERNEL": "pipelined"},
    "ws": {"QLABENCH_FWD_KERNEL": "ws"},
    "ws_autosync": {"QLABENCH_FWD_KERNEL": "ws", "QLABENCH_WS_AUTO_SYNC": "1"},
    "kkt_grouped": {"QLABENCH_KKT": "grouped"},
    "cp": {},
    "cp_exact": {},
    "cp_pipelined": {"QLABENCH_FWD_KERNEL": "pipelined"},
}
DEFAULT_CASES = ("hk16_hv16:1x32768,hk16_hv16:8192x4,hk16_hv16:1024x8,hk16_hv16:1x8192,hk2_hv8:1x32768,"
                 "hk16_hv64:1x32768,hk16_hv32:28672+4096")


def _set_env(name):
    for key in ("QLABENCH_FWD_KERNEL", "QLABENCH_KKT", "QLABENCH_WS_AUTO_SYNC"):
        os.environ.pop(key, None)
    os.environ.update(ENV[name])


def _fn(name, w):
    from qlabench.kernels.forward import chunk_gated_delta_rule_fwd
    from qlabench.kernels.forward_cp import chunk_gated_delta_rule_fwd_cp

    if name == "cp_exact":
        return lambda: chunk_gated_delta_rule_fwd_cp(w.q, w.k, w.v, w.g, w.beta, initial_state=w.h0,
                                                     cu_seqlens=w.cu_seqlens, decay_threshold=None)
    f = chunk_gated_delta_rule_fwd_cp if name.startswith("cp") else chunk_gated_delta_rule_fwd
    return lambda: f(w.q, w.k, w.v, w.g, w.beta, initial_state=w.h0, cu_seqlens=w.cu_seqlens)


def main():
    from triton.testing import do_bench_cudagraph

    from qlabench.kernels.reference import chunk_gated_delta_rule_ref

    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--variants", default="auto,pipelined,kkt_grouped,cp")
    ap.add_argument("--split", default="", help="comma list of variants to profile per kernel")
    args = ap.parse_args()
    variants = args.variants.split(",")
    for case in args.cases.split(","):
        cfg, pat = case.split(":")
        h_qk, h_v = (int(x) for x in cfg[2:].split("_hv"))
        w = make_workload(h_qk, h_v, parse_pattern(pat).seqlens, gate_profile="bench", device="cuda", seed=1)
        t0 = time.time()
        ref_o, ref_s = chunk_gated_delta_rule_ref(w.q, w.k, w.v, w.g, w.beta, initial_state=w.h0,
                                                  cu_seqlens=w.cu_seqlens, output_final_state=True)
        ref_s_t = time.time() - t0
        line = [f"{cfg:>10} {pat:>12} (ref {ref_s_t:.1f}s)"]
        for name in variants:
            _set_env(name)
            try:
                fn = _fn(name, w)
                with torch.no_grad():
                    _, _, o, _, s = fn()
                    torch.cuda.synchronize()
                    eo, es = rel_l2(o, ref_o), rel_l2(s, ref_s)
                    ms = do_bench_cudagraph(fn, rep=40)
                ok = eo <= 0.02 and es <= 0.02
                line.append(f"{name} {ms:.3f}ms{'' if ok else ' BAD'}(o {eo:.1e} s {es:.1e})")
                if name in args.split.split(","):
                    split = kernel_split(fn)
                    top = list(split.items())[:6]
                    print(f"   split {cfg} {pat} {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in top),
                          flush=True)
            except Exception as exc:  # noqa: BLE001 - a variant's failure is reported, the rest go on
                line.append(f"{name} ERR {type(exc).__name__}: {str(exc)[:120]}")
        _set_env("auto")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
