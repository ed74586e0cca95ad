"""The papers' qualitative claims, checked against our result files.

``workflow/claims.yaml`` lists each claim with its source (paper, section) and a check: a
relation between two values of one column of a result, in every group of it. For example
"CENSOR gives lower SSIM than no defense for every attack and dataset" compares the ``defense``
column's ``censor`` and ``none`` values of Table I's SSIM, grouped by dataset and attack::

    check:
      table: table1          # results/table1_victims.csv (accuracy, PMM: table1_training.csv;
                             # "utility": results/utility_runs.csv)
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

``compare``, ``over``, ``where`` and ``only_where`` name columns of the file the check reads
(:mod:`gradinv.claims.spec` refuses any other when the claims load, as Snakemake builds the
workflow). A table's accuracy and PMM come from its defenses' training runs, one value per
defense and seed, the same for every attack: a check on them names no attack or victim.

On this run a claim is decided by **paired comparisons** (:mod:`gradinv.claims.paired`): in
each group the two sides are paired on the same victims (or, for accuracy, the same training
seeds), the mean difference comes with its 95% interval (:mod:`gradinv.stats`), and the group
**holds**, **fails** or is **inconclusive** by where the interval lies; it is **undecidable**
when the attack does not beat the floor (the public split's mean image) without a defense. The
claim combines its decidable groups as ``expect`` says, and is **not evaluated** when its table
is not built, its file is missing, or no group has both sides.

Where the table has published numbers (``workflow/reference/``), the same relation also runs on
their cell means (all a published table gives; ``paper_verdict``), which tests the encoding: a
claim the paper's numbers do not support is worded or checked wrongly. A metric that has no
value anywhere (LPIPS without its pretrained weights) is left out of the check, and the note
says so.
"""

from gradinv.claims.paired import GROUP_VERDICTS, evaluate_paired
from gradinv.claims.report import markdown
from gradinv.claims.spec import (
    UTILITY,
    Check,
    Claim,
    ClaimError,
    is_utility,
    load_claims,
    result_file,
    training_file,
)
from gradinv.claims.verdicts import COLUMNS, VERDICTS, evaluate, reference_cells

__all__ = [
    "COLUMNS",
    "GROUP_VERDICTS",
    "UTILITY",
    "VERDICTS",
    "Check",
    "Claim",
    "ClaimError",
    "evaluate",
    "evaluate_paired",
    "is_utility",
    "load_claims",
    "markdown",
    "reference_cells",
    "result_file",
    "training_file",
]
