"""The attack interface and the threat model every attack honours and records."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn
from tqdm import tqdm

from gradinv.attacks.eot import Combine, Distances, eot_distance
from gradinv.attacks.labels import infer_labels
from gradinv.attacks.matching import target_gradients
from gradinv.methods import STOCHASTIC  # the "Ignore" attack's layer pattern
from gradinv.models import build_model, classifier_layer, stochastic_parameters
from gradinv.progress import Progress
from gradinv.protocol import ModelSpec, ServerMessage, SharedUpdate
from gradinv.settings import bounded

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
    ``ignore_layers``: patterns dropped from those. Ignoring layers is the "Ignore" attack of the
    CVB paper (Section III-B) against PRECODE and CVB: leave out the gradients of the variational
    bottleneck's decoder and of every later layer, whose gradients vary most with the random
    draw (earlier layers' gradients depend on it too, through backpropagation, but less). The
    pattern ``@stochastic`` names those layers without naming the architecture: the parameters
    of every module whose input changes between two forward passes of the same image
    (:func:`gradinv.models.stochastic_parameters`; a draw inside a module that also owns the
    layers after it is not seen); the server can find them, as it knows the architecture.
    Matching fewer layers is also cheaper. The names matched are recorded with every result.

    ``transform_aware``: the attacker passes its dummy gradient through the defense's
    deterministic transform before comparing it with the shared update, as the GGL and GIFD code
    do (:meth:`gradinv.defenses.Defense.attacker_transform`): ``configured`` with the defense's
    settings (the server knows what its clients run), ``estimated`` with what the shared update
    reveals (its norm, its zeros). A defense with nothing deterministic to apply (noise, CENSOR)
    is matched as is, and the result says so; EOT is the adaptive attack against those. With a
    subset of ``layers``, a transform over the whole model (global clipping) sees only those.

    ``eot_samples`` > 0: Expectation over Transformation against a randomized defense (CENSOR's
    Table III): the dummy gradient is compared through that many samples of the defense's random
    transformation, as configured, combined by ``eot_combine`` (:mod:`gradinv.attacks.eot`).
    """

    layers: tuple[str, ...] = ("*",)
    ignore_layers: tuple[str, ...] = ()
    transform_aware: Literal["off", "configured", "estimated"] = "off"
    eot_samples: int = bounded(
        0, ge=0, doc="EOT: samples of a randomized defense's transform per iteration; 0 = off"
    )
    eot_combine: Combine = "average-gradient"


@dataclass
class GradientMatch:
    """How an attack compares its dummy gradients with the shared update: through the defense's
    deterministic transform (``transform_aware``), through samples of its random transformation
    (EOT), by the attack's own distance. Call it with R stacked gradients (per layer
    (R, *shape)) to get R distances."""

    target: list[Tensor]
    distances: Distances
    transform: Callable[[list[Tensor]], list[Tensor]] | None = None
    samples: Callable[[list[Tensor], torch.Generator], list[Tensor]] | None = None
    combine: Combine = "average-gradient"

    def __call__(self, grads: list[Tensor], generator: torch.Generator) -> Tensor:
        if self.transform is None and self.samples is None:
            return self.distances(grads, self.target)
        out = []
        for r in range(grads[0].shape[0]):  # a defense's transform sees one gradient
            g = [layer[r] for layer in grads]
            if self.transform is not None:
                g = self.transform(g)
            if self.samples is None:
                out.append(self.distances([layer[None] for layer in g], self.target)[0])
            else:
                drawn = self.samples(g, generator)
                out.append(eot_distance(drawn, self.target, self.distances, self.combine))
        return torch.stack(out)

    def one(self, grads: list[Tensor], generator: torch.Generator) -> Tensor:
        """The distance of a single (unstacked) gradient."""
        return self([g[None] for g in grads], generator)[0]


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
    # "honest": an honest-but-curious server, which only observes the update a client shares;
    # "malicious": the server also changes the model it sends (Imprint inserts a block), so the
    # victim's update is captured on the model of :meth:`malicious_model` (the capture stage
    # does this for the attack), and every result records it (``summary["server"]``).
    server: ClassVar[Literal["honest", "malicious"]] = "honest"
    # A malicious attack's settings that shape the model it sends (Imprint's bins): only these
    # reach its capture, so changing another setting (a label) recaptures nothing.
    modification_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, settings: Any, threat: ThreatModel) -> None:
        self.settings = settings
        self.threat = threat
        # Recorded with each result (the threat model as it ran): set by matched_parameters,
        # gradient_match and private_labels; speed by iterations.
        self.matched_names: list[str] = []
        self.transform_note = "off"
        self.eot_note = "off"
        self.label_note = ""
        self.speed: dict[str, float] = {}

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

    def malicious_model(self, model: nn.Module, spec: ModelSpec) -> nn.Module:
        """A malicious server's change to the model ``spec`` describes (``server =
        "malicious"``): the model the server sends instead, with the attack's own weights set
        deterministically from its settings (the rest keeps ``model``'s weights). Called by
        :func:`gradinv.models.build_model` for a spec whose ``modification`` names the attack, so
        the capture, the attack and any later reader rebuild the same architecture."""
        raise NotImplementedError(f"{type(self).__name__} is an honest-but-curious attack")

    @classmethod
    def budget(cls, settings: Any) -> str:
        """What one run of these settings costs, for the tables' notes."""
        return f"{settings.restarts} restart(s) x {settings.iterations} iterations"

    def matched_parameters(
        self, model: nn.Module, image_shape: tuple[int, ...] | None = None
    ) -> list[tuple[str, nn.Parameter]]:
        """The trainable parameters whose gradients the attack matches, in model order.

        ``image_shape`` (C, H, W) is needed to resolve ``@stochastic``."""
        s = self.settings
        stochastic: set[str] = set()
        if STOCHASTIC in (*s.layers, *s.ignore_layers):
            if image_shape is None:
                raise ValueError(f"{STOCHASTIC} needs the image shape to probe the model")
            stochastic = stochastic_parameters(model, image_shape)

        def matches(name: str, patterns: tuple[str, ...]) -> bool:
            return any(
                name in stochastic if pat == STOCHASTIC else fnmatchcase(name, pat)
                for pat in patterns
            )

        named = [
            (n, p)
            for n, p in model.named_parameters()
            if p.requires_grad and matches(n, s.layers) and not matches(n, s.ignore_layers)
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
        the shared update as a gradient of those parameters, on ``device``. It starts a run: what
        the attack records of the last run (notes, speed) is reset."""
        self.transform_note = self.eot_note = "off"
        self.label_note, self.speed = "", {}
        model = self.server_model(server, device)
        named = self.matched_parameters(model, update.meta.image_shape)
        target = target_gradients(
            {k: v.to(device) for k, v in update.tensors.items()},
            [n for n, _ in named],
            update.kind,
            update.meta.local_lr,
            update.meta.local_steps,
        )
        return model, named, target

    def gradient_match(
        self, update: SharedUpdate, names: list[str], target: list[Tensor], distances: Distances
    ) -> GradientMatch:
        """How this attack compares dummy gradients (layers ``names``) with ``target``: by
        ``distances``, through the defense's transform (``transform_aware``) and samples of its
        randomness (``eot_samples``) where the settings ask for them and the defense has them."""
        s, meta = self.settings, update.meta
        match = GradientMatch(target, distances, combine=s.eot_combine)
        self.transform_note = self.eot_note = "off"
        if s.transform_aware == "off" and s.eot_samples == 0:
            return match
        from gradinv.defenses import build_defense

        defense = build_defense(
            meta.defense_kind, meta.defense_settings, where=f"the capture's defense {meta.defense}"
        )
        defense.batch_size = meta.batch_size  # public: DP-SGD's noise scales with it
        if s.transform_aware != "off":
            mode = s.transform_aware
            view = defense.attacker_transform(dict(zip(names, target, strict=True)), mode)
            if view is None:
                self.transform_note = f"{mode}: none, {meta.defense_kind} is not deterministic"
            else:
                self.transform_note = f"{mode}: {meta.defense_kind}"

                def transform(grads: list[Tensor]) -> list[Tensor]:
                    out = view(dict(zip(names, grads, strict=True)))
                    return [out[n] for n in names]

                match.transform = transform
        if s.eot_samples > 0:
            if not defense.randomized:
                self.eot_note = f"none, {meta.defense_kind} is not randomized"
            else:
                self.eot_note = f"{s.eot_samples} samples of {meta.defense_kind}, {s.eot_combine}"

                def samples(grads: list[Tensor], generator: torch.Generator) -> list[Tensor]:
                    drawn = defense.attacker_samples(
                        dict(zip(names, grads, strict=True)), s.eot_samples, generator
                    )
                    return [drawn[n] for n in names]

                match.samples = samples
        return match

    def iterations(self, desc: str, start: int, stop: int) -> Iterator[int]:
        """The attack's loop counter, with a progress bar; when the loop ends, its speed goes to
        the log and to ``self.speed`` (iterations and seconds summed over the loops of this run,
        as run by this process: after a resume, those since the resume)."""
        began = time.perf_counter()
        done = 0
        for it in tqdm(range(start, stop), desc=desc, mininterval=5.0, leave=False):
            yield it
            done += 1
        seconds = time.perf_counter() - began
        total = self.speed.get("iterations", 0) + done
        elapsed = self.speed.get("seconds", 0.0) + seconds
        rate = total / elapsed if elapsed > 0 else 0.0
        self.speed = {"iterations": total, "seconds": round(elapsed, 3), "per_second": rate}
        print(
            f"gradinv: {desc}: {done} iterations in {seconds:.1f} s "
            f"({done / seconds if seconds > 0 else 0.0:.2f} it/s)",
            file=sys.stderr,
            flush=True,
        )

    def private_labels(self, model: nn.Module, update: SharedUpdate) -> Tensor:
        """The victim's labels: given, where the threat model grants them, else inferred from
        the last layer's gradient by ``threat.label_rule`` (a FedAvg delta is a negative step)."""
        meta = update.meta
        if self.threat.labels == "known":
            self.label_note = "known"
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
        rule = self.threat.label_rule
        if rule == "auto":
            rule = "idlg" if meta.batch_size == 1 else "yin"
        self.label_note = f"inferred: {rule}"
        return infer_labels(grad, meta.batch_size, rule)

    def server_model(self, server: ServerMessage, device: torch.device = CPU) -> nn.Module:
        """The attacker's copy of the global model on ``device``, in the victim's mode."""
        model = build_model(server.model)
        model.load_state_dict(server.state)
        model.to(device)
        model.train(self.threat.model_mode == "train")
        for p in model.parameters():
            p.requires_grad_(True)
        return model
