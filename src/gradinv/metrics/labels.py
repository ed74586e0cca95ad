"""Label accuracy of the labels an attack infers (iDLG, Zhao et al. 2020, arXiv:2001.02610;
Yin et al. 2021, arXiv:2104.07586, for batches).

A batch's labels are recovered as a multiset: an attack that reads labels off the last layer's
gradient learns which classes occur, and how often, but not which image carries which. So the
accuracy is the fraction of the true labels that the prediction recovers, counting duplicates:

    label_accuracy = sum_c min(#c in predicted, #c in true) / len(true)

Order is ignored; for one image it is 1 or 0. Attacks predict as many labels as there are images;
a prediction of another length is judged by the same overlap, still over ``len(true)`` (so surplus
predicted labels cost nothing). This is breaching's "label_acc" (a bincount overlap).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence

import torch
from torch import Tensor

Labels = Sequence[int] | Tensor


def _as_list(labels: Labels, name: str) -> list[int]:
    if isinstance(labels, Tensor):
        if labels.is_floating_point() or labels.dtype == torch.bool:
            raise TypeError(f"{name} must be integer class labels, got a {labels.dtype} tensor.")
        return [int(v) for v in labels.flatten().tolist()]
    out = []
    for v in labels:
        try:
            if isinstance(v, bool):  # bool is an int to Python, never a class label
                raise TypeError
            out.append(operator.index(v))
        except TypeError:
            raise TypeError(f"{name} must be integer class labels, got {v!r}.") from None
    return out


def label_accuracy(predicted: Labels, true: Labels) -> float:
    """The fraction of ``true`` labels recovered by ``predicted``, as multisets (see module doc)."""
    pred, truth = _as_list(predicted, "predicted"), _as_list(true, "true")
    if not truth:
        raise ValueError("label accuracy of an empty batch is undefined.")
    overlap = Counter(pred) & Counter(truth)
    return sum(overlap.values()) / len(truth)
