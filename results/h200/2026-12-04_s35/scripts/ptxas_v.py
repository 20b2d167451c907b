"""Compile one kernel of the tree on PYTHONPATH into a fresh cache with ptxas -v and print ptxas' warnings/info."""
import logging
import os
import sys
import tempfile

os.environ["TILELANG_CACHE_DIR"] = tempfile.mkdtemp()
import tilelang.contrib.nvcc as nv

orig = nv.compile_cuda
def wrapped(code, target_format="ptx", arch=None, options=None, path_target=None, verbose=False):
    opts = list(options or []) if not isinstance(options, str) else [options]
    opts += ["-Xptxas", "-v"]
    return orig(code, target_format, arch, opts, path_target, True)
nv.compile_cuda = wrapped
for mod in list(sys.modules.values()):
    if mod is not None and getattr(mod, "compile_cuda", None) is orig:
        mod.compile_cuda = wrapped
logging.basicConfig(level=logging.INFO)
from qlabench.kernels.dispatch import kernel_factory

hq, hv, bv = map(int, sys.argv[1:4]); role = sys.argv[4]
if role in ("bwd_h", "bwd_dh_ws"):
    kernel_factory("sm90", role)(hq, hv, 128, 128, bv, 64, "bfloat16", "sm90")
else:
    kernel_factory("sm90", role)(hq, hv, 128, 128, 64, "bfloat16", "sm90")
