"""Paper tables and figures, rendered from the per-run metrics files alone: MLflow mirrors
the runs for browsing and is never the source of a table.

``render_table`` is the entry point: metrics files in, ``<name>.csv``, ``<name>.md``,
``<name>_vs_paper.csv`` and ``figures/<name>.png`` out. The pieces (``collect``, ``long_table``,
``paper_table``, ``vs_paper``, ``table_figure``, ``reconstruction_grid``) are public so other
tables can be assembled from them; see README.md in this folder.
"""

import importlib
from typing import Any

# Each public name and the module it lives in, imported when first used (PEP 562): the
# workflow's job graph reads a few helpers of this package, and must not pay for the figures'
# plotting libraries.
_WHERE = {
    "METRICS": "aggregate",
    "MetricSpec": "aggregate",
    "TableError": "aggregate",
    "long_table": "aggregate",
    "metric_header": "aggregate",
    "paper_table": "aggregate",
    "widen": "aggregate",
    "COMPARISON_COLUMNS": "compare",
    "read_reference": "compare",
    "vs_paper": "compare",
    "table_figure": "figures",
    "DEFAULT_METRICS": "files",
    "MetricsFileError": "files",
    "collect": "files",
    "GridEntry": "grid",
    "reconstruction_grid": "grid",
    "render_table": "render",
    "write_csv": "render",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)


__all__ = [
    "COMPARISON_COLUMNS",
    "DEFAULT_METRICS",
    "METRICS",
    "GridEntry",
    "MetricSpec",
    "MetricsFileError",
    "TableError",
    "collect",
    "long_table",
    "metric_header",
    "paper_table",
    "read_reference",
    "reconstruction_grid",
    "render_table",
    "table_figure",
    "vs_paper",
    "widen",
    "write_csv",
]
