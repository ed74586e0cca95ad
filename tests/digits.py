"""Small real data and short FL training for the defense tests: scikit-learn's handwritten
digits (real images, 10 classes), upsampled to 16x16, and FedSGD on the 3-layer CNN."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from gradinv.defenses import Defense
from gradinv.fl.server import FLSettings, train
from gradinv.models import build_model
from gradinv.protocol import ModelSpec, normalize

MEAN, STD = (0.3,), (0.35,)
SPEC = ModelSpec("cnn3", num_classes=10, in_channels=1, image_size=16, settings={})


@functools.cache
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1797 digits in [0, 1], (N, 1, 16, 16), and their labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32)[:, None] / 16.0
    return F.interpolate(images, size=16, mode="bilinear", align_corners=False), torch.tensor(
        data.target
    )


def fl_accuracy(defense: Defense, rounds: int = 30, seed: int = 0, lr: float = 0.1) -> list[float]:
    """Test accuracy at rounds 0, rounds / 2 and ``rounds`` of FedSGD (4 IID clients, 2 per
    round, batch 16) on the digits, the last 300 held out for testing."""
    history = fl_history(defense, rounds, seed, lr)
    return [h["test_accuracy"] for h in history if "test_accuracy" in h]


def fl_history(
    defense: Defense, rounds: int = 30, seed: int = 0, lr: float = 0.1
) -> list[dict[str, float]]:
    """The per-round history of :func:`fl_accuracy`'s training."""
    images, labels = digits()
    x = normalize(images, MEAN, STD)
    train_x, train_y, test_x, test_y = x[:-300], labels[:-300], x[-300:], labels[-300:]
    order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(seed)).tolist()
    parts = [order[c::4] for c in range(4)]
    fl = FLSettings(
        protocol="fedsgd",
        rounds=rounds,
        clients_per_round=2,
        batch_size=16,
        lr=lr,
        local_steps=1,
        local_lr=0.01,
        eval_every=rounds // 2,
        checkpoint_rounds=(0,),
        eval_samples=0,
    )
    model: nn.Module = build_model(SPEC, seed=seed)
    return train(
        model, train_x, train_y, parts, test_x, test_y, defense, fl, seed, lambda r, m: None
    )
