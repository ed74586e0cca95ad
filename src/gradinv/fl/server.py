"""Server-side aggregation and the federated training loop.

Each round the server samples ``clients_per_round`` clients, each client draws a batch from its own
partition and returns its defended update (where ``fl.defended_clients`` names some clients only,
as DCS²'s code does, the others their undefended one), and the server averages them: FedSGD steps
the global model by ``-lr * mean gradient``; FedAvg adds the mean delta. Batch-norm running
statistics are averaged like any FedAvg state; they never reach an attacker's capture (the
capture records the server's model, not the victim's statistics).

Round 0 is the seeded initial model; the checkpoint of round r is the model after r rounds.
Given a :class:`~gradinv.progress.Progress`, the loop saves its whole state (model, random
generators, history) at the progress interval and resumes from it, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from gradinv.defenses import Defense
from gradinv.defenses.none import NoDefense
from gradinv.fl.client import client_update
from gradinv.models import buffers_kept
from gradinv.progress import Progress
from gradinv.settings import ConfigError


class TrainingDiverged(RuntimeError):
    """A non-finite loss or update: the run is recorded as failed, with its history so far."""

    def __init__(self, message: str, history: list[dict[str, float]] | None = None) -> None:
        super().__init__(message)
        self.history = list(history or [])


@dataclass(frozen=True)
class FLSettings:
    protocol: str
    rounds: int
    clients_per_round: int
    batch_size: int
    lr: float
    local_steps: int
    local_lr: float
    eval_every: int
    checkpoint_rounds: tuple[int, ...]
    eval_samples: int
    # How a FedAvg client trains (gradinv.fl.client): its optimizer and momentum, whole passes
    # over its shard (0: local_steps steps on one batch), and local_lr's decay per round.
    client_optimizer: str = "sgd"
    momentum: float = 0.0
    local_epochs: int = 0
    lr_decay: float = 1.0
    # The clients that apply the defense (their indices in the partition); the others share
    # undefended updates. None: every client (params.yaml `all`). DCS²'s code defends one client
    # of ten (its fl/main.py: only DevNum == Pro_dev runs the defense).
    defended_clients: tuple[int, ...] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FLSettings:
        clients = d.get("defended_clients", "all")
        return cls(
            **{
                **d,
                "checkpoint_rounds": tuple(sorted(set(d["checkpoint_rounds"]))),
                "defended_clients": None if clients == "all" else tuple(sorted(set(clients))),
            }
        )


def evaluate(
    model: nn.Module, images: Tensor, labels: Tensor, batch: int = 256
) -> dict[str, float]:
    """Test loss and accuracy with the model in eval mode."""
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(images), batch):
            out = model(images[i : i + batch])
            loss += F.cross_entropy(out, labels[i : i + batch], reduction="sum").item()
            correct += (out.argmax(1) == labels[i : i + batch]).sum().item()
    return {"test_loss": loss / len(images), "test_accuracy": correct / len(images)}


def train(
    model: nn.Module,
    train_x: Tensor,
    train_y: Tensor,
    parts: list[list[int]],
    test_x: Tensor,
    test_y: Tensor,
    defense: Defense,
    fl: FLSettings,
    seed: int,
    on_checkpoint: Callable[[int, nn.Module], None],
    progress: Progress | None = None,
) -> list[dict[str, float]]:
    """Run ``fl.rounds`` rounds; call ``on_checkpoint`` at each checkpoint round.

    ``train_x`` and ``test_x`` are already normalised. Returns the per-round history. A client
    with fewer images than a batch is refused before the first round: its steps would quietly
    take smaller batches (the configuration check finds this before any job where the dataset's
    labels are known without its data, :func:`gradinv.cross_checks.check_datasets`).
    """
    short = [c for c, part in enumerate(parts) if len(part) < fl.batch_size]
    if short:
        raise ConfigError(
            f"partition: client {short[0]} holds {len(parts[short[0]])} training images "
            f"({len(short)} of {len(parts)} clients hold fewer than the batch size "
            f"{fl.batch_size}): its steps would take smaller batches than the setting says; "
            "lower partition.num_clients or the batch size, or raise partition.alpha."
        )
    undefended = _undefended(defense, fl, len(parts))
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    history: list[dict[str, float]] = []
    first = 1
    optimizer_states: dict[int, Any] = {}  # each client's optimizer, kept between its rounds
    saved = progress.load() if progress else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        rng.bit_generator.state = saved["numpy_rng"]
        generator.set_state(saved["torch_rng"])
        if "defense" in saved:  # progress saved before defenses kept state has none
            defense.load_state_dict(saved["defense"])
        optimizer_states = saved.get("client_optimizers", {})
        history, first = saved["history"], saved["round"] + 1
        progress.resumed(f"after round {saved['round']} of {fl.rounds}")
        for rnd in fl.checkpoint_rounds:  # declared outputs were deleted: write them again
            if rnd < first:
                on_checkpoint(rnd, _with_state(model, progress.load(f"round{rnd}")["model"]))
    else:
        _checkpoint(0, model, fl, on_checkpoint, progress)
        history.append({"round": 0, **evaluate(model, test_x, test_y)})
    for rnd in tqdm(range(first, fl.rounds + 1), desc="FL rounds", mininterval=5.0):
        clients = rng.choice(len(parts), size=min(fl.clients_per_round, len(parts)), replace=False)
        updates, locals_ = [], []
        train_loss = 0.0
        counters = dict(getattr(defense, "stats", {}))  # the round's rates come from these
        model.train()
        local_lr = fl.local_lr * fl.lr_decay**rnd
        for c in clients:
            idx = rng.choice(parts[c], size=min(fl.batch_size, len(parts[c])), replace=False)
            x, y = train_x[idx], train_y[idx]
            batches = None
            if fl.protocol == "fedavg" and fl.local_epochs:  # passes over the client's shard
                batches = [
                    (train_x[b], train_y[b])
                    for _ in range(fl.local_epochs)
                    for b in _batches(rng.permutation(parts[c]), fl.batch_size)
                ]
            with torch.no_grad(), buffers_kept(model):  # the server's look is no training step
                train_loss += F.cross_entropy(model(x), y).item() / len(clients)
            try:
                update, local, state = client_update(
                    model,
                    x,
                    y,
                    undefended.get(int(c), defense),
                    protocol=fl.protocol,
                    local_steps=fl.local_steps,
                    local_lr=local_lr,
                    generator=generator,
                    client_optimizer=fl.client_optimizer,
                    momentum=fl.momentum,
                    batches=batches,
                    optimizer_state=optimizer_states.get(int(c)),
                )
            except FloatingPointError as err:  # a defense refused a non-finite update
                raise TrainingDiverged(f"{err} at round {rnd}", history) from None
            if state is not None:
                optimizer_states[int(c)] = state
            updates.append(update)
            locals_.append(local)
        if not np.isfinite(train_loss):
            raise TrainingDiverged(f"non-finite training loss at round {rnd}", history)
        try:
            _aggregate(model, updates, locals_, fl)
        except TrainingDiverged as err:
            raise TrainingDiverged(f"{err} at round {rnd}", history) from None
        row: dict[str, float] = {"round": rnd, "train_loss": train_loss}
        row |= defense.rates(counters)  # CENSOR: how many of the round's updates were raw
        if rnd % fl.eval_every == 0 or rnd == fl.rounds or rnd in fl.checkpoint_rounds:
            row |= evaluate(model, test_x, test_y)
        history.append(row)
        _checkpoint(rnd, model, fl, on_checkpoint, progress)
        if progress and (progress.due() or rnd == fl.rounds):
            progress.save(
                {
                    "round": rnd,
                    "model": _state(model),
                    "numpy_rng": rng.bit_generator.state,
                    "torch_rng": generator.get_state(),
                    "defense": defense.state_dict(),  # the clients' own state (Refiner's)
                    "client_optimizers": optimizer_states,
                    "history": history,
                }
            )
    return history


def _undefended(defense: Defense, fl: FLSettings, clients: int) -> dict[int, Defense]:
    """The clients that share undefended updates (``fl.defended_clients``), each with no
    defense; none when every client defends."""
    if fl.defended_clients is None:
        return {}
    beyond = [c for c in fl.defended_clients if not 0 <= c < clients]
    if beyond:
        raise ConfigError(
            f"fl.defended_clients: client {beyond[0]} is not one of the partition's {clients} "
            f"clients (0 to {clients - 1}); name clients of the partition, or all"
        )
    if defense.architectural:
        raise ConfigError(
            f"fl.defended_clients: {type(defense).__name__} changes the model every client "
            "trains, so it cannot be left to some clients; train it with defended_clients: all"
        )
    none = NoDefense(NoDefense.Settings())
    return {c: none for c in range(clients) if c not in fl.defended_clients}


def _batches(order: np.ndarray, size: int) -> list[np.ndarray]:
    """One pass over a client's shard in ``order``: batches of ``size``, the last one shorter
    (a data loader's, as CVB's and DCS²'s code use)."""
    return [order[i : i + size] for i in range(0, len(order), size)]


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _with_state(model: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    copy = deepcopy(model)
    copy.load_state_dict(state)
    return copy


def _checkpoint(
    rnd: int,
    model: nn.Module,
    fl: FLSettings,
    on_checkpoint: Callable[[int, nn.Module], None],
    progress: Progress | None,
) -> None:
    if rnd not in fl.checkpoint_rounds:
        return
    on_checkpoint(rnd, model)
    if progress:  # kept so that a resumed run can write this checkpoint again
        progress.save({"model": _state(model)}, name=f"round{rnd}")


def _aggregate(
    model: nn.Module, updates: list[dict[str, Tensor]], locals_: list[nn.Module], fl: FLSettings
) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in updates[0]:
                continue
            mean = torch.stack([u[name] for u in updates]).mean(0)
            if not torch.isfinite(mean).all():
                raise TrainingDiverged(f"non-finite aggregated update for {name}")
            p += -fl.lr * mean if fl.protocol == "fedsgd" else mean
        local_buffers = [dict(m.named_buffers()) for m in locals_]
        for name, b in model.named_buffers():
            stacked = torch.stack([lb[name] for lb in local_buffers])
            b.copy_(
                stacked.float().mean(0).to(b.dtype)
                if b.is_floating_point()
                else stacked.max(0).values
            )
