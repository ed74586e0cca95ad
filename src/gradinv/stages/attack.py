"""Stage: run one attack on captured updates, victim by victim. The private batch is never read
here."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from gradinv.attacks import AttackFailed, ThreatModel, build_attack
from gradinv.config import method_settings
from gradinv.io import load_tensors, save_tensors, sha256_file, sha256_json
from gradinv.progress import Progress
from gradinv.protocol import ServerMessage, SharedUpdate
from gradinv.resources import acquire_device
from gradinv.settings import ConfigError
from gradinv.stages.common import derive_seed, job_identity, setup


def run(
    settings: dict[str, Any],
    capture: Path,
    out: Path,
    *,
    generator_file: Path | None = None,
) -> None:
    """Attack the victims of a capture job's file (:mod:`gradinv.stages.capture`) one after
    another and write their results to ``out``: ``{"victims": [...], "runs": [one each]}``.

    One job attacks several victims because starting a process that imports torch costs more
    than many attacks at the default scale. Victim v's seed comes from the file it would have on
    its own (``victim<v>.pt`` beside ``out``), so its result does not depend on the grouping; a
    victim finished before an interruption is kept under ``results/.progress/`` and not
    attacked again."""
    setup(settings)
    captured = load_tensors(capture)
    victims = captured["victims"]
    generator = _load_generator(settings, generator_file)
    inputs = [sha256_file(capture)] + ([sha256_file(generator_file)] if generator_file else [])
    group = Progress.for_output(out, sha256_json([settings, *inputs]))
    runs = []
    for victim, run_ in zip(victims, captured["runs"], strict=True):
        result = group.load(f"victim{victim}")
        if result is None:
            own = out.parent / f"victim{victim}.pt"  # the victim's identity: seed and progress
            data = run_ if run_.get("status") == "failed" else run_ | {"server": captured["server"]}
            result = attack_one(settings, data, own, inputs, generator)
            group.save(result, f"victim{victim}")
        else:
            group.resumed(f"victim {victim} finished before")
        runs.append(result)
    save_tensors(out, {"victims": victims, "runs": runs})
    group.finish()


def _load_generator(settings: dict[str, Any], generator_file: Path | None) -> Any:
    """The generator a generative-prior attack searches, loaded once for the job (None: the
    attack needs none)."""
    if not getattr(_build(settings), "generative", False):
        return None
    from gradinv.generators.files import load_generator

    name, block = settings["generator_name"], settings["generator"]
    if generator_file is None:
        raise ConfigError(
            f"attack {settings['attack_name']} searches generator {name!r}'s latent space: "
            f"pass its weights with --generator (Snakemake's rule does: data/generators/)."
        )
    return load_generator(name, block, generator_file)


def _build(settings: dict[str, Any]) -> Any:
    cfg = settings["attack"]
    return build_attack(
        cfg["kind"],
        method_settings(cfg),
        ThreatModel(**settings["threat_model"]),
        where=f"attacks.{settings['attack_name']}",
    )


def attack_one(
    settings: dict[str, Any],
    data: dict[str, Any],
    own: Path,
    inputs: list[str],
    generator: Any = None,
) -> dict[str, Any]:
    """One victim's result: the reconstruction and what the attack knew, or why it failed.
    ``data``: its capture (the server's message and the update); ``own``: the victim's identity
    (its seed and its progress folder); ``inputs``: the digests of the job's input files."""
    if data.get("status") == "failed":  # no update was shared (training failed upstream)
        return {"status": "failed", "failure": data["failure"], "seconds": 0.0}
    server = ServerMessage.from_dict(data["server"])
    update = SharedUpdate.from_dict(data["update"])
    progress = Progress.for_output(own, sha256_json([settings, *inputs]))
    attack = _build(settings)
    if generator is not None:  # a copy: what one victim's search changes, the next never sees
        label_map = settings["generator"].get("label_map", {})
        attack.use_generator(copy.deepcopy(generator), label_map.get(settings["dataset"]))
    seed = derive_seed(settings["seed"], "attack", job_identity(own))  # however out is spelled
    rng = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    result: dict[str, Any] = {"status": "ok", "failure": None}
    try:
        with acquire_device(settings["device"]) as device:
            rec = attack.reconstruct(server, update, rng, device=device, progress=progress)
        if not torch.isfinite(rec.images).all():
            raise AttackFailed("the reconstruction contains non-finite pixels")
        result |= {
            "images": rec.images.detach().float(),
            "labels": rec.labels,
            "history": {k: [list(p) for p in v] for k, v in rec.history.items()},
            # The threat model as it ran: the server (a malicious one says what it changed),
            # where the labels came from, which layers' gradients the attack matched, through
            # which view of the defense; and how fast it ran.
            "summary": {"server": "honest-but-curious"}
            | rec.summary
            | {
                "labels_from": attack.label_note,
                "matched_layers": attack.matched_names,
                "transform_aware": attack.transform_note,
                "eot": attack.eot_note,
                "iterations": attack.speed.get("iterations"),
                "iterations_per_second": attack.speed.get("per_second"),
            },
        }
    except AttackFailed as err:
        # A failed attack is a result, not a crash: it is counted in the table, never averaged.
        result |= {"status": "failed", "failure": str(err)}
    result["seconds"] = round(time.perf_counter() - started, 2)
    progress.finish()
    return result
