"""The papers' qualitative claims, checked against our result files.

``workflow/claims.yaml`` lists each claim with its source (paper, section) and a check: a
relation between two values of one column of a result, in every group of cells. For example
"CENSOR gives lower SSIM than no defense for every attack and dataset" compares the ``defense``
column's ``censor`` and ``none`` cells of Table I's SSIM, grouped by dataset and attack::

    check:
      table: table1          # results/table1_cells.csv (or "utility": results/utility.csv)
      metrics: [ssim]
      compare: defense       # the column whose two values are compared ...
      left: censor
      right: none            # ... or "others": every other value of the column, one at a time
      relation: less         # less | greater | better (each by more than `tolerance`, default
                             # 0) | within (|left - right| <= tolerance) | not_below (left
                             # >= right - tolerance: "costs at most 1 point of accuracy")
      over: [dataset, attack]

``better`` reads the direction from the metric's arrow (higher MSE is better for the defender,
lower SSIM is). What must hold across groups is ``expect``: ``all`` (the default), a fraction
(``0.8``: "in almost all cases"), or ``only_where`` (the relation holds in the groups matching
it and in no other: "Soteria beats CENSOR only against IG and GI").

Where the table has published numbers (``workflow/reference/``), the same check also runs on
them: ``paper_verdict`` says whether the paper's own table bears the claim out as encoded, which
tests the encoding (a claim the paper's numbers do not support is worded or checked wrongly).

A verdict is ``holds``, ``fails`` or ``not evaluated``, always with the numbers behind it and
the scale of the run: a claim that fails on the scaled-down run is a finding about that run,
reported as such. A group without both values (a cell with no runs) is never read as agreeing:
the verdict is ``holds`` or ``fails`` only when it would be the same whichever way those groups
went, and ``not evaluated`` otherwise, as it is when the table is not built, its result file is
missing, or no group has both values. A metric that has no value in any cell of the selection
(LPIPS without its pretrained weights) is left out of the check, and the note says so.
"""

from gradinv.claims.report import markdown
from gradinv.claims.spec import UTILITY, Check, Claim, ClaimError, load_claims, result_file
from gradinv.claims.verdicts import COLUMNS, VERDICTS, evaluate, reference_cells

__all__ = [
    "COLUMNS",
    "UTILITY",
    "VERDICTS",
    "Check",
    "Claim",
    "ClaimError",
    "evaluate",
    "load_claims",
    "markdown",
    "reference_cells",
    "result_file",
]
