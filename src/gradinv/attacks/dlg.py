"""Deep Leakage from Gradients, DLG (Zhu et al. 2019, arXiv:1906.08935), and the shared L-BFGS loop.

Threat model: honest-but-curious server, one shared gradient (or a FedAvg delta, read as the
gradient of one equivalent step). Dummy images and dummy soft labels are optimized jointly with
L-BFGS to minimise the Euclidean gradient distance, the sum over all layers of squared
differences between the dummy gradient and the shared one. The dummy label is a vector of logits;
its softmax is the target of a soft-label cross-entropy, as in the public code
(mit-han-lab/dlg ``main.py``: ``cross_entropy_for_onehot(pred, softmax(dummy_label))``). When the
threat model grants the labels (``labels: known``), they are used and not optimized.

Where this follows the public code rather than the paper: L-BFGS as ``torch.optim.LBFGS`` with
the code's defaults (lr 1, 20 function evaluations per step, a curvature history of 100, no line
search); one *iteration* is one ``optimizer.step(closure)`` (the code runs 300, iDLG's code 300,
breaching's ``deepleakage`` 1200); the dummy images start from a standard normal in the model's
input space. Not from the code: images are optimized in the model's normalised input space (our
models normalise; DLG's do not); R restarts keep the one whose final gradient distance is lowest
(the code runs one); the images are clamped to [0, 1] only at the end (L-BFGS is unboxed).

:class:`DLG` holds the loop that :mod:`~gradinv.attacks.idlg` (labels from the gradient) and
:mod:`~gradinv.attacks.cpl` (label regulariser, patterned initialization) reuse through two
hooks, :meth:`DLG._labels` and :meth:`DLG._regularizer`. With a
:class:`~gradinv.progress.Progress` the loop saves its state (images, soft labels, L-BFGS state,
generator, history) after each step that is due and resumes from it bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradinv.attacks import ATTACKS
from gradinv.attacks.base import CPU, Attack, AttackFailed, AttackResult, MatchSettings
from gradinv.attacks.matching import euclidean_distances
from gradinv.models import auxiliary_loss
from gradinv.progress import Progress
from gradinv.protocol import ServerMessage, SharedUpdate, denormalize
from gradinv.settings import bounded

Init = Literal["gaussian", "uniform", "patterned"]
LineSearch = Literal["none", "strong_wolfe"]


def initial_images(
    init: Init, shape: tuple[int, ...], generator: torch.Generator, pattern_size: int = 0
) -> Tensor:
    """Starting dummies in the model's input space, drawn from ``generator`` (on the CPU).

    As in the public codes, whose models see the raw pixels, the draws are in the space the model
    sees: ``gaussian`` N(0, 1) (DLG's and iDLG's ``torch.randn``); ``uniform`` U(0, 1);
    ``patterned`` CPL's geometric seed, a U(0, 1) tile of ``pattern_size`` pixels (0: half the
    image side, the CPL notebooks' 2x2 tiling) repeated over the image.
    """
    if init == "gaussian":
        return torch.randn(shape, generator=generator)
    if init == "uniform":
        return torch.rand(shape, generator=generator)
    b, c, h, w = shape
    ph = pattern_size or -(-h // 2)
    pw = pattern_size or -(-w // 2)
    tile = torch.rand((b, c, ph, pw), generator=generator)
    return tile.repeat(1, 1, -(-h // ph), -(-w // pw))[:, :, :h, :w].contiguous()


class _NonFinite(Exception):
    pass


def _closure(
    opt: torch.optim.LBFGS, variables: list[Tensor], evaluate: Callable[[], tuple[Tensor, Tensor]]
) -> Callable[[], Tensor]:
    """L-BFGS's closure: the objective, its gradient in the variables' ``.grad`` only."""

    def closure() -> Tensor:
        opt.zero_grad()
        distance, reg = evaluate()
        total = distance + reg
        if not torch.isfinite(total):
            raise _NonFinite
        grads = torch.autograd.grad(total, variables)
        for v, g in zip(variables, grads, strict=True):
            v.grad = g
        return total.detach()

    return closure


@ATTACKS.register("dlg")
class DLG(Attack):
    @dataclass(frozen=True)
    class Settings(MatchSettings):
        iterations: int = bounded(300, ge=1, doc="L-BFGS steps (each up to max_iter evaluations)")
        lr: float = bounded(1.0, gt=0.0)
        max_iter: int = bounded(20, ge=1, doc="function evaluations per L-BFGS step")
        history_size: int = bounded(100, ge=1, doc="L-BFGS curvature pairs kept")
        line_search: LineSearch = "none"
        restarts: int = bounded(1, ge=1)
        init: Init = "gaussian"
        pattern_size: int = bounded(0, ge=0, doc="tile side of the patterned init; 0 = half")
        log_every: int = bounded(10, ge=1)

    name = "DLG"

    def reconstruct(
        self,
        server: ServerMessage,
        update: SharedUpdate,
        generator: torch.Generator,
        *,
        device: torch.device = CPU,
        progress: Progress | None = None,
    ) -> AttackResult:
        s, meta = self.settings, update.meta
        model, named, target = self.match_target(server, update, device)
        params = [p for _, p in named]
        fixed = self._labels(model, update)
        match = self.gradient_match(update, [n for n, _ in named], target, euclidean_distances)
        labels = None if fixed is None else fixed.to(device)
        if labels is None:
            self.label_note = "joint: soft labels optimized with the images (DLG)"

        def objective(x: Tensor, soft: Tensor | None, graph: bool) -> tuple[Tensor, Tensor]:
            """(gradient distance, regulariser) at the dummies ``x`` and soft labels ``soft``."""
            logits = model(x)
            if soft is None:
                loss = F.cross_entropy(logits, labels)
            else:  # DLG's soft-label cross-entropy
                loss = torch.sum(-F.softmax(soft, -1) * F.log_softmax(logits, -1), -1).mean()
            aux = auxiliary_loss(model)  # a variational bottleneck's KL, as in the client's loss
            if aux is not None:
                loss = loss + aux
            dummy = torch.autograd.grad(loss, params, create_graph=graph)
            reg = self._regularizer(logits, labels) if graph else logits.new_zeros(())
            return match.one(list(dummy), generator), reg

        best: tuple[float, int, Tensor, Tensor] | None = None
        history: dict[str, list[tuple[int, float]]] = {}
        first_restart, first_it, saved = 0, 0, progress.load() if progress else None
        if saved is not None:
            first_restart, first_it = saved["restart"], saved["iteration"]
            history, best = saved["history"], saved["best"]
            progress.resumed(f"restart {first_restart + 1}, iteration {first_it}")
        for restart in range(first_restart, s.restarts):
            shape = (meta.batch_size, *meta.image_shape)
            x = initial_images(s.init, shape, generator, s.pattern_size)
            x = x.to(device).requires_grad_(True)
            soft = None
            if labels is None:  # DLG's dummy label: N(0, 1) logits, optimized with the images
                soft = torch.randn((meta.batch_size, meta.num_classes), generator=generator)
                soft = soft.to(device).requires_grad_(True)
            variables = [x] if soft is None else [x, soft]
            opt = torch.optim.LBFGS(
                variables,
                lr=s.lr,
                max_iter=s.max_iter,
                history_size=s.history_size,
                line_search_fn=None if s.line_search == "none" else s.line_search,
            )
            start = 0
            if saved is not None and restart == first_restart:
                with torch.no_grad():
                    x.copy_(saved["x"])
                    if soft is not None:
                        soft.copy_(saved["soft"])
                opt.load_state_dict(saved["optimizer"])
                generator.set_state(saved["generator"])
                start = first_it

            closure = _closure(opt, variables, partial(objective, x, soft, True))
            curve = history.setdefault(f"loss_restart{restart}", [])
            desc = f"{self.name} restart {restart + 1}/{s.restarts}"
            for it in self.iterations(desc, start, s.iterations):
                try:
                    loss = float(opt.step(closure))
                except _NonFinite:
                    raise AttackFailed(
                        f"non-finite attack loss at restart {restart}, L-BFGS step {it}"
                    ) from None
                if it % s.log_every == 0 or it == s.iterations - 1:
                    curve.append((it, loss))
                if progress and progress.due():
                    progress.save(
                        {
                            "restart": restart,
                            "iteration": it + 1,
                            "x": x.detach().cpu(),
                            "soft": None if soft is None else soft.detach().cpu(),
                            "optimizer": opt.state_dict(),
                            "generator": generator.get_state(),
                            "history": history,
                            "best": best,
                        }
                    )
            final = objective(x.detach(), None if soft is None else soft.detach(), False)[0].item()
            history.setdefault("final_gradient_distance", []).append((restart, final))
            if not torch.isfinite(torch.tensor(final)):
                raise AttackFailed(f"non-finite final gradient distance at restart {restart}")
            if best is None or final < best[0]:
                used = labels if soft is None else soft.detach().argmax(-1)
                best = (final, restart, x.detach().cpu().clone(), used.cpu().clone())

        assert best is not None
        images = denormalize(best[2], meta.mean, meta.std).clamp(0, 1)
        return AttackResult(
            images=images,
            labels=best[3],
            history=history,
            summary={
                "best_restart": best[1],
                "gradient_distance": best[0],
                # L-BFGS couples whatever it optimizes (one curvature history, one step size):
                # stacking restarts would change the algorithm, so they run one after another
                "restarts_layout": "sequential",
            },
        )

    def _labels(self, model: nn.Module, update: SharedUpdate) -> Tensor | None:
        """The fixed labels, or None to optimize soft labels with the images (DLG)."""
        if self.threat.labels == "known":
            return self.private_labels(model, update)
        return None

    def _regularizer(self, logits: Tensor, labels: Tensor | None) -> Tensor:
        """An extra term of the objective (none in DLG; CPL's label regulariser)."""
        return logits.new_zeros(())
