"""Small helpers the stages share: seeds, threads, provenance records."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from gradinv.config import REPO_ROOT, project_root
from gradinv.io import sha256_json
from gradinv.protocol import ModelSpec


def setup(settings: dict[str, Any]) -> None:
    """Torch uses the job's threads (Snakemake sets OMP_NUM_THREADS from the rule's ``threads``)."""
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    torch.use_deterministic_algorithms(True, warn_only=True)


def derive_seed(seed: int, *parts: object) -> int:
    """A seed for one job from the global seed and the job's identity (stable across runs)."""
    text = json.dumps([seed, *map(str, parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def update_lr(fl: dict[str, Any]) -> float:
    """The learning rate of the step a client's update drives (FedSGD: the server's)."""
    return fl["lr"] if fl["protocol"] == "fedsgd" else fl["local_lr"]


def model_spec(model: dict[str, Any], num_classes: int, image_shape: tuple[int, ...]) -> ModelSpec:
    settings = {k: v for k, v in model.items() if k not in ("kind", "label")}
    return ModelSpec(
        name=model["kind"],
        num_classes=num_classes,
        in_channels=image_shape[0],
        image_size=image_shape[1],
        settings=settings,
    )


def record(settings: dict[str, Any], data_sha256: str) -> dict[str, Any]:
    """What produced a result: git commit, config hash, data hash, seed."""
    from gradinv.tracking import provenance

    prov = provenance(REPO_ROOT)  # the code that ran, wherever it ran
    return {
        "git_commit": prov.get("git_commit", "unknown"),
        "git_dirty": prov.get("git_dirty"),
        "config_hash": sha256_json(settings),
        "data_sha256": data_sha256,
        "seed": settings["seed"],
        "scale": settings["scale"],
    }


def project_path(path: str | Path) -> Path:
    path = Path(path)
    return path if path.is_absolute() else project_root() / path
