"""`python -m qlabench` from the first qlabench on PYTHONPATH (python -m puts the working directory first, so a
variant tree on PYTHONPATH would be shadowed by the checkout: session 32's API A/Bs ran the checkout's code)."""
import runpy
import sys

import qlabench

print(f"qlabench from {qlabench.__file__}", file=sys.stderr)
runpy.run_module("qlabench", run_name="__main__", alter_sys=True)
