"""Refiner (Fan et al., USENIX Security 2025, arXiv:2212.02042): share the gradient of robust data.

Threat model: an honest-but-curious server that inverts the shared gradient. Instead of the
gradient g of its batch x, the client shares the gradient g* of *robust data* x*, images that keep
x's utility (their gradient is close to g) but carry little of x's content (the evaluation network
sees mostly noise in them). Section 3 of the paper:

    x* = argmin_x*  UM(x*, x) - beta * PM(x*)                                         (Eq. 2)
    UM = || weight * (grad L(x*) - g) ||^2,  weight(theta[i]) = |g[i] * theta[i] * tau^i|  (3-4)

PM is the evaluation network's predicted noise ratio of x* (``gradinv.metrics.evaluation_network``,
trained by the pipeline on the dataset's public split, Appendix D). The search starts from the
noise-blended x* = (1 - alpha) x + alpha v, v ~ U(0, 1) (Section 3.4), runs ``iterations`` (iota)
steps, and the shared gradient is projected to within epsilon of g (Appendix J): g* when
||g* - g|| <= epsilon, else g + epsilon (g* - g) / ||g* - g||. Defaults alpha 0.5, beta 1, iota
10, tau 0.95 (Section 5.2); the paper sweeps epsilon over 0.01-0.9. With ``warm_start`` a client
starts from the robust data it made for the same image in an earlier round and runs
``warm_iterations`` (5 in the paper's Table 4) steps.

No official code exists. Where the paper is silent or ambiguous, these are the choices made here:
- The weighting: Eq. 4 puts the weight inside the squared norm, sum((w * d)^2); the text calls UM
  "the weighted sum of the squared differences", sum(w * d^2). ``weighting: equation | text``
  selects either; Eq. 4 is the default. The weight is computed once, from the true gradient g and
  the parameters the client received, and held constant during the search.
- A "layer" theta[i] is a module that owns parameters, counted from 1 in the model's order of
  registration (its weight and bias share tau^i).
- PM is the batch mean of the predicted ratios; UM is summed over the model's parameters.
- The search is plain gradient descent on x* in image space [0, 1] with step ``lr`` (Fig. 5:
  10 iterations at learning rate 1), x* clamped to [0, 1] after every step; the uniform noise is
  drawn per pixel and channel from the client's generator.
- The label of x* is x's label; the model's own loss terms (a variational bottleneck's KL) count.
- Batch-norm running statistics are not moved by the search; the final pass, on x* (the update
  the client shares), moves them once, with x*'s statistics (an undefended client's pass moves
  them with x's): the server averages what its clients computed on.
- ``epsilon_scale: relative`` (ours) reads epsilon as a fraction of ||g||, so one value means the
  same across models and batch sizes; ``absolute`` (the paper's) bounds ||g_upload - g|| by
  epsilon itself.
- Warm start: a batch runs ``warm_iterations`` steps only when every image in it has robust data
  from an earlier round (or, under FedAvg, from the client's previous local step on the same
  batch), else ``iterations`` from the noise-blended start (images are recognised by their
  bytes: a client knows its own data).
- On the embedded 3-layer CNN the weights |g * theta * tau^i| are of order 1e-3, so UM's image
  gradient is 1e-4 to 1e-6 of PM's and PM drives the search; on the paper's LeNet (sigmoid) UM's
  is 5 to 35 times PM's (measured, docs/defenses.md): how much UM shapes x* depends on the model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import Defense, Gradients, LossFn, gradients_of
from gradinv.models import buffers_kept
from gradinv.protocol import denormalize, normalize
from gradinv.settings import bounded


@DEFENSES.register("refiner")
class Refiner(Defense):
    """The client shares the gradient of robust data x*, within epsilon of its true gradient."""

    # The noise-blended start is random, but its randomness acts on the private images: an EOT
    # attacker cannot sample it without them, so Refiner offers no attacker_samples.
    needs_evaluation_network = True

    @dataclass(frozen=True)
    class Settings:
        epsilon: float = bounded(
            0.9, gt=0.0, doc="the shared gradient stays within epsilon of the true one (App. J)"
        )
        epsilon_scale: Literal["absolute", "relative"] = "absolute"
        alpha: float = bounded(0.5, ge=0.0, le=1.0, doc="blend factor of the noise-blended start")
        beta: float = bounded(1.0, ge=0.0, doc="weight of the privacy term PM in Eq. 2")
        iterations: int = bounded(10, ge=0, doc="iota: gradient-descent steps on x*")
        tau: float = bounded(0.95, ge=0.0, le=1.0, doc="layer-wise weight decay tau^i")
        lr: float = bounded(1.0, gt=0.0, doc="step size of the gradient descent on x*")
        weighting: Literal["equation", "text"] = "equation"
        element_weight: bool = True  # |g * theta| per element; false: tau^i alone (Table 10)
        warm_start: bool = False
        warm_iterations: int = bounded(5, ge=0, doc="iota when every image has robust data")

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._robust: dict[str, Tensor] = {}  # warm start: an image's robust data, by its bytes

    def state_dict(self) -> dict[str, Any]:
        return {"robust": dict(self._robust)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._robust = dict(state["robust"])

    def shared_update(
        self,
        model: nn.Module,
        inputs: Tensor,
        labels: Tensor,
        loss_fn: LossFn,
        generator: torch.Generator,
    ) -> Gradients:
        s = self.settings
        network = self._network(inputs)
        mean, std = self._normalization()
        with buffers_kept(model):
            true = {n: g.detach() for n, g in gradients_of(model, inputs, labels, loss_fn).items()}
        weights = self._weights(model, true)
        images = denormalize(inputs.detach(), mean, std).clamp(0, 1)
        keys = [hashlib.sha256(x.cpu().numpy().tobytes()).hexdigest() for x in images]
        warm = s.warm_start and all(k in self._robust for k in keys)
        if warm:
            robust = torch.stack([self._robust[k] for k in keys]).to(images)
            steps = s.warm_iterations
        else:
            noise = torch.rand(images.shape, generator=generator, dtype=images.dtype)
            robust = (1 - s.alpha) * images + s.alpha * noise.to(images.device)
            steps = s.iterations
        start_ratio = float(network(robust).mean())
        utility = []  # UM before each step
        with buffers_kept(model):
            for _ in range(steps):
                robust, um = self._step(model, network, robust, labels, true, weights, loss_fn)
                utility.append(um)
        if s.warm_start:
            self._robust.update(zip(keys, robust.detach().cpu(), strict=True))
        shared = {
            n: g.detach()
            for n, g in gradients_of(model, normalize(robust, mean, std), labels, loss_fn).items()
        }
        upload, distance, bound = self._project(shared, true)
        self.last = {
            "gradient_distance": distance,  # ||g* - g|| before the projection
            "epsilon": bound,  # in gradient units (epsilon_scale resolved)
            "projected": distance > bound,
            "noise_ratio_start": start_ratio,
            "noise_ratio": float(network(robust).mean()),  # PM of the shared robust data
            "utility_gap_start": utility[0] if utility else None,  # UM of the start
            "utility_gap": utility[-1] if utility else None,  # UM before the last step
            "image_mse": float((robust - images).pow(2).mean()),
            "iterations": steps,
            "warm_start": warm,
        }
        return upload

    def _step(
        self,
        model: nn.Module,
        network: nn.Module,
        robust: Tensor,
        labels: Tensor,
        true: Gradients,
        weights: Gradients,
        loss_fn: LossFn,
    ) -> tuple[Tensor, float]:
        """One gradient-descent step on x* for UM - beta * PM, then back into [0, 1]; and the
        UM it started from."""
        s = self.settings
        mean, std = self._normalization()
        x = robust.detach().requires_grad_(True)
        grads = gradients_of(model, normalize(x, mean, std), labels, loss_fn, create_graph=True)
        if s.weighting == "equation":  # Eq. 4: the weight inside the squared norm
            um = sum((weights[n] * (grads[n] - true[n])).pow(2).sum() for n in true)
        else:  # the text: a weighted sum of squared differences
            um = sum((weights[n] * (grads[n] - true[n]).pow(2)).sum() for n in true)
        objective = um - s.beta * network(x).mean()
        (step,) = torch.autograd.grad(objective, x)
        return (x - s.lr * step).clamp(0, 1).detach(), float(um.detach())

    def _weights(self, model: nn.Module, true: Gradients) -> Gradients:
        """|g * theta * tau^i| for every parameter, i the 1-based index of its module (Eq. 3);
        without the element-wise weight (``element_weight: false``, Table 10) tau^i alone."""
        weights: Gradients = {}
        layer = 0
        for prefix, module in model.named_modules():
            own = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            layer += 1
            for n, p in own:
                name = f"{prefix}.{n}" if prefix else n
                decay = self.settings.tau**layer
                weights[name] = (
                    (true[name] * p.detach() * decay).abs()
                    if self.settings.element_weight
                    else torch.full_like(p, decay)
                )
        return weights

    def _project(self, shared: Gradients, true: Gradients) -> tuple[Gradients, float, float]:
        """Appendix J: the closest gradient to g* within epsilon of the true gradient g."""
        s = self.settings
        diff = {n: shared[n] - true[n] for n in true}
        distance = float(torch.sqrt(sum(d.pow(2).sum() for d in diff.values())))
        bound = s.epsilon
        if s.epsilon_scale == "relative":
            bound *= float(torch.sqrt(sum(g.pow(2).sum() for g in true.values())))
        if distance <= bound:
            return shared, distance, bound
        return {n: true[n] + bound * diff[n] / distance for n in true}, distance, bound

    def _network(self, inputs: Tensor) -> nn.Module:
        if self.evaluation_network is None:
            raise ValueError(
                "Refiner needs the evaluation network (its privacy term); the pipeline trains "
                "it per dataset (snakemake data/evalnet/<dataset>.pt) and passes it to "
                "build_defense(..., evaluation_network=...)"
            )
        return self.evaluation_network.to(inputs.device)

    def _normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        if self.normalization is None:
            raise ValueError(
                "Refiner works on images in [0, 1] and needs the dataset's mean and std: pass "
                "build_defense(..., normalization=(mean, std))"
            )
        return self.normalization
