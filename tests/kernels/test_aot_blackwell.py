"""`qlabench aot --arch sm100 / sm120` compile the forward kernels on a machine without a GPU (about
40-70 s each on 2 cores with a cold cache), and the generated code says what they are:
  * sm100: blackwell/ kkt_solve, chunk_fwd and chunk_fwd_pipelined issue tcgen05 MMAs into tensor
    memory (tcgen05.mma + tcgen05.commit to mbarriers + tcgen05.ld; UTCHMMA and LDTM in the SASS when
    cuobjdump is installed); the recurrence has no mma.sync left, kkt_solve keeps mma.sync only for
    the inverse's 32-row tf32 products; no Hopper wgmma anywhere.
  * sm120: the Hopper files for sm_120a at C = 32 use mma.sync (plus TMA in the pipelined
    recurrence), no wgmma / tcgen05, and fit sm120's ~99 KB of shared memory per block.
  * sm100 backward: all five kernels (blackwell/) put every product on tcgen05 as well.
Nothing here has run on Blackwell hardware."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from qlabench.cli import main

SM120_SMEM_PER_BLOCK = 101376  # bytes of shared memory one block may opt into on sm_120 (99 KB)
FORWARD = ("chunk_local_cumsum", "kkt_solve", "cp_correct", "cp_tables", "split_hi_lo", "chunk_fwd", "chunk_fwd_pipelined")
TCGEN05 = ("kkt_solve", "chunk_fwd", "chunk_fwd_pipelined")  # sm100 kernels with tensor-memory MMAs
NO_MMA = ("chunk_local_cumsum", "cp_tables", "split_hi_lo")  # elementwise / scan kernels: no matrix product


def _kernels(cache: Path) -> dict[str, list[dict]]:
    """{kernel name: [{device source, dynamic shared memory bytes}]} from a TileLang cache directory."""
    out: dict[str, list[dict]] = {}
    for dev in cache.rglob("device_kernel.cu"):
        src = dev.read_text()
        name = re.search(r"__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)_kernel\(", src).group(1)
        host = (dev.parent / "host_kernel.cu").read_text()
        # the host wrapper passes the launch's dynamic shared memory as the last argument of the call
        call = re.search(rf"TVMFFIFunctionCall\({name}_kernel_packed, \(TVMFFIAny\*\) stack_ffi_any, (\d+)", host)
        sizes = re.findall(rf"stack_ffi_any\)\[{int(call.group(1)) - 1}\]\.v_int64\) = \(\(int64_t\)(\d+)\)",
                           host[:call.start()])
        out.setdefault(name, []).append({"src": src, "smem": int(sizes[-1])})
    return out


_RUNS: dict[str, tuple] = {}


@pytest.fixture
def aot_run(tmp_path_factory):
    """(CLI result, kernels, cache dir) of one `qlabench aot` per arch, shared by this module's tests."""
    def run(arch: str):
        if arch not in _RUNS:
            cache = tmp_path_factory.mktemp(f"aot_{arch}") / "cache"
            extra = ["--no-backward"] if arch == "sm100" else []  # sm100's backward takes ~2 min more
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("TILELANG_CACHE_DIR", str(cache))
                result = CliRunner().invoke(main, ["aot", "--arch", arch, "--cfg", "hk1_hv2", "--state-layout", "kv",
                                                   "--cache-dir", str(cache), *extra])
            assert result.exit_code == 0, result.output
            _RUNS[arch] = (result, _kernels(cache), cache)
        return _RUNS[arch]
    return run


@pytest.mark.parametrize("arch", ["sm100", "sm120"])
def test_aot_blackwell_forward(aot_run, arch):
    """sm100 forward only; sm120 as CI runs it: no backward exists, and aot says it skipped it."""
    result, kernels, cache = aot_run(arch)
    lines = [line.split()[0] for line in result.output.splitlines() if line.startswith("  ")]
    assert lines.count("chunk_fwd") == 2 and lines.count("chunk_fwd_pipelined") == 2, result.output  # BV 32, 64
    assert {"chunk_local_cumsum", "kkt_solve"} <= set(lines), result.output
    assert "kernels compiled" in result.output.splitlines()[-1]
    assert any(cache.rglob("*.cubin")), "no cubin written into the cache directory"
    assert set(kernels) == set(FORWARD), sorted(kernels)
    if arch == "sm120":
        assert "skipped: backward: not available for sm120" in result.output
        # TileLang's INFO lines stay out of the table; a fresh cache compiles, a second run loads
        assert "TileLang" not in result.output, result.output
        assert all(ln.split()[-3] == "compiled" for ln in result.output.splitlines() if ln.startswith("  ") and
                   not ln.startswith("  skipped")), result.output
        with pytest.MonkeyPatch.context() as mp:  # aot sets TILELANG_CACHE_DIR; restored after
            mp.setenv("TILELANG_CACHE_DIR", str(cache))
            again = CliRunner().invoke(main, ["aot", "--arch", arch, "--cfg", "hk1_hv2", "--state-layout", "kv",
                                              "--cache-dir", str(cache)])
        assert again.exit_code == 0, again.output
        n = sum(1 for ln in result.output.splitlines() if ln.startswith("  ") and not ln.startswith("  skipped"))
        assert again.output.splitlines()[-1].startswith(f"0 kernels compiled, {n} cached"), again.output
        assert [ln.split()[-3] for ln in again.output.splitlines() if ln.startswith("  ") and
                not ln.startswith("  skipped")] == ["cached"] * n, again.output
    else:
        assert "skipped" not in result.output
    for name, builds in kernels.items():
        for k in builds:
            src = k["src"]
            assert "wgmma" not in src, name
            if arch == "sm100" and name in TCGEN05:
                # tcgen05.mma issued into tensor memory, completion via tcgen05.commit -> mbarrier,
                # accumulators read back with tcgen05.ld
                for needle in ("tl::tcgen05mma", "tl::tcgen05_mma_arrive", "tl::tcgen05_ld_", "tl::tmem_allocate"):
                    assert needle in src, f"{name}: no {needle}"
                # the recurrence is tcgen05 only; kkt_solve keeps mma.sync for the inverse's 32-row products
                assert ("tl::mma_sync" in src) == (name == "kkt_solve"), name
            else:
                assert "tcgen05" not in src and "tmem" not in src.lower(), name
                assert ("tl::mma_sync" in src) == (name not in NO_MMA), f"{name}: mma.sync where none belongs"
            if name == "chunk_fwd_pipelined":
                assert "tma_load" in src, f"{name}: no TMA loads"
            if arch == "sm120":
                assert k["smem"] <= SM120_SMEM_PER_BLOCK, f"{name}: {k['smem']} B of shared memory"


def _cuobjdump() -> str | None:
    """cuobjdump with nvdisasm next to it (PATH, CUDA_HOME, or the nvidia-cuda-cuobjdump wheel)."""
    candidates = [shutil.which("cuobjdump")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(os.environ["CUDA_HOME"]) / "bin" / "cuobjdump"))
    try:
        import nvidia

        candidates += [str(Path(p) / "cu13" / "bin" / "cuobjdump") for p in nvidia.__path__]
    except ImportError:
        pass
    for c in candidates:
        if c and Path(c).is_file() and ((Path(c).parent / "nvdisasm").is_file() or shutil.which("nvdisasm")):
            return c
    return None


def test_sm100_sass_has_utchmma(aot_run):
    """The SASS of the sm100 tcgen05 kernels holds UTCHMMA (tensor-memory MMA) and LDTM (tensor-memory
    load); the recurrence holds no HMMA (mma.sync). Needs cuobjdump + nvdisasm (pip
    nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm); skipped without them."""
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump / nvdisasm not installed")
    _, _, cache = aot_run("sm100")
    ops = _sass_ops(tool, cache)
    assert set(TCGEN05) <= set(ops), sorted(ops)
    for name in TCGEN05:
        assert ops[name]["UTCHMMA"] > 0 and ops[name]["LDTM"] > 0, (name, ops[name])
        assert (ops[name]["HMMA"] > 0) == (name == "kkt_solve"), (name, ops[name])


def test_sm120_shared_memory_check():
    """blackwell_sm120 reads the launch's dynamic shared memory from the host code and refuses a kernel
    over sm120's 99 KB per block."""
    from qlabench.kernels.blackwell_sm120 import SMEM_PER_BLOCK, check_shared_memory, dynamic_shared_memory

    class Fake:
        def __init__(self, smem):
            self.host = ("  ((int64_t*)stack_ffi_any)[3].v_int64) = ((int64_t)1);\n"
                         f"  (((TVMFFIAny*)stack_ffi_any)[3].v_int64) = ((int64_t){smem});\n"
                         "  if (TVMFFIFunctionCall(demo_kernel_packed, (TVMFFIAny*) stack_ffi_any, 4, &r) != 0) {\n")

        def get_host_source(self):
            return self.host

    assert SMEM_PER_BLOCK == SM120_SMEM_PER_BLOCK
    ok = Fake(SMEM_PER_BLOCK)
    assert dynamic_shared_memory(ok) == SMEM_PER_BLOCK and check_shared_memory(ok, "demo") is ok
    with pytest.raises(ValueError, match=r"demo needs 101377 B of shared memory per block; sm120 allows 101376 B"):
        check_shared_memory(Fake(SMEM_PER_BLOCK + 1), "demo")


def _sass_ops(tool: str, cache: Path) -> dict[str, Counter]:
    """{kernel name: Counter of UTCHMMA / LDTM / HMMA} over the cubins of a TileLang cache directory."""
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(tool).parent), os.environ.get("PATH", "")])}
    ops: dict[str, Counter] = {}
    for cubin in cache.rglob("*.cubin"):
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, env=env, check=True,
                              timeout=120).stdout
        name = re.search(r"Function : (\w+)_kernel", sass).group(1)
        ops.setdefault(name, Counter()).update(m.split(".")[0] for m in re.findall(r"\b(?:UTCHMMA|LDTM|HMMA)\S*", sass))
    return ops


SM100_BACKWARD = ("bwd_prepare", "bwd_h_pipelined", "bwd_dh_pipelined", "bwd_state", "bwd_intra")


@pytest.mark.slow  # ~1 min; the default run compiles sm100's forward (test_aot_blackwell_forward)
def test_sm100_backward_uses_tcgen05(tmp_path):
    """sm100's five backward kernels (blackwell/) compile for sm_100a with every product on tcgen05
    (source: tcgen05.mma + commit + tcgen05.ld, no mma.sync / wgmma; SASS: UTCHMMA + LDTM, no HMMA,
    where cuobjdump is installed). Compiled through backward.compile_backward_kernels (the API's own
    path) in a fresh process, so TileLang's in-memory kernel cache cannot skip the cubins (about
    1 min on 2 cores)."""
    cache = tmp_path / "cache"
    root = str(Path(__file__).resolve().parents[2])
    code = ("from qlabench.kernels.backward import compile_backward_kernels\n"
            "compile_backward_kernels(1, 2, dtype='bfloat16', target='sm100')\n")
    env = {**os.environ, "TILELANG_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900,
                         check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    kernels = _kernels(cache)
    assert set(kernels) == set(SM100_BACKWARD), sorted(kernels)
    for name, (k,) in kernels.items():
        src = k["src"]
        for needle in ("tl::tcgen05mma", "tl::tcgen05_mma_arrive", "tl::tcgen05_ld_"):
            assert needle in src, f"{name}: no {needle}"
        if name.endswith("_pipelined"):
            assert "tl::tma_load" in src, f"{name}: no TMA loads"
        assert "tl::mma_sync" not in src and "wgmma" not in src, name
    tool = _cuobjdump()
    if tool is None:
        return  # source checked; SASS needs cuobjdump + nvdisasm
    ops = _sass_ops(tool, cache)
    for name in kernels:
        assert ops[name]["UTCHMMA"] > 0 and ops[name]["LDTM"] > 0 and ops[name]["HMMA"] == 0, (name, ops[name])
