"""Reports over results files: speedup tables (text, markdown, CSV, HTML), summaries, plots.

from qlabench.report import format_h200_tables
print(format_h200_tables("results/h200/.../results.json"))
"""

from qlabench.report.frame import ResultsError, collect
from qlabench.report.tables import FORMATS, build_report, format_h200_tables, render

__all__ = ["FORMATS", "ResultsError", "build_report", "collect", "format_h200_tables", "render"]
