"""Prepared datasets: one verified tensor file per dataset, written once, read by every stage.

Why: loading raw data (decoding JPEGs, cutting patches, resizing) is slow and must give every
later stage the very same tensors. ``prepare_dataset`` writes ``<out_dir>/<name>.pt`` atomically
and a manifest ``<name>.json`` with its sha256; ``load_prepared`` refuses a file whose hash
differs (truncated, edited, or left over from other settings) and says how to regenerate it.
The per-channel mean and std are computed on the train split only, so validation images (the
attacked ones) never leak into the normalisation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gradinv.data import DATASETS
from gradinv.data.base import RawSplits
from gradinv.io import (
    CorruptFileError,
    load_tensors,
    read_json,
    save_tensors,
    snakemake_command,
    write_json,
)
from gradinv.settings import from_mapping

TENSOR_KEYS = ("train_images", "train_labels", "val_images", "val_labels")


def remedy(name: str) -> str:
    """The command that regenerates dataset ``name``, under the pipeline's own options."""
    return f"{snakemake_command(f'data/prepared/{name}.pt')} --forcerun prepare_data"


def dataset_settings(name: str, values: dict[str, Any] | None) -> Any:
    """The frozen settings of dataset ``name`` from params.yaml's ``data.sources.<name>``."""
    return from_mapping(DATASETS.get(name).Settings, values, where=f"data.sources.{name}")


def channel_stats(images: Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and (population) std of uint8 images, in [0, 1] units."""
    if images.shape[0] == 0:
        raise ValueError("cannot compute normalisation statistics of an empty train split")
    x = images.transpose(0, 1).reshape(images.shape[1], -1).to(torch.float64) / 255.0
    return x.mean(dim=1).tolist(), x.std(dim=1, unbiased=False).tolist()


def prepare_dataset(
    name: str, settings: dict[str, Any] | None, raw_root: Path, out_dir: Path, seed: int
) -> Path:
    """Load dataset ``name`` and write ``out_dir/{name}.pt`` plus its manifest; return the path.

    ``raw_root/name`` is where download-backed datasets keep their archives.
    """
    cls = DATASETS.get(name)
    s = dataset_settings(name, settings)
    raw: RawSplits = cls.load(s, Path(raw_root) / name, seed)
    mean, std = channel_stats(raw.train_images)
    payload = {key: getattr(raw, key).contiguous() for key in TENSOR_KEYS}
    payload |= {"classes": list(raw.classes), "mean": mean, "std": std}
    out_dir = Path(out_dir)
    path = out_dir / f"{name}.pt"
    digest = save_tensors(path, payload)
    write_json(
        out_dir / f"{name}.json",
        {
            "dataset": name,
            "paper_name": cls.paper_name,
            "sha256": digest,
            "file": path.name,
            "num_train": int(raw.train_labels.numel()),
            "num_val": int(raw.val_labels.numel()),
            "image_shape": list(raw.train_images.shape[1:]),
            "classes": list(raw.classes),
            "mean": mean,
            "std": std,
            "source": raw.source,
            "settings": dataclasses.asdict(s),
            "seed": seed,
        },
    )
    return path


@dataclass(frozen=True)
class PreparedDataset:
    """A verified prepared dataset: uint8 images, int64 labels and their provenance."""

    name: str
    paper_name: str
    train_images: Tensor
    train_labels: Tensor
    val_images: Tensor
    val_labels: Tensor
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    sha256: str

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        c, h, w = self.train_images.shape[1:]
        return int(c), int(h), int(w)

    def val_batch(self, indices: Sequence[int] | Tensor) -> tuple[Tensor, Tensor]:
        """Validation images ``indices`` as float in [0, 1] (N, C, H, W), and their labels."""
        return _select(self.val_images, self.val_labels, indices, "validation")

    def train_subset(self, indices: Sequence[int] | Tensor) -> tuple[Tensor, Tensor]:
        """Train images ``indices`` as float in [0, 1] (N, C, H, W), and their labels."""
        return _select(self.train_images, self.train_labels, indices, "train")


def _select(
    images: Tensor, labels: Tensor, indices: Sequence[int] | Tensor, split: str
) -> tuple[Tensor, Tensor]:
    idx = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
    n = labels.shape[0]
    if idx.numel() and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"{split} indices must lie in 0..{n - 1}; got {idx.min()}..{idx.max()}.")
    return images[idx].to(torch.float32) / 255.0, labels[idx].clone()


def public_pool_indices(
    prepared: PreparedDataset,
    cls: int,
    n: int,
    where: str = "defenses.<name>",
    exclude: Sequence[int] = (),
) -> list[int]:
    """Validation indices of the last ``n`` images of class ``cls`` outside ``exclude``, in
    validation order.

    Class membership follows the labels, not the position: a source sorted by class (patches,
    imagenet) keeps each class in one block, the others (digits, ffhq, cifar, mnist, svhn)
    interleave the classes, so only the prepared file knows which indices a class has. ``where``
    names the settings block that asks (``defenses.<name>``) in the error messages.
    """
    if not 0 <= cls < prepared.num_classes:
        raise ValueError(
            f"{prepared.name} has no class {cls}: its classes are 0..{prepared.num_classes - 1} "
            f"({prepared.classes[0]} .. {prepared.classes[-1]}); set {where}.public_class to "
            "one of them"
        )
    skip = {int(i) for i in exclude}
    members = [int(i) for i in torch.nonzero(prepared.val_labels == cls).reshape(-1)]
    members = [i for i in members if i not in skip]
    if len(members) < n:
        outside = f" outside the attacked batch {sorted(skip)}" if skip else ""
        raise ValueError(
            f"class {cls} ({prepared.classes[cls]}) of {prepared.name} has {len(members)} "
            f"validation image(s){outside}, but {where} asks for {n}; lower "
            f"{where}.public_images or choose another {where}.public_class"
        )
    return members[len(members) - n :]


def public_pool(
    prepared: PreparedDataset,
    cls: int,
    n: int,
    exclude: Sequence[int] = (),
    where: str = "defenses.<name>",
) -> tuple[Tensor, Tensor]:
    """The public pool of CENSOR's ``source: public`` and DCS²'s ``start: public``: the last
    ``n`` validation images of class ``cls`` as float in [0, 1] (N, C, H, W), and their labels.

    Last, because victims are mostly taken from elsewhere in the validation split; the images of
    ``exclude`` (the validation indices of an attacked batch) are skipped, and the pool reaches
    back past them, else the defense would draw its directions or start points from the very
    images it protects. So a victim whose batch meets the class's last images gets a pool of its
    own; every other victim gets the same one.
    """
    return prepared.val_batch(public_pool_indices(prepared, cls, n, where, exclude))


def load_prepared(name: str, out_dir: Path) -> PreparedDataset:
    """Read ``out_dir/{name}.pt`` after checking its sha256 against the manifest."""
    out_dir = Path(out_dir)
    manifest_path = out_dir / f"{name}.json"
    if not manifest_path.exists():
        raise FileNotFoundError(
            f"{manifest_path} does not exist, so {out_dir / name}.pt cannot "
            f"be verified. Regenerate it with: {remedy(name)}"
        )
    try:
        manifest = read_json(manifest_path, remedy=remedy(name))
        digest, paper_name = manifest["sha256"], manifest["paper_name"]
    except (ValueError, KeyError, TypeError) as err:  # JSONDecodeError is a ValueError
        raise CorruptFileError(
            f"{manifest_path} is not a valid manifest ({err!r}). Regenerate it with: {remedy(name)}"
        ) from err
    path = out_dir / f"{name}.pt"
    data = load_tensors(path, expected_sha256=digest, remedy=remedy(name))
    missing = [k for k in (*TENSOR_KEYS, "classes", "mean", "std") if k not in data]
    if missing:
        raise CorruptFileError(
            f"{path} lacks {', '.join(missing)}. Regenerate it with: {remedy(name)}"
        )
    return PreparedDataset(
        name=name,
        paper_name=paper_name,
        train_images=data["train_images"],
        train_labels=data["train_labels"],
        val_images=data["val_images"],
        val_labels=data["val_labels"],
        classes=tuple(data["classes"]),
        mean=tuple(float(m) for m in data["mean"]),
        std=tuple(float(s) for s in data["std"]),
        sha256=digest,
    )
