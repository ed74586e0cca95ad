"""The training loop of CENSOR's official code (``run_rec.py``), which is not federated learning.

CENSOR's official repository (KaiyuanZh/censor) has no federated-learning code: its one driver,
``run_rec.py``, trains the model between its attacks, and each epoch

1. attacks a few validation images (irrelevant to training, left out here);
2. updates the model once with the *defended* gradient of one image, at ``step_lr`` (1e-3);
3. trains centrally on the whole training set with the raw gradients: SGD with momentum 0.9,
   weight decay 5e-4, batch 1024, learning rate ``defended_lr`` (1e-4) in the epochs where the
   defense is on and ``lr`` (0.1) afterwards.

The defense is on in the first ``defended_epochs`` epochs (10 of 100); after that step 2 uses the
raw gradient. So the model learns from raw gradients in every epoch. The code that made the
paper's convergence figures (Figs. 7-8, Table VI: FL on 100 non-IID clients) is not in the
repository, so nothing ties those figures to this loop; it runs here
(``convergence.official_loop`` in params.yaml) as what the repository does, beside FL as
Algorithm 1 describes it.

Where we differ from the code, on purpose: the image of step 2 is drawn from the training set
(the code uses the validation image it just attacked, which would train on the test data), and
the vanilla curve runs the same loop with the ``none`` defense and the same learning-rate
schedule, so that the one defended step per epoch is the only difference between the curves.

Round r of the history is the model after r epochs (round 0: the seeded initial model); the
checkpoint is the model after the last epoch. With a :class:`~gradinv.progress.Progress` the
loop resumes bit for bit on CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from gradinv.defenses import Defense, gradients_of
from gradinv.fl.server import TrainingDiverged, evaluate
from gradinv.progress import Progress


@dataclass(frozen=True)
class OfficialLoop:
    """``convergence.official_loop`` in params.yaml, less its list of defenses."""

    epochs: int
    defended_epochs: int
    defended_batch: int
    step_lr: float
    batch_size: int
    lr: float
    defended_lr: float
    momentum: float
    weight_decay: float
    eval_every: int
    eval_samples: int

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OfficialLoop:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def train_official(
    model: nn.Module,
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    defense: Defense,
    loop: OfficialLoop,
    seed: int,
    on_checkpoint: Callable[[int, nn.Module], None],
    progress: Progress | None = None,
) -> list[dict[str, float]]:
    """Run ``loop.epochs`` epochs; ``on_checkpoint`` receives the model after the last one.

    ``train_x`` and ``test_x`` are already normalised. Returns the per-epoch history; the key
    ``round`` is the number of epochs done, ``defended`` whether the defense was on.
    """
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=loop.lr, momentum=loop.momentum, weight_decay=loop.weight_decay
    )
    history: list[dict[str, float]] = []
    first = 0
    saved = progress.load() if progress else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        rng.bit_generator.state = saved["numpy_rng"]
        generator.set_state(saved["torch_rng"])
        if "defense" in saved:  # progress saved before the loop kept the defense's state has none
            defense.load_state_dict(saved["defense"])
        history, first = saved["history"], saved["epoch"] + 1
        progress.resumed(f"after epoch {saved['epoch'] + 1} of {loop.epochs}")
    else:
        history.append({"round": 0, **evaluate(model, test_x, test_y)})
    for epoch in tqdm(range(first, loop.epochs), desc="epochs", mininterval=5.0):
        defended = epoch < loop.defended_epochs
        model.train()
        counters = dict(getattr(defense, "stats", {}))
        try:
            chosen = defense if defended else None
            _defended_step(model, train_x, train_y, chosen, loop, rng, generator)
        except (TrainingDiverged, FloatingPointError) as err:
            raise TrainingDiverged(f"{err} in epoch {epoch + 1}", history) from None
        train_loss = _central_epoch(
            model, optimizer, train_x, train_y, loop, loop.defended_lr if defended else loop.lr, rng
        )
        if not np.isfinite(train_loss):
            raise TrainingDiverged(f"non-finite training loss in epoch {epoch + 1}", history)
        row: dict[str, float] = {"round": epoch + 1, "train_loss": train_loss}
        row["defended"] = float(defended)
        row |= defense.rates(counters)  # CENSOR: whether the defended step was the raw gradient
        if (epoch + 1) % loop.eval_every == 0 or epoch + 1 == loop.epochs:
            row |= evaluate(model, test_x, test_y)
        history.append(row)
        if progress and (progress.due() or epoch + 1 == loop.epochs):
            progress.save(
                {
                    "epoch": epoch,
                    "model": _state(model),
                    "optimizer": optimizer.state_dict(),
                    "numpy_rng": rng.bit_generator.state,
                    "torch_rng": generator.get_state(),
                    "defense": defense.state_dict(),  # its counters, Refiner's warm start
                    "history": history,
                }
            )
    on_checkpoint(loop.epochs, model)
    return history


def _defended_step(
    model: nn.Module,
    train_x: Tensor,
    train_y: Tensor,
    defense: Defense | None,
    loop: OfficialLoop,
    rng: np.random.Generator,
    generator: torch.Generator,
) -> None:
    """Step 2 of the code's epoch: one update with the (defended) gradient of a few images."""
    idx = torch.as_tensor(rng.choice(len(train_y), size=loop.defended_batch, replace=False))
    x, y = train_x[idx], train_y[idx]
    if defense is None:
        grads = gradients_of(model, x, y, F.cross_entropy)
    else:
        grads = defense.shared_update(model, x, y, F.cross_entropy, generator)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in grads:
                if not torch.isfinite(grads[name]).all():
                    raise TrainingDiverged(f"non-finite defended update for {name}")
                p -= loop.step_lr * grads[name]


def _central_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train_x: Tensor,
    train_y: Tensor,
    loop: OfficialLoop,
    lr: float,
    rng: np.random.Generator,
) -> float:
    """Step 3: one epoch of central SGD on the whole training set; returns the mean batch loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    order = torch.as_tensor(rng.permutation(len(train_y)))
    total, batches = 0.0, 0
    for start in range(0, len(order), loop.batch_size):
        idx = order[start : start + loop.batch_size]
        loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total, batches = total + loss.item(), batches + 1
    return total / batches


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
