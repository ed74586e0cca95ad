"""DP-SGD (Abadi et al., CCS 2016, arXiv:1607.00133): clip each example's gradient, add noise.

The client computes the gradient of every example of its batch alone, scales each to L2 norm at
most C over all parameters together (g_i · min(1, C/‖g_i‖)), sums them, adds N(0, σ²C²I) and
divides by the batch size B: the shared gradient is the mean of the clipped per-example gradients
plus noise of std σC/B per entry. The noise is drawn from the client's CPU generator and moved
to the gradients' device, so a seed fixes the update on any device. The per-example gradients
come from ``torch.func`` (vmap over grad, each example a batch of one), the model's auxiliary
term (a variational bottleneck's KL) included, with ``randomness="different"`` so a model that
draws in its forward draws anew for each example.

Batch norm: in train mode each example is normalized by its own statistics (a batch of one),
not by the batch's. A batch statistic mixes the examples, so one example's influence on the
gradient would not be bounded by C; Opacus refuses batch norm altogether and asks for group norm
(``norm: group`` for ResNet-18). The running statistics are not moved (the per-example pass
updates copies that are thrown away): updating them would release batch statistics without
noise, outside the guarantee.

Privacy accounting (:func:`privacy_spent`, Opacus's RDP or PRV accountant; not its GDP one,
which Opacus calls experimental, can understate ε and fails where ε is large). The guarantee
is per example of one client's data, against whoever sees the shared updates. A client with n
examples that draws a batch of B = min(fl.batch_size, n) has sample rate q = B/n. Under FedSGD
each round it takes part in is one step of (σ, q). Under FedAvg the client computes
``local_steps`` noisy gradients on the same batch (:mod:`gradinv.fl.client`): k Gaussian
mechanisms on one sampled batch compose exactly to one with noise multiplier σ/√k (Gaussian DP
composition, Dong, Roth and Su, arXiv:1905.02383), so the accountant sees (σ/√k, q) per round
(``local_steps`` of :func:`privacy_spent`); counting rounds × k independently sampled steps would
understate ε. The number of steps is the rounds the client takes part in, at most ``fl.rounds``
(the bound ignores the amplification of sampling the clients). The accountants assume Poisson
sampling (add/remove neighbours); this pipeline draws each round a batch of fixed size B without
replacement and divides by the fixed B, so the ε is the usual approximation, not a proof (Chua et
al., ICML 2024, arXiv:2403.17673: how the batches are drawn can change ε substantially).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import Defense, Gradients, LossFn, per_sample_gradients
from gradinv.defenses.clipping import clip_global
from gradinv.settings import bounded

Accountant = Literal["rdp", "prv"]


@DEFENSES.register("dp_sgd")
class DPSGD(Defense):
    randomized = True

    @dataclass(frozen=True)
    class Settings:
        clip: float = bounded(1.0, gt=0.0, doc="C: bound on each example's gradient L2 norm")
        noise_multiplier: float = bounded(1.0, ge=0.0, doc="σ: noise std σC on the clipped sum")
        delta: float = bounded(1e-5, gt=0.0, lt=1.0, doc="δ of the (ε, δ) the accountant reports")
        accountant: Accountant = "rdp"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        # B of the last batch; the attacker's copy needs the victim's (PublicMeta.batch_size)
        # before attacker_samples or attacker_transform
        self.batch_size: int | None = None
        s = settings
        self.stats: dict[str, Any] = {
            "updates": 0,  # noisy gradients computed, over all clients
            "examples": 0,  # per-example gradients computed
            "clipped": 0,  # of those, clipped (norm above C)
            "batch_size": None,
            "clip": s.clip,
            "noise_multiplier": s.noise_multiplier,
            "delta": s.delta,
            "accountant": s.accountant,
        }

    def state_dict(self) -> dict[str, Any]:
        """The counters behind the training summary's ``defense_stats``: a resumed run goes on
        counting from where it stopped."""
        return {"stats": dict(self.stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.update(state.get("stats", {}))  # progress saved before it kept them: none

    def shared_update(
        self,
        model: nn.Module,
        inputs: Tensor,
        labels: Tensor,
        loss_fn: LossFn,
        generator: torch.Generator,
    ) -> Gradients:
        s = self.settings
        clipped, norms = clipped_per_sample_gradients(model, inputs, labels, loss_fn, s.clip)
        size = len(labels)
        std = s.noise_multiplier * s.clip
        shared = {
            n: (g.sum(0) + std * torch.randn(g.shape[1:], generator=generator, dtype=g.dtype).to(g))
            / size
            for n, g in clipped.items()
        }
        n_clipped = int((norms > s.clip).sum())
        self.batch_size = size
        self.stats["updates"] += 1
        self.stats["examples"] += size
        self.stats["clipped"] += n_clipped
        self.stats["batch_size"] = size
        self.last = {"batch_size": size, "clipped": n_clipped, "max_norm": float(norms.max())}
        return shared

    def transform(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        raise TypeError("DP-SGD clips per-example gradients: it needs the model and the batch")

    def attacker_transform(
        self, observed: Gradients, mode: Literal["configured", "estimated"]
    ) -> Callable[[Gradients], Gradients] | None:
        """For a batch of one, the clip to C (in both modes: the noise hides the clipped norm):
        the example's gradient is the batch's. For a larger batch None: the clip acts on each
        example's gradient, which an attacker's batch gradient does not show."""
        if self._attacked_batch_size() > 1:
            return None
        return lambda grads: clip_global(grads, self.settings.clip)

    def attacker_samples(self, grads: Gradients, n: int, generator: torch.Generator) -> Gradients:
        """``grads`` plus the noise of one noisy gradient, std σC/B (the clip is
        :meth:`attacker_transform`'s). A FedAvg delta turned into a gradient averages
        ``local_steps`` of them: its noise is smaller by √local_steps, which this does not
        model."""
        std = self.settings.noise_multiplier * self.settings.clip / self._attacked_batch_size()
        return {
            k: g[None] + std * torch.randn((n, *g.shape), generator=generator, dtype=g.dtype).to(g)
            for k, g in grads.items()
        }

    def _attacked_batch_size(self) -> int:
        if self.batch_size is None:
            raise ValueError(
                "DP-SGD's noise std σC/B depends on the victim's batch size: set "
                "defense.batch_size (the shared update's meta.batch_size) before attacking it"
            )
        return self.batch_size

    def epsilon(self, sample_rate: float, steps: int, local_steps: int = 1) -> float:
        """ε spent by one client at this defense's σ and δ (see :func:`privacy_spent`)."""
        s = self.settings
        return privacy_spent(
            s.noise_multiplier, sample_rate, steps, s.delta, s.accountant, local_steps
        )


def clipped_per_sample_gradients(
    model: nn.Module, inputs: Tensor, labels: Tensor, loss_fn: LossFn, clip: float
) -> tuple[Gradients, Tensor]:
    """Per-example gradients (per layer (B, *shape)) each scaled to L2 norm at most ``clip`` over
    all layers together, and the norms before clipping, shape (B,)."""
    grads = per_sample_gradients(model, inputs, labels, loss_fn)
    norms = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads.values()))
    scale = torch.clamp(clip / norms, max=1.0)  # a zero gradient: inf, clamped to 1
    return {n: g * scale.view(-1, *[1] * (g.ndim - 1)) for n, g in grads.items()}, norms


def privacy_spent(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: Accountant = "rdp",
    local_steps: int = 1,
) -> float:
    """ε of ``steps`` sampled batches at ``sample_rate``, each used for ``local_steps`` noisy
    gradients of noise multiplier σ, at ``delta``, by Opacus's accountant.

    The ``local_steps`` gradients on one batch count as one Gaussian mechanism of noise
    multiplier σ/√local_steps (module docstring). σ = 0 gives inf, no step gives 0.
    """
    if noise_multiplier < 0 or not 0 < sample_rate <= 1 or steps < 0 or local_steps < 1:
        raise ValueError(
            f"privacy_spent needs σ ≥ 0, 0 < sample_rate ≤ 1, steps ≥ 0 and local_steps ≥ 1; "
            f"got {noise_multiplier}, {sample_rate}, {steps} and {local_steps}"
        )
    if not 0 < delta < 1:
        raise ValueError(f"privacy_spent needs 0 < delta < 1; got {delta}")
    if accountant not in get_args(Accountant):
        raise ValueError(
            f"privacy_spent: unknown accountant {accountant!r}; one of {get_args(Accountant)}"
        )
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    # Imported here: Opacus takes about a second to import, and only the accounting needs it.
    from opacus.accountants import create_accountant

    acct = create_accountant(mechanism=accountant)
    acct.history = [(noise_multiplier / math.sqrt(local_steps), sample_rate, steps)]
    return float(acct.get_epsilon(delta=delta))
