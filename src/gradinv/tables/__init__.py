"""Paper tables and figures, rendered from the per-run metrics files alone: MLflow mirrors
the runs for browsing and is never the source of a table.

``render_table`` is the entry point: metrics files in, ``<name>.csv``, ``<name>.md``,
``<name>_vs_paper.csv`` and ``figures/<name>.png`` out. The pieces (``collect``, ``long_table``,
``paper_table``, ``vs_paper``, ``table_figure``, ``reconstruction_grid``) are public so other
tables can be assembled from them; see README.md in this folder.
"""

from gradinv.tables.aggregate import (
    METRICS,
    MetricSpec,
    TableError,
    long_table,
    metric_header,
    paper_table,
    widen,
)
from gradinv.tables.compare import COMPARISON_COLUMNS, read_reference, vs_paper
from gradinv.tables.figures import table_figure
from gradinv.tables.files import DEFAULT_METRICS, MetricsFileError, collect
from gradinv.tables.grid import GridEntry, reconstruction_grid
from gradinv.tables.render import render_table, write_csv

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
