"""Which samples of a batch DCS² protects (its *sensitive* samples), without importing torch.

DCS² (:mod:`gradinv.defenses.dcs2`) conceals some samples of a batch only, and its paper scores
the attacks on those. A table that compares DCS² with other defenses scores every defense on
the same samples of the same victims (:func:`gradinv.table_inputs.scored_on`), so the workflow
(when Snakemake builds it) and the score stage need the rule as well as the defense does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: DCS²'s defaults of the settings that say which samples it protects (``DCS2.Settings``; a test
#: checks they agree): a block that leaves one out is read with these.
DEFAULTS: dict[str, Any] = {"sensitive": "fraction", "count": 1, "fraction": 0.5, "labels": []}

#: A table's ``scored``: ``sensitive`` (the default) scores every defense of a table with DCS² on
#: DCS²'s sensitive samples, as DCS²'s Table 1 does; ``batch`` scores every sample of the batch,
#: DCS²'s runs too, as its Table 3 does ("computed between all data and their reconstructions").
SENSITIVE, BATCH = "sensitive", "batch"


def scores_whole_batch(table: Mapping[str, Any]) -> bool:
    """Whether a table block scores every sample of each batch (``scored: batch``)."""
    return table.get("scored", SENSITIVE) == BATCH


def rule_of(block: Mapping[str, Any]) -> dict[str, Any]:
    """The rule of a DCS² block as it decides: its kind of ``sensitive`` and the one setting
    that kind reads, with DCS²'s defaults for what the block leaves out. Two blocks that protect
    the same samples (a ``fraction`` that a ``count`` rule never reads aside) give the same."""
    kind = block.get("sensitive", DEFAULTS["sensitive"])
    value = block.get(kind, DEFAULTS[kind])
    return {"sensitive": kind, kind: list(value) if kind == "labels" else value}


def sensitive_samples(rule: Mapping[str, Any], labels: Sequence[int]) -> list[int]:
    """The indices a batch with ``labels`` has sensitive under ``rule`` (a DCS² block's
    ``sensitive``, with its ``count``, ``fraction`` or ``labels``): ``labels``, every sample of
    those classes; ``count``, the first ``count`` samples (the official code's ``num_sen``);
    ``fraction``, the first ceil(fraction x B) (a client's batch is a random draw)."""
    kind = rule["sensitive"]
    if kind == "labels":
        return [i for i, y in enumerate(labels) if y in tuple(rule["labels"])]
    if kind == "count":
        return list(range(min(int(rule["count"]), len(labels))))
    return list(range(math.ceil(float(rule["fraction"]) * len(labels) - 1e-9)))


def whole_batch(rule: Mapping[str, Any], batch_size: int) -> bool:
    """Whether ``rule`` marks every sample of any batch of ``batch_size`` sensitive (a count or
    fraction that covers it; a rule by label never does: its classes need not be drawn)."""
    if rule["sensitive"] == "labels":
        return False
    return sensitive_samples(rule, [0] * batch_size) == list(range(batch_size))
