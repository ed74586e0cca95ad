"""Gradient-matching losses shared by the optimization attacks."""

from __future__ import annotations

from torch import Tensor


def cosine_distances(
    samples: list[Tensor], target: list[Tensor], nonzero_only: bool = False
) -> Tensor:
    """1 - cosine similarity of each of n stacked gradients with the target, all layers
    concatenated (Geiping et al. 2020, Eq. 4), in one pass: shape (n,).

    ``samples[l]`` holds layer l of all n gradients, shape (n, *target[l].shape).
    ``nonzero_only`` restricts both vectors to the target's non-zero entries, as the GIFD/CENSOR
    code does: entries a defense zeroed carry no signal and would only pull the match off.
    """
    n = samples[0].shape[0]
    dot = samples[0].new_zeros(n)
    dummy_sq = samples[0].new_zeros(n)
    target_sq = samples[0].new_zeros(())
    for d, t in zip(samples, target, strict=True):
        if nonzero_only:
            d = d * (t != 0)
        dot = dot + (d * t).reshape(n, -1).sum(1)
        dummy_sq = dummy_sq + d.pow(2).reshape(n, -1).sum(1)
        target_sq = target_sq + t.pow(2).sum()
    return 1 - dot / (dummy_sq.sqrt() * target_sq.sqrt() + 1e-12)


def euclidean_distances(samples: list[Tensor], target: list[Tensor]) -> Tensor:
    """Sum over layers of the squared differences (DLG's ``grad_diff``; not square-rooted) of
    each of n stacked gradients with the target: shape (n,)."""
    n = samples[0].shape[0]
    total = samples[0].new_zeros(n)
    for d, t in zip(samples, target, strict=True):
        total = total + (d - t).pow(2).reshape(n, -1).sum(1)
    return total


def cosine_distance(
    dummy: list[Tensor], target: list[Tensor], nonzero_only: bool = False
) -> Tensor:
    """:func:`cosine_distances` of one gradient."""
    return cosine_distances([d[None] for d in dummy], target, nonzero_only)[0]


def total_variation(x: Tensor) -> Tensor:
    """Anisotropic TV as in inversefed: mean absolute difference of neighbouring pixels."""
    dx = (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().mean()
    dy = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().mean()
    return dx + dy


def target_gradients(
    tensors: dict[str, Tensor], names: list[str], kind: str, local_lr: float, local_steps: int
) -> list[Tensor]:
    """The update as a gradient, in the model's parameter order.

    A FedAvg delta is turned into the gradient of one equivalent step, -delta / (lr * steps):
    exact for one local step, an approximation (the attack's, not the protocol's) for more.
    """
    missing = [n for n in names if n not in tensors]
    if missing:
        raise ValueError(
            f"the shared update lacks parameters {missing[:3]}...; was it captured "
            "from a different model?"
        )
    if kind == "gradient":
        return [tensors[n].detach() for n in names]
    scale = -1.0 / (local_lr * local_steps)
    return [tensors[n].detach() * scale for n in names]
