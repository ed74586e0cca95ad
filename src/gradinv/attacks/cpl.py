"""Client Privacy Leakage, CPL (Wei et al. 2020, arXiv:2004.10397, ESORICS 2020).

Threat model: honest-but-curious server, one shared gradient (or a FedAvg delta, read as the
gradient of one equivalent step), labels not given. As iDLG, the label is read from the last
layer's weight gradient first (or given, where the threat model grants it); the images are then
optimized with L-BFGS on the Euclidean gradient distance plus a label-based regulariser,
``label_reg`` times the Euclidean distance between the dummy's prediction and that label, from a
geometric ("patterned") starting image.

Paper text vs code, each a setting:
- ``init``: ``patterned`` (default) is the seed of the public notebooks (git-disl/CPL_attack):
  a U(0, 1) tile of half the image side repeated 2x2 (``pattern_size`` 0); breaching's ``wei``
  config uses tiles of 16 px. ``gaussian`` and ``uniform`` are the random seeds it is compared to.
- ``label_reg_on``: what is compared with the label. ``logits`` (default): the logits against the
  one-hot label, ``||model(x) - onehot||_2``, as AIJack's ``label_matching`` (its CPL recipe: L2,
  L-BFGS, coefficient 0.01); ``probabilities``: the softmax against the one-hot label, our reading
  of the paper's "predicted label"; ``logits_minus_index``: the CVB/PRECODE code's CPL
  (``torch.dist(prediction, label, 2)`` with the integer label broadcast over the logits), to
  reproduce that paper's numbers. The public CPL notebooks have the regulariser commented out.
- L-BFGS with lr 1, torch's defaults and 300 steps as in the notebooks. The CVB code's configs
  use lr 0.01, 2000 steps, a random init and known labels; set them in ``params.yaml``.
The best of R restarts is chosen by the gradient distance alone, without the regulariser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from gradinv.attacks import ATTACKS
from gradinv.attacks.dlg import DLG, Init
from gradinv.attacks.idlg import IDLG
from gradinv.settings import bounded


@ATTACKS.register("cpl")
class CPL(IDLG):
    @dataclass(frozen=True)
    class Settings(DLG.Settings):
        init: Init = "patterned"
        label_reg: float = bounded(0.01, ge=0.0, doc="weight of the label-based regulariser")
        label_reg_on: Literal["logits", "probabilities", "logits_minus_index"] = "logits"

    name = "CPL"

    def _regularizer(self, logits: Tensor, labels: Tensor | None) -> Tensor:
        s = self.settings
        if labels is None or s.label_reg == 0:
            return logits.new_zeros(())
        if s.label_reg_on == "logits_minus_index":  # the CVB code: the class index, not one-hot
            return s.label_reg * torch.linalg.vector_norm(logits - labels[:, None].to(logits))
        prediction = logits if s.label_reg_on == "logits" else F.softmax(logits, -1)
        onehot = F.one_hot(labels, logits.shape[-1]).to(logits.dtype)
        return s.label_reg * torch.linalg.vector_norm(prediction - onehot)
