"""Stage: run one attack on one captured update. The private batch is never read here."""

from __future__ import annotations

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
    generator_file: Path | None = None,
) -> None:
    setup(settings)
    data = load_tensors(capture)
    if data.get("status") == "failed":  # no update was shared (training failed upstream)
        save_tensors(out, {"status": "failed", "failure": data["failure"], "seconds": 0.0})
        return
    server = ServerMessage.from_dict(data["server"])
    update = SharedUpdate.from_dict(data["update"])
    inputs = [sha256_file(capture)] + ([sha256_file(generator_file)] if generator_file else [])
    progress = Progress.for_output(out, sha256_json([settings, *inputs]))
    cfg = settings["attack"]
    attack = build_attack(
        cfg["kind"],
        method_settings(cfg),
        ThreatModel(**settings["threat_model"]),
        where=f"attacks.{settings['attack_name']}",
    )
    if getattr(attack, "generative", False):
        from gradinv.generators.files import load_generator

        name, block = settings["generator_name"], settings["generator"]
        if generator_file is None:
            raise ConfigError(
                f"attack {settings['attack_name']} searches generator {name!r}'s latent space: "
                f"pass its weights with --generator (Snakemake's rule does: data/generators/)."
            )
        attack.use_generator(
            load_generator(name, block, generator_file),
            block.get("label_map", {}).get(settings["dataset"]),
        )
    seed = derive_seed(settings["seed"], "attack", job_identity(out))  # however out is spelled
    generator = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    result: dict[str, Any] = {"status": "ok", "failure": None}
    try:
        with acquire_device(settings["device"]) as device:
            rec = attack.reconstruct(server, update, generator, device=device, progress=progress)
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
    save_tensors(out, result)
    progress.finish()
