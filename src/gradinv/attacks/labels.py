"""Label inference from the last fully connected layer's gradient.

With non-negative features h (after ReLU) and cross-entropy, the weight gradient of class c is
(p_c - y_c) h: only the rows of classes present in the batch can be negative. iDLG (Zhao et al.
2020, arXiv:2001.02610) takes the row with the most negative sum for one image; the rule of Yin et
al. 2021 (arXiv:2104.07586) takes the B rows with the most negative minimum entry, which assumes no
label repeats within the batch.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor


def infer_labels(
    fc_weight_grad: Tensor, batch_size: int, rule: Literal["auto", "idlg", "yin"] = "auto"
) -> Tensor:
    if fc_weight_grad.ndim != 2:
        raise ValueError(
            f"expected a (classes, features) weight gradient, got {tuple(fc_weight_grad.shape)}"
        )
    if rule == "auto":
        rule = "idlg" if batch_size == 1 else "yin"
    if rule == "idlg":
        if batch_size != 1:
            raise ValueError("the iDLG rule recovers one label; use label_rule 'yin' for batches")
        return torch.argmin(fc_weight_grad.sum(dim=1)).view(1)
    scores = fc_weight_grad.min(dim=1).values
    if batch_size > len(scores):
        raise ValueError(
            f"the row rule cannot recover {batch_size} labels from {len(scores)} classes"
        )
    return torch.sort(torch.argsort(scores, stable=True)[:batch_size]).values
