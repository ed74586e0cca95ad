"""Soteria (Sun et al., CVPR 2021, arXiv:2012.06043): prune the representation's leakiest features.

Threat model: an honest-but-curious server inverts the shared gradient. Soteria perturbs the
representation r, the input of the last fully connected layer, where the data leak most: it drops
the features f whose removal pushes a reconstruction farthest from X (to first order, removing
r_f takes a change of X of r_f / ‖∂r_f/∂X‖), the ones with the smallest ‖∂r_f/∂X‖ / r_f, and
shares the gradient with those columns of the classifier's weight gradient set to zero. The
classifier's bias and every other layer are shared as computed.

The official code (jeremy313/Soteria, and its copy ``perturb_representation`` in the GGL, GIFD
and CENSOR code), which this follows: for each feature f, backpropagate a one-hot on the column
r[:, f] to X (one backward pass per feature), take each sample's ‖X.grad_i‖₂ / (r_if + ε) with
the signed r_if, sum over the batch, and zero the features whose sum lies strictly below the
``100 * prune``-th percentile (linear interpolation, numpy's default). The versions differ in two
numbers, both settings:

- ``prune``: the code's pruning rate over 100: 60 in the GS README, 1 in the DLG notebook, 10 in
  the GGL/GIFD/CENSOR code (the default: CENSOR's tables use it), 50 in the DCS² scripts.
- ``epsilon``: 0.1 in ``GS_attack/reconstruct_image.py``, 0 in the DLG notebook, 1e-10 in the
  GGL/GIFD/CENSOR code (the default).

Where this differs from the code: a non-finite ratio (r_if + ε = 0, say a dead ReLU feature with
ε = 0) raises, where the code's NaN percentile silently prunes nothing; the code compares |sum|
with the percentile of the signed sums, here the signed sums are compared, the same whenever r ≥ 0
(after a ReLU or a sigmoid, as in the CNNs here; the ViT's class token is signed, and there the
code prunes nothing whenever the percentile is negative); its backward passes also accumulate
parameter gradients it then discards, here they run to X alone. As in the code, features whose
ratio is 0 (a ReLU unit at 0 for every sample: r_f and ∂r_f/∂X vanish) tie at the bottom, and
when more than a fraction ``prune`` of the features are dead the percentile is 0 and nothing is
pruned (an untrained ``cnn3`` at prune 0.1 on random images, say).

The one-hot covers the whole column, so X.grad_i is ∂(Σ_j r_jf)/∂X_i: in eval mode that is
∂r_if/∂X_i, in train mode batch norm couples the samples and the cross terms count, as in the code.
The mask comes from a second, functional forward pass of the model in its current mode, with its
batch-norm buffers cloned (their running statistics move once, in the gradient's own pass, as
undefended) and the random state replayed (dropout draws the same masks in both passes).

``dead_features``: a feature that is 0 for every sample (a dead ReLU) has ratio 0, and its
column of the gradient is zero anyway. Where more than ``prune`` of the features are dead (the
untrained 3-layer CNN: about half of them), the code's percentile is 0 and nothing is pruned:
``as-coded`` keeps that; ``excluded`` takes the percentile over the features with a non-zero
ratio, so ``prune`` of the live features are pruned (our variant; neither paper nor code has it).

``derivatives``: ``per_feature`` is the code's loop, one backward pass per feature;
``batched`` takes them together, ``torch.func.vmap`` over the one-hot cotangents, in chunks of
features whose largest activation gradient stays under 2**27 numbers (512 MiB in float32);
``auto`` batches off the CPU and loops on it, where the loop measured faster (``benchmarks/
soteria.py``, two threads, batch 8, 32x32, medians of two runs: ResNet-18 16-18 s looped against
48-53 s batched, an undefended update taking 0.08 s; the 3-layer CNN 0.54-0.68 s against
0.79-0.93 s): there the vmapped backward passes move more memory than they save. On a GPU,
where the loop pays a kernel launch per layer and feature, batching is expected to win; not yet
measured. Both give the same ratios up to rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import Defense, Gradients, LossFn, gradients_of
from gradinv.models import auxiliary_loss, classifier_layer
from gradinv.settings import bounded

CHUNK_NUMBERS = 2**27  # batched: the largest activation gradient of one chunk of features


@DEFENSES.register("soteria")
class Soteria(Defense):
    @dataclass(frozen=True)
    class Settings:
        prune: float = bounded(
            0.1, ge=0.0, le=1.0, doc="the features below this quantile of the ratio are pruned"
        )
        epsilon: float = bounded(
            1e-10, ge=0.0, doc="ε of ‖∂r_f/∂X‖/(r_f + ε): GGL/GIFD/CENSOR 1e-10, GS 0.1, DLG 0"
        )
        derivatives: Literal["auto", "batched", "per_feature"] = "auto"
        dead_features: Literal["as-coded", "excluded"] = "as-coded"

    def shared_update(
        self,
        model: nn.Module,
        inputs: Tensor,
        labels: Tensor,
        loss_fn: LossFn,
        generator: torch.Generator,
    ) -> Gradients:
        s = self.settings
        name, classifier = classifier_layer(model)
        weight = f"{name}.weight" if name else "weight"
        # the mask's forward pass below replays the random numbers this one draws
        with torch.random.fork_rng(devices=[inputs.device] if inputs.is_cuda else []):
            grads = gradients_of(model, inputs, labels, loss_fn)
        if weight not in grads:
            raise ValueError(f"Soteria masks the gradient of {weight}, which is not trainable")
        batched = s.derivatives == "batched" or (s.derivatives == "auto" and inputs.is_cuda)
        ratios = feature_ratios(model, classifier, inputs, s.epsilon, batched)
        keep = keep_mask(ratios, s.prune, s.dead_features == "excluded")
        self.last = {
            "pruned_features": int((~keep).sum()),
            "features": keep.numel(),
            "zero_ratio_features": int((ratios == 0).sum()),  # dead: more than prune, none pruned
        }
        return {**grads, weight: grads[weight] * keep}

    def transform(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        raise TypeError("Soteria needs the model and the batch; call shared_update")

    def attacker_transform(
        self, observed: Gradients, mode: Literal["configured", "estimated"]
    ) -> Callable[[Gradients], Gradients]:
        """Zero the dummy gradient's classifier columns that are all zero in the shared update.

        Both modes read the mask from the shared update: it depends on the victim's
        representation, which no setting gives the attacker (GIFD's adaptive attack, with
        configured parameters, and GGL's, with estimated ones, both read it there, from row 0
        alone; here a column counts as pruned when all its rows are zero).
        The classifier's weight is the last 2-D tensor of the matched layers (the code's
        ``gradient[-2]``); without one, Soteria changed none of them and this is the identity.
        """
        matrices = [n for n, g in observed.items() if g.ndim == 2]
        if not matrices:
            return lambda grads: grads
        weight = matrices[-1]
        keep = observed[weight].ne(0).any(dim=0)
        return lambda grads: {**grads, weight: grads[weight] * keep}


def feature_ratios(
    model: nn.Module, classifier: nn.Module, inputs: Tensor, epsilon: float, batched: bool
) -> Tensor:
    """Per feature f of the classifier's input r: Σ_i ‖∂(Σ_j r_jf)/∂X_i‖₂ / (r_if + ε)."""
    r, pullback, largest = _representation(model, classifier, inputs)
    features = r.shape[1]
    onehots = torch.eye(features, dtype=r.dtype, device=r.device)[:, None, :]
    onehots = onehots.expand(features, *r.shape)  # f: ones on column f, zeros elsewhere

    def norms(onehot: Tensor) -> Tensor:
        return pullback(onehot)[0].flatten(1).norm(dim=1)

    if batched:
        chunk = max(1, CHUNK_NUMBERS // largest)
        per_sample = vmap(norms, chunk_size=chunk)(onehots)
    else:
        per_sample = torch.stack([norms(onehot) for onehot in onehots])
    ratios = (per_sample / (r.T + epsilon)).sum(dim=1)
    bad = int((~ratios.isfinite()).sum())
    if bad:
        raise ValueError(
            f"Soteria's ratio ‖∂r_f/∂X‖/(r_f + ε) is not finite for {bad} of {features} "
            f"features: some r_f + ε is 0 (epsilon={epsilon}); a representation "
            "that can be exactly 0 (ReLU) needs epsilon > 0, such as the GGL/GIFD/CENSOR 1e-10"
        )
    return ratios


def keep_mask(ratios: Tensor, prune: float, exclude_dead: bool = False) -> Tensor:
    """False for the features whose ratio lies strictly below the ``100 * prune``-th percentile;
    with ``exclude_dead``, the percentile of the non-zero ratios (a dead feature stays: its
    column of the gradient is zero anyway)."""
    ratios = ratios.double()
    if not exclude_dead:
        return ratios >= torch.quantile(ratios, prune)
    live = ratios != 0
    if not live.any():
        return torch.ones_like(live)
    return ~live | (ratios >= torch.quantile(ratios[live], prune))


def _representation(
    model: nn.Module, classifier: nn.Module, inputs: Tensor
) -> tuple[Tensor, Callable[[Tensor], tuple[Tensor]], int]:
    """The classifier's input r (batch, features), its pullback to the inputs, and the size of
    the largest module output of the pass. The model's parameters and buffers stay untouched."""
    seen: list[Tensor] = []
    sizes: list[int] = []

    def representation(x: Tensor) -> Tensor:
        # made inside the transform, so that batch norm may update them in train mode
        state = {n: b.clone() for n, b in model.named_buffers()}
        state |= {n: p.detach() for n, p in model.named_parameters()}
        hooks = [classifier.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))]
        hooks += [
            m.register_forward_hook(
                lambda _m, _a, out: sizes.append(out.numel() if isinstance(out, Tensor) else 0)
            )
            for m in model.modules()
        ]
        try:
            functional_call(model, state, (x,))
        finally:
            for h in hooks:
                h.remove()
        auxiliary_loss(model)  # clears the term this pass left (a bottleneck's KL): unused here
        if len(seen) != 1 or seen[0].ndim != 2:
            shapes = [tuple(t.shape) for t in seen]
            raise ValueError(
                "Soteria needs one input (batch, features) to the classifier per forward pass; "
                f"it saw {shapes}"
            )
        return seen[0]

    r, pullback = vjp(representation, inputs.detach())
    return r, pullback, max(sizes)
