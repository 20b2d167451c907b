"""Session 38 (used again in 39): compile bwd_chunk of the tree on PYTHONPATH for sm_90a into $TILELANG_CACHE_DIR, one (h_qk, h_v, dtype)
per argument 'hq,hv,dtype[,role]' (role: bwd_chunk) (two processes)."""
import sys
from concurrent.futures import ProcessPoolExecutor


def one(spec):
    import time
    t = time.time()
    from qlabench.kernels.dispatch import kernel_factory
    hq, hv, dt, *role = spec.split(",")
    kernel_factory("sm90", role[0] if role else "bwd_chunk")(int(hq), int(hv), 128, 128, 64, dt, "sm90")
    return f"{spec} {time.time() - t:.0f} s"


if __name__ == "__main__":
    with ProcessPoolExecutor(int(sys.argv[1])) as ex:
        for r in ex.map(one, sys.argv[2:]):
            print(r, flush=True)
