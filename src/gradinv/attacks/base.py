"""The attack interface and the threat model every attack honours and records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from gradinv.attacks.labels import infer_labels
from gradinv.attacks.matching import target_gradients
from gradinv.models import build_model, classifier_layer
from gradinv.progress import Progress
from gradinv.protocol import ServerMessage, SharedUpdate

CPU = torch.device("cpu")


class AttackFailed(RuntimeError):
    """The attack could not produce a reconstruction (for example a non-finite loss)."""


@dataclass(frozen=True)
class ThreatModel:
    """What the attacker knows beyond the shared update. Recorded with every result.

    ``labels``: ``known`` (the server is given the private labels, a stronger attacker) or
    ``infer`` (read from the last-layer gradient by ``label_rule``: ``idlg``, Zhao et al. 2020,
    for one image; ``yin``, the row rule of Yin et al. 2021, for a batch; ``auto`` picks by size).
    ``model_mode``: whether the victim computed its update with the model in eval or train mode.
    ``bn_statistics``: whether the victim's batch-norm statistics are available (CENSOR: no).
    """

    labels: Literal["infer", "known"] = "infer"
    label_rule: Literal["auto", "idlg", "yin"] = "auto"
    model_mode: Literal["eval", "train"] = "eval"
    bn_statistics: bool = False


@dataclass(frozen=True)
class MatchSettings:
    """Settings every attack shares: which layers' gradients it matches, and how.

    ``layers``: glob patterns (``fnmatch``) of the parameter names to match, ``*`` for all;
    ``ignore_layers``: patterns dropped from those. Ignoring layers is the adaptive attack of the
    CVB paper against PRECODE and CVB (drop the stochastic bottleneck's layers); matching fewer
    layers is also cheaper. The names matched are recorded with every result.

    ``transform_aware``: the attacker passes its dummy gradient through the defense's
    deterministic transform before comparing it with the shared update, as the GGL and GIFD code
    do (:meth:`gradinv.defenses.Defense.attacker_transform`): ``configured`` with the defense's
    settings (the server knows what its clients run), ``estimated`` with what the shared update
    reveals (its norm, its zeros). A defense with nothing deterministic to apply (noise, CENSOR)
    is matched as is, and the result says so; EOT is the adaptive attack against those. With a
    subset of ``layers``, a transform over the whole model (global clipping) sees only those.
    """

    layers: tuple[str, ...] = ("*",)
    ignore_layers: tuple[str, ...] = ()
    transform_aware: Literal["off", "configured", "estimated"] = "off"


@dataclass
class AttackResult:
    images: Tensor  # (B, C, H, W) in [0, 1]
    labels: Tensor  # the labels the attack used (inferred or given)
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


class Attack:
    """An attack: ``Settings`` (a frozen dataclass) and :meth:`reconstruct`.

    ``reconstruct`` runs on ``device``; a long attack accepts a ``progress``
    (:class:`gradinv.progress.Progress`), saves its loop state when ``progress.due()`` and resumes
    from ``progress.load()``, so an interrupted job continues with the same result.
    """

    Settings: ClassVar[type]

    def __init__(self, settings: Any, threat: ThreatModel) -> None:
        self.settings = settings
        self.threat = threat
        # Recorded with each result: set by matched_parameters and dummy_transform.
        self.matched_names: list[str] = []
        self.transform_note = "off"

    def reconstruct(
        self,
        server: ServerMessage,
        update: SharedUpdate,
        generator: torch.Generator,
        *,
        device: torch.device = CPU,
        progress: Progress | None = None,
    ) -> AttackResult:
        raise NotImplementedError

    def matched_parameters(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """The trainable parameters whose gradients the attack matches, in model order."""
        s = self.settings
        named = [
            (n, p)
            for n, p in model.named_parameters()
            if p.requires_grad
            and any(fnmatchcase(n, pat) for pat in s.layers)
            and not any(fnmatchcase(n, pat) for pat in s.ignore_layers)
        ]
        if not named:
            names = ", ".join(n for n, _ in model.named_parameters())
            raise ValueError(
                f"layers {list(s.layers)} less ignore_layers {list(s.ignore_layers)} match no "
                f"parameter of the model; its parameters are: {names}"
            )
        self.matched_names = [n for n, _ in named]
        return named

    def match_target(
        self, server: ServerMessage, update: SharedUpdate, device: torch.device = CPU
    ) -> tuple[nn.Module, list[tuple[str, nn.Parameter]], list[Tensor]]:
        """What every attack starts from: the attacker's model, the parameters it matches and
        the shared update as a gradient of those parameters, on ``device``."""
        model = self.server_model(server, device)
        named = self.matched_parameters(model)
        target = target_gradients(
            {k: v.to(device) for k, v in update.tensors.items()},
            [n for n, _ in named],
            update.kind,
            update.meta.local_lr,
            update.meta.local_steps,
        )
        return model, named, target

    def dummy_transform(
        self, update: SharedUpdate, names: list[str], target: list[Tensor]
    ) -> Callable[[list[Tensor]], list[Tensor]]:
        """What the attack applies to its dummy gradient (layers ``names``) before matching it
        against ``target``: the identity, or the defense's transform (``transform_aware``)."""
        mode, meta = self.settings.transform_aware, update.meta
        self.transform_note = "off"
        if mode == "off":
            return lambda grads: grads
        from gradinv.defenses import build_defense

        defense = build_defense(
            meta.defense_kind, meta.defense_settings, where=f"the capture's defense {meta.defense}"
        )
        view = defense.attacker_transform(dict(zip(names, target, strict=True)), mode)
        if view is None:
            self.transform_note = f"{mode}: none, {meta.defense_kind} is not deterministic"
            return lambda grads: grads
        self.transform_note = f"{mode}: {meta.defense_kind}"

        def apply(grads: list[Tensor]) -> list[Tensor]:
            out = view(dict(zip(names, grads, strict=True)))
            return [out[n] for n in names]

        return apply

    def private_labels(self, model: nn.Module, update: SharedUpdate) -> Tensor:
        """The victim's labels: given, where the threat model grants them, else inferred from
        the last layer's gradient by ``threat.label_rule`` (a FedAvg delta is a negative step)."""
        meta = update.meta
        if self.threat.labels == "known":
            if meta.labels is None:
                raise AttackFailed(
                    "the threat model grants known labels, but the capture carries none; "
                    "recapture with threat_model.labels: known"
                )
            return torch.tensor(meta.labels)
        name, _ = classifier_layer(model)
        grad = update.tensors[f"{name}.weight"]
        if update.kind == "delta":
            grad = -grad
        return infer_labels(grad, meta.batch_size, self.threat.label_rule)

    def server_model(self, server: ServerMessage, device: torch.device = CPU) -> nn.Module:
        """The attacker's copy of the global model on ``device``, in the victim's mode."""
        model = build_model(server.model)
        model.load_state_dict(server.state)
        model.to(device)
        model.train(self.threat.model_mode == "train")
        for p in model.parameters():
            p.requires_grad_(True)
        return model
