"""The ``gpu`` marker: such tests skip with a reason on machines without CUDA and run elsewhere."""

from __future__ import annotations

from pathlib import Path

import torch

pytest_plugins = ["pytester"]


def test_gpu_marker_skips_without_cuda(pytester):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu
        def test_on_gpu():
            pass

        def test_on_cpu():
            pass
        """
    )
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider",
                                "-o", "markers=gpu: needs a CUDA GPU")
    if torch.cuda.is_available():
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines(["*SKIPPED*needs a CUDA GPU*"])
