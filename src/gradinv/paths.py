"""Where the pipeline keeps the files its jobs share, as the rules name them. Torch-free, so
that building the workflow's job graph imports no method (:mod:`gradinv.methods`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradinv.methods import fact

GENERATORS = Path("data") / "generators"
EVALUATION_NETWORKS = Path("data") / "evalnet"


def generator_path(name: str, block: dict[str, Any], dataset: str) -> str:
    """Where the generator ``name`` that serves ``dataset`` lives: one file per dataset for a
    generator trained here, one weights file for a fetched one (:mod:`gradinv.generators.files`)."""
    if fact("generators", block["kind"], "trainable"):
        return str(GENERATORS / name / f"{dataset}.pt")
    return str(GENERATORS / name / "weights.pt")


def evaluation_network_path(dataset: str) -> str:
    """Where the pipeline writes the evaluation network of ``dataset`` (rule ``train_evalnet``)."""
    return str(EVALUATION_NETWORKS / f"{dataset}.pt")
