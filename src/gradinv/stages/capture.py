"""Stage: pick a victim's private batch, and capture the update it shares under a defense.

The honest-but-curious server records the model it sent and the defended update it received
(plus public metadata such as the batch size). The private batch is written by a separate step
and read back only by the scoring stage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gradinv.attacks import malicious_server
from gradinv.config import method_settings
from gradinv.cross_checks import victim_start
from gradinv.data import load_prepared
from gradinv.data.prepared import public_pool
from gradinv.defenses import Defense, build_defense, gradient_cosine
from gradinv.fl.client import client_update
from gradinv.io import load_tensors, save_tensors
from gradinv.models import build_model
from gradinv.protocol import PrivateBatch, PublicMeta, ServerMessage, SharedUpdate, normalize
from gradinv.resources import acquire_device, synchronize
from gradinv.settings import ConfigError
from gradinv.stages.common import client_defense, derive_seed, run_path, setup, update_lr


def victim_indices(
    victim: int, batch_size: int, stride: int, labels: Sequence[int], distinct: bool = False
) -> list[int]:
    """Victim v's batch: ``batch_size`` validation images from ``v * stride`` on (wrapped around
    the validation set: :func:`gradinv.cross_checks.victim_start`), consecutive, or
    (``distinct``) the first ones whose labels differ, as CENSOR's Table II ensures ("no
    duplicate labels are present in each batch"), passing over the images victims 0 to v-1
    took: the first image of a label would otherwise join the batch of every victim that
    starts before it (on the patches, 100 images a label, victims 0 and 1 of batch 4 shared 3
    images), and victims that share images are not the independent draws the intervals over
    victims assume. A batch that reaches the end of the validation set goes on from its
    first image, as :func:`victim_start` wraps (on the patches at stride 93, victim 16 starts
    at 1488, in the last label's block). Victim v's batch depends on v, not on how many
    victims a table attacks."""
    n_val = len(labels)
    start = victim_start(victim, stride, n_val)
    if start + batch_size > n_val:
        raise ValueError(
            f"victim {victim} needs validation images {start}..{start + batch_size - 1}"
            f" but the dataset has {n_val}; lower capture.victims or "
            "capture.victim_stride"
        )
    if not distinct:
        return list(range(start, start + batch_size))
    taken: set[int] = set()
    for earlier in range(victim):
        taken.update(
            _distinct_batch(victim_start(earlier, stride, n_val), batch_size, labels, taken)
        )
    chosen = _distinct_batch(start, batch_size, labels, taken)
    if len(chosen) < batch_size:
        earlier = f" (less those of victims 0..{victim - 1})" if victim else ""
        raise ValueError(
            f"victim {victim}: only {len(chosen)} distinct labels among the {n_val} validation "
            f"images{earlier}, but the batch needs "
            f"{batch_size}; lower capture.victims, capture.victim_stride or the batch size, or "
            "set capture.distinct_labels: false"
        )
    return chosen


def _distinct_batch(start: int, size: int, labels: Sequence[int], taken: set[int]) -> list[int]:
    """Up to ``size`` images from ``start`` on (past the last, from the first), none in
    ``taken``, no two of a label."""
    chosen: list[int] = []
    seen: set[int] = set()
    for i in (*range(start, len(labels)), *range(start)):
        if i not in taken and int(labels[i]) not in seen:
            chosen.append(i)
            seen.add(int(labels[i]))
            if len(chosen) == size:
                break
    return chosen


def select_victim(
    dataset: str,
    prepared_dir: Path,
    victim: int,
    batch_size: int,
    stride: int,
    out: Path,
    distinct_labels: bool = False,
) -> None:
    ds = load_prepared(dataset, prepared_dir)
    indices = victim_indices(victim, batch_size, stride, ds.val_labels.tolist(), distinct_labels)
    images, labels = ds.val_batch(indices)
    batch = PrivateBatch(images=images, labels=labels)
    save_tensors(
        out,
        {
            **batch.to_dict(),
            "dataset": dataset,
            "victim": victim,
            "indices": indices,
            "data_sha256": ds.sha256,
            "mean": list(ds.mean),
            "std": list(ds.std),
            "num_classes": ds.num_classes,
        },
    )


def public_inputs(
    settings: dict[str, Any],
    chosen: Any,
    secret: dict[str, Any],
    victim: int,
    prepared_dir: Path | None,
) -> tuple[Tensor, Tensor]:
    """The public pool (CENSOR's directions, DCS²'s start points), normalized as model inputs,
    from the prepared data the victim was drawn from (default ``data/prepared``, where the rules
    write it); refused if it shares an image with the victim's batch."""
    ds = load_prepared(settings["dataset"], prepared_dir or run_path("data/prepared"))
    if ds.sha256 != secret["data_sha256"]:
        raise RuntimeError(
            f"the prepared {settings['dataset']} differs from the one victim {victim} was drawn "
            "from; rerun snakemake to regenerate the victims"
        )
    batch = secret["indices"]  # the validation images in the victim's batch
    where = f"defenses.{settings['defense_name']}"
    pool = public_pool(ds, chosen.public_class, chosen.public_images, exclude=batch, where=where)
    return normalize(pool[0], ds.mean, ds.std), pool[1]


def run(
    settings: dict[str, Any],
    checkpoint: Path,
    victim_paths: list[Path],
    out: Path,
    *,
    first: int = 0,
    prepared_dir: Path | None = None,
) -> None:
    """Capture the updates of victims ``first``, ``first + 1``, ... (one private batch each)
    against the model of ``checkpoint``, one after another, and write them to ``out``:
    ``{"victims": [...], "server": the model the server sent, "runs": [one per victim]}``, where a
    run holds the victim's shared update and its client-side diagnostics, or why there is none.
    One job captures several victims because starting a process that imports torch costs more
    than a capture; a victim's capture does not depend on the grouping (its seed is its own)."""
    setup(settings)
    if not victim_paths:
        raise ValueError("a capture job needs at least one victim")
    victims = list(range(first, first + len(victim_paths)))
    saved = load_tensors(checkpoint)
    if saved.get("status") == "failed":
        # Training never reached this round: nothing was shared, and the table will say why.
        failed = {"status": "failed", "failure": f"training failed: {saved['failure']}"}
        save_tensors(out, {"victims": victims, "server": None, "runs": [failed] * len(victims)})
        return
    server = ServerMessage.from_dict(saved)
    malicious = settings.get("malicious")
    if malicious is not None:  # the server sends a model changed by its attack (Imprint)
        server = malicious_server(server, malicious["kind"], method_settings(malicious))
    runs = [
        capture_one(settings, server, path, victim, prepared_dir)
        for victim, path in zip(victims, victim_paths, strict=True)
    ]
    save_tensors(out, {"victims": victims, "server": server.to_dict(), "runs": runs})


def capture_one(
    settings: dict[str, Any],
    server: ServerMessage,
    victim_path: Path,
    victim: int,
    prepared_dir: Path | None = None,
) -> dict[str, Any]:
    """Victim ``victim``'s capture: ``{"update": ..., "client": ...}``, or a failure."""
    secret = load_tensors(victim_path)
    batch = PrivateBatch.from_dict(secret)
    mean, std = tuple(secret["mean"]), tuple(secret["std"])
    threat = settings["threat_model"]
    defense_cfg = settings["defense"]
    defense = client_defense(
        settings,
        mean,
        std,
        update_lr(settings["fl"]),
        lambda chosen: public_inputs(settings, chosen, secret, victim, prepared_dir),
    )
    shared_size = defense.shared_batch_size(batch.labels)  # DCS² adds concealed samples
    if threat["labels"] == "known" and shared_size != len(batch.labels):
        raise ConfigError(
            f"threat_model.labels: known gives the attacker the labels of the batch behind the "
            f"update, but defense {settings['defense_name']} shares the gradient of "
            f"{shared_size} samples, {shared_size - len(batch.labels)} of them samples it made "
            "(DCS²'s concealed samples, labelled by a mixture): use threat_model.labels: infer"
        )
    fl = settings["fl"]
    seed = derive_seed(
        settings["seed"],
        "capture",
        settings["dataset"],
        settings["defense_name"],
        server.round,
        victim,
    )
    with acquire_device(settings["device"]) as device:
        model = build_model(server.model)  # with the extension an architectural defense made
        model.load_state_dict(server.state)
        model.to(device).train(threat["model_mode"] == "train")
        inputs, labels = batch.normalized(mean, std).to(device), batch.labels.to(device)
        protocol = {k: fl[k] for k in ("protocol", "local_steps", "local_lr")}

        def update_under(chosen: Defense) -> tuple[dict[str, Tensor], float]:
            """The client's update under ``chosen`` and its wall time (Refiner's Table 4)."""
            synchronize(device)
            start = time.perf_counter()
            update, *_ = client_update(
                model,
                inputs,
                labels,
                chosen,
                **protocol,
                generator=torch.Generator().manual_seed(seed),
            )
            synchronize(device)
            return update, time.perf_counter() - start

        # What the defense changed, measured on the client's side: the cosine between the shared
        # update and the update the client would have shared undefended. The undefended update
        # runs first, so the defended one is not timed with the first call's warm-up.
        undefended, _ = update_under(build_defense("none", {}, where="capture"))
        counters = dict(getattr(defense, "stats", {}))
        try:
            update, seconds = update_under(defense)
        except FloatingPointError as err:  # the defense refused a non-finite update
            return {"status": "failed", "failure": f"defended update: {err}"}
        diagnostics = client_diagnostics(defense, update, undefended, defense.rates(counters))
        diagnostics["client_seconds"] = seconds
    meta = PublicMeta(
        dataset=settings["dataset"],
        batch_size=shared_size,
        image_shape=tuple(batch.images.shape[1:]),
        num_classes=int(secret["num_classes"]),
        mean=mean,
        std=std,
        model_mode=threat["model_mode"],
        defense=settings["defense_name"],
        defense_kind=defense_cfg["kind"],
        defense_settings=method_settings(defense_cfg),
        local_steps=fl["local_steps"] if fl["protocol"] == "fedavg" else 1,
        local_lr=fl["local_lr"] if fl["protocol"] == "fedavg" else 0.0,
        labels=tuple(batch.labels.tolist()) if threat["labels"] == "known" else None,
    )
    shared = SharedUpdate(
        tensors={k: v.cpu() for k, v in update.items()},
        kind="gradient" if fl["protocol"] == "fedsgd" else "delta",
        meta=meta,
    )
    print(f"gradinv: victim {victim}: client-side diagnostics: {diagnostics}")
    # What the server sees (the update it received, beside the model it sent) and, apart, what
    # only the client knows: the attack stage reads "server" and "update" alone; the score stage
    # reads "client" to put the defense's diagnostics beside the attack's metrics.
    return {"update": shared.to_dict(), "client": diagnostics}


def client_diagnostics(
    defense: Defense,
    update: dict[str, Tensor],
    undefended: dict[str, Tensor],
    rates: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The cosine of the shared update with the undefended one (None where undefined: a zero or
    non-finite update); CENSOR's fallback, whether the update was the raw gradient, and its
    losses; the samples a defense protects, where it protects some only (DCS²'s sensitive
    samples)."""
    out: dict[str, Any] = {"update_cosine": gradient_cosine(update, undefended)}
    last = defense.last
    out["fallback_fired"] = last.get("fallback_fired")  # None: not a CENSOR update
    # Whether the update was (FedAvg: any local step of it was) the raw gradient; None: not a
    # CENSOR update
    raw = (rates or {}).get("raw_gradient_rate")
    out["raw_gradient_shared"] = None if raw is None else raw > 0
    out["sensitive"] = last.get("sensitive")  # None: every sample is protected
    out["defense"] = {k: v for k, v in last.items() if k != "losses"}
    return out
