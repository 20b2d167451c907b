"""Shared pytest behaviour.

* Tests marked ``gpu`` skip with a reason where CUDA is absent.
* Every test runs with Python's ``random`` and torch's global generators (CPU and CUDA) seeded from
  its node id (crc32) plus ``QLABENCH_TEST_SEED`` (default 0): a failure reproduces by running the
  same node id again, and another base seed draws other inputs for every test at once. A failing
  test's message starts with ``[seed N]``.
"""

from __future__ import annotations

import os
import random
import zlib

import pytest


def test_seed(nodeid: str) -> int:
    """The seed of one test: crc32 of its node id plus QLABENCH_TEST_SEED, mod 2**31."""
    base = os.environ.get("QLABENCH_TEST_SEED", "0")
    try:
        base_int = int(base)
    except ValueError:
        raise ValueError(f"QLABENCH_TEST_SEED must be an integer, got {base!r}") from None
    return (zlib.crc32(nodeid.encode()) + base_int) % 2**31


test_seed.__test__ = False  # a helper, not a test


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded_generators(request):
    import torch

    seed = test_seed(request.node.nodeid)
    request.node._qlabench_seed = seed
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device's generator
    yield


@pytest.fixture
def one_thread():
    """torch on one CPU thread for the test (tiny float64 problems: no OpenMP spin-waits on a shared
    2-core machine). Modules take it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    seed = getattr(item, "_qlabench_seed", None)
    if seed is None or not rep.failed:
        return
    base = os.environ.get("QLABENCH_TEST_SEED", "0")
    rep.sections.append(("seed", f"inputs seeded with {seed} (crc32 of the node id + QLABENCH_TEST_SEED={base})"))
    crash = getattr(rep.longrepr, "reprcrash", None)
    if crash is not None and not crash.message.startswith("[seed"):
        crash.message = f"[seed {seed}] {crash.message}"
