"""R restarts of a gradient-matching attack as one computation, in the faster of two layouts.

The optimisation attacks (IG, GI) optimise R independent dummies ("restarts") and keep the best
(by gradient distance). Adam, sign and box are elementwise, so R restarts stacked into one
(R, B, C, H, W) tensor under one optimiser are R independent runs. What costs is the parameter
gradient of each restart, which must stay differentiable in its dummy (the attack differentiates
the gradient distance). Two layouts compute it:

- ``batched``: one ``torch.func.vmap`` over ``torch.func.grad``: the R forward and double
  backward passes run as one batched pass (convolutions over R·B images). It fills a GPU.
- ``sequential``: a loop over the restarts, one autograd graph each.

``auto`` picks what ``benchmarks/restarts.py`` measured faster (docs/attacks.md, its speed):
one restart runs ``sequential`` (vmap over one is pure overhead); several run ``batched`` on a
GPU, and on the CPU ``batched`` for a small model (under ``SMALL_MODEL`` parameters, where the
per-restart dispatch overhead dominates: the 3-layer CNN) and ``sequential`` for a large one
(ResNet-18, where vmap's batched double backward is slower on the CPU than R separate ones).
A model in train mode with batch norm always runs ``sequential``: vmap's second derivative
through train-mode batch norm disagrees with finite differences (PyTorch 2.14, about 4e-4
relative at the worst pixel), the loop's agrees; there the attacker's copy runs with BN momentum
0, so its running statistics never move. Both layouts give the same reconstruction up to
floating-point rounding (``tests/test_restarts.py``), so the choice changes speed only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from gradinv.attacks.base import AttackFailed
from gradinv.models import auxiliary_loss

Layout = Literal["auto", "batched", "sequential"]

# The logits of one restart's dummies -> (its loss, an auxiliary term such as GI's BN prior).
RestartLoss = Callable[[Tensor], tuple[Tensor, Tensor]]
# (R, B, C, H, W) dummies, create_graph -> per layer the (R, *shape) gradients, and aux (R,).
RestartGradients = Callable[[Tensor, bool], tuple[list[Tensor], Tensor]]


SMALL_MODEL = 1_000_000  # parameters; below it, batched restarts were faster on the CPU


def resolve_layout(layout: Layout, model: nn.Module, device: torch.device, restarts: int) -> str:
    """The layout that runs (see the module doc); never ``batched`` through train-mode BN."""
    train_bn = model.training and any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
    )
    if train_bn:
        return "sequential"
    if layout != "auto":
        return layout
    if restarts == 1:
        return "sequential"
    if device.type == "cuda":
        return "batched"
    small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL
    return "batched" if small else "sequential"


def restart_gradients(
    model: nn.Module,
    named: list[tuple[str, nn.Parameter]],
    loss_of: RestartLoss,
    layout: str,
) -> RestartGradients:
    """Per-restart gradients of ``loss_of(model(x_r))`` for the parameters ``named``.

    ``layout`` is a resolved one (:func:`resolve_layout`). The returned gradients keep the graph
    back to the dummies (``create_graph``) so that a distance of them can be differentiated.
    """
    task_loss = loss_of

    def loss_of(logits: Tensor) -> tuple[Tensor, Tensor]:
        # the model's own term (a variational bottleneck's KL) joins the dummy loss, as it
        # joined the client's: the attacker knows the architecture
        loss, extra = task_loss(logits)
        aux = auxiliary_loss(model)
        return (loss if aux is None else loss + aux), extra

    if layout == "batched":
        params = {n: p.detach() for n, p in named}
        buffers = dict(model.named_buffers())

        def restart_loss(p: dict[str, Tensor], xr: Tensor) -> tuple[Tensor, Tensor]:
            return loss_of(functional_call(model, (p, buffers), (xr,)))

        # randomness="different": a model that draws in its forward (a variational bottleneck)
        # draws anew for each restart, as the sequential loop does
        per_restart = vmap(
            grad(restart_loss, has_aux=True), in_dims=(None, 0), randomness="different"
        )

        def batched(x: Tensor, create_graph: bool) -> tuple[list[Tensor], Tensor]:
            # torch.func.grad differentiates even under an outer no_grad; the outer autograd
            # keeps the graph back to x unless called under no_grad, so create_graph is implied
            grads, aux = per_restart(params, x)
            return [grads[n] for n, _ in named], aux

        return batched

    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = 0.0  # a train-mode forward must not move the running statistics
    weights = [p for _, p in named]

    def sequential(x: Tensor, create_graph: bool) -> tuple[list[Tensor], Tensor]:
        per_layer: list[list[Tensor]] = [[] for _ in weights]
        aux = []
        for xr in x:
            with torch.enable_grad():
                loss, extra = loss_of(model(xr))
                grads = torch.autograd.grad(loss, weights, create_graph=create_graph)
            for layer, g in zip(per_layer, grads, strict=True):
                layer.append(g)
            aux.append(extra)
        return [torch.stack(layer) for layer in per_layer], torch.stack(aux)

    return sequential


def initial_dummies(
    restarts: int, shape: tuple[int, ...], generator: torch.Generator, device: torch.device
) -> Tensor:
    """R starting dummies from N(0, 1), drawn one restart after another on the CPU generator:
    restart r starts where the r-th of R separate runs would (without EOT, which draws from the
    same generator during the runs), in either layout."""
    draws = [torch.randn(shape, generator=generator) for _ in range(restarts)]
    return torch.stack(draws).to(device)


def loop_state(
    iteration: int,
    x: Tensor,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    generator: torch.Generator,
    history: dict[str, list[tuple[int, float]]],
    **extra: Any,
) -> dict[str, Any]:
    """What an Adam loop over stacked restarts saves to resume bit for bit (``extra``: the
    attack's own state, such as GI's group mean)."""
    return {
        "iteration": iteration,
        "x": x.detach().cpu(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "generator": generator.get_state(),
        "history": history,
        **extra,
    }


def resume_loop(
    saved: dict[str, Any],
    x: Tensor,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    generator: torch.Generator,
) -> tuple[int, dict[str, list[tuple[int, float]]]]:
    """Restore what :func:`loop_state` saved; returns the next iteration and the history."""
    with torch.no_grad():
        x.copy_(saved["x"])
    opt.load_state_dict(saved["optimizer"])
    sched.load_state_dict(saved["scheduler"])
    generator.set_state(saved["generator"])
    return saved["iteration"], saved["history"]


def log_restarts(
    history: dict[str, list[tuple[int, float]]], iteration: int, objective: Tensor
) -> None:
    """Append each restart's objective to its loss curve (``loss_restart<r>``)."""
    for r, value in enumerate(objective.tolist()):
        history.setdefault(f"loss_restart{r}", []).append((iteration, value))


def choose_restart(distances: list[float], output: str) -> tuple[int, int]:
    """(the best restart by final gradient distance, the one returned: the best, or the last as
    the GIFD code's ``choose_optimal`` does). A non-finite distance fails the attack."""
    if not all(math.isfinite(d) for d in distances):
        raise AttackFailed(f"non-finite final gradient distance: {distances}")
    best = min(range(len(distances)), key=distances.__getitem__)
    return best, len(distances) - 1 if output == "last" else best
