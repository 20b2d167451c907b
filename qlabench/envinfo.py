"""What a results file's ``env`` block records: GPU identity and clocks, driver, CUDA, library
versions and the qlabench git commit. Every probe is best-effort: a missing tool gives null, never an
exception, so ``qlabench env`` works on a CPU-only machine too.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

import qlabench

# distribution names to try per library (first installed one wins)
_DISTS = {
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton"),
    "tilelang": ("tilelang",),
    "fla": ("fla-core", "flash-linear-attention"),
    "flash_qla": ("flash-qla", "flash_qla"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "cutlass_dsl": ("nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl"),  # FlashInfer's GDN compiler
}


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for key, dists in _DISTS.items():
        out[key] = None
        for dist in dists:
            try:
                out[key] = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
    out["qlabench"] = qlabench.__version__
    return out


def _run(cmd: list[str], cwd=None, timeout: float = 10.0) -> str | None:
    try:
        res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def _is_qlabench_project(root: Path) -> bool:
    """Whether ``root`` holds qlabench's own pyproject.toml (``[project] name = "qlabench"``)."""
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    project = data.get("project")
    return isinstance(project, dict) and project.get("name") == "qlabench"


def git_info(root: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the qlabench checkout; (None, None) outside git.

    Only qlabench's own repository counts: ``root`` (default: the folder holding the qlabench package)
    must hold qlabench's pyproject.toml and be the top level of its git work tree. An unpacked copy
    inside another checkout (or an installed package inside a virtualenv in one) gets no commit rather
    than the enclosing repository's.

    QLABENCH_GIT_COMMIT (and QLABENCH_GIT_DIRTY=0/1) in the environment name the commit explicitly and
    win over git: a tree shipped to a GPU host may lack .git or carry a stale one.
    """
    env_commit = os.environ.get("QLABENCH_GIT_COMMIT")
    if env_commit:  # explicit: a copied tree's .git can be stale (seen on the lent GPU host)
        dirty = os.environ.get("QLABENCH_GIT_DIRTY")
        return env_commit, (dirty == "1") if dirty in ("0", "1") else None
    root = (Path(root) if root is not None else Path(qlabench.__file__).resolve().parent.parent).resolve()
    if not _is_qlabench_project(root):
        return None, None
    top = _run(["git", "rev-parse", "--show-toplevel"], cwd=root)
    if top is None or Path(top).resolve() != root:
        return None, None
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if commit is None:
        return None, None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return commit, bool(status) if status is not None else None


def torch_gpu_uuid(index: int = 0) -> str | None:
    """'GPU-xxxxxxxx-...' of torch's device ``index`` (robust to CUDA_VISIBLE_DEVICES remapping)."""
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    except Exception:  # noqa: BLE001 - best effort
        return None
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def nvidia_smi(index: int = 0) -> dict:
    """driver, uuid and current SM / memory clocks (MHz) from nvidia-smi; {} without it.

    The GPU is selected by torch's UUID when known, so the numbers belong to the device torch uses.
    """
    if shutil.which("nvidia-smi") is None:
        return {}
    q = "driver_version,uuid,clocks.sm,clocks.mem"
    out = None
    uuid = torch_gpu_uuid(index)
    for sel in ([uuid] if uuid else []) + [str(index)]:
        out = _run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits", "-i", sel])
        if out:
            break
    if not out:
        return {}
    parts = [p.strip() for p in out.splitlines()[0].split(",")]
    if len(parts) != 4:
        return {}

    def num(x):
        return int(float(x)) if re.fullmatch(r"[\d.]+", x) else None

    return {"driver": parts[0], "uuid": parts[1], "sm_mhz": num(parts[2]), "mem_mhz": num(parts[3])}


def clocks(index: int = 0) -> dict:
    smi = nvidia_smi(index)
    return {"sm_mhz": smi.get("sm_mhz"), "mem_mhz": smi.get("mem_mhz")}


def gpu_slug(name: str | None) -> str:
    """'NVIDIA H200' -> 'h200' (the results/<gpu>/ folder); 'cpu' without a GPU."""
    if not name:
        return "cpu"
    s = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.IGNORECASE).lower()
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-") or "gpu"


# environment switches of our kernels: the KernelOptions ones (a qla row's options record their effect)
# and QLABENCH_WS_AUTO_SYNC, which the warp-specialized kernels' factories read while compiling
KERNEL_SWITCHES = ("QLABENCH_CP", "QLABENCH_FWD_KERNEL", "QLABENCH_BWD_DH", "QLABENCH_BWD_CP",
                   "QLABENCH_BWD_MASKS", "QLABENCH_WS_AUTO_SYNC")


def kernel_switches(environ=None) -> dict[str, str]:
    """The KERNEL_SWITCHES set in the environment ({} when none): the env block's ``kernel_switches``."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in KERNEL_SWITCHES if k in env}


def collect(device: str = "cuda", index: int = 0) -> dict:
    """The env block for a run on ``device`` ('cuda' or 'cpu')."""
    import torch

    commit, dirty = git_info()
    env = {
        "gpu_name": None, "gpu_uuid": None, "compute_capability": None, "sm_count": None,
        "driver": None, "cuda": torch.version.cuda, "clocks_start": {"sm_mhz": None, "mem_mhz": None},
        "clocks_end": None, "versions": library_versions(), "git_commit": commit, "git_dirty": dirty,
        "timestamp": utc_now(), "hostname": socket.gethostname(), "device": device,
        "gpu_memory_gb": None, "gpu_count": 0, "kernel_switches": kernel_switches(),
    }
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(index)
        smi = nvidia_smi(index)
        env.update(
            gpu_name=props.name,
            gpu_uuid=smi.get("uuid") or torch_gpu_uuid(index),
            compute_capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            driver=smi.get("driver"),
            clocks_start={"sm_mhz": smi.get("sm_mhz"), "mem_mhz": smi.get("mem_mhz")},
            gpu_memory_gb=round(props.total_memory / 2**30, 1),
            gpu_count=torch.cuda.device_count(),
        )
    return env
