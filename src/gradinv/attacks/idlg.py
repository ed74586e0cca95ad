"""Improved Deep Leakage from Gradients, iDLG (Zhao et al. 2020, arXiv:2001.02610).

Threat model: honest-but-curious server, one shared gradient (or a FedAvg delta, read as the
gradient of one equivalent step), labels not given. The label is read from the last fully
connected layer's weight gradient before any optimization (:func:`~gradinv.attacks.labels.
infer_labels` with the threat model's ``label_rule``: iDLG's argmin of the row sums for one image,
the row rule of Yin et al. for a batch, which the iDLG paper does not cover); then DLG's L-BFGS
optimization of the images alone, with a hard-label cross-entropy on that label. Where the threat
model grants the labels (``labels: known``), they are used instead.

As in the public code (PatrickZH/Improved-Deep-Leakage-from-Gradients ``iDLG.py``): L-BFGS with
lr 1 and torch's defaults, 300 steps, the Euclidean gradient distance, dummies from a standard
normal. The code stops once the loss falls below 1e-6; here L-BFGS's own tolerances end each step
early instead, and the step count is fixed. Everything else (normalised input space, restarts,
resume) is :class:`~gradinv.attacks.dlg.DLG`'s loop, with its settings.
"""

from __future__ import annotations

from torch import Tensor, nn

from gradinv.attacks import ATTACKS
from gradinv.attacks.dlg import DLG
from gradinv.protocol import SharedUpdate


@ATTACKS.register("idlg")
class IDLG(DLG):
    Settings = DLG.Settings

    name = "iDLG"

    def _labels(self, model: nn.Module, update: SharedUpdate) -> Tensor | None:
        return self.private_labels(model, update)
