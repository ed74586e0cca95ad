"""What every dataset source returns, and the small image helpers they share.

A source turns raw material (bundled photos, a downloaded archive, a folder on disk) into
:class:`RawSplits`: uint8 images and int64 labels for a train and a validation split. Everything
after that (normalisation statistics, hashing, partitioning) is done once, in ``prepared.py``, so
that no two sources can disagree on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

SourceKind = Literal["embedded", "download", "folder"]


class DatasetNotFoundError(FileNotFoundError):
    """A folder-backed dataset is missing or incomplete; the message says what to put where."""


class DownloadError(RuntimeError):
    """A download failed or its checksum did not match; the message names the URL and the fix."""


@dataclass(frozen=True)
class RawSplits:
    """A dataset as loaded from its source, before statistics and hashing.

    ``train_boxes``/``val_boxes`` are optional provenance: for sources cut from larger images
    (``patches``) row ``i`` is ``(photo index, top, left, height, width)`` of sample ``i`` in the
    resized source photo, so disjointness of the splits can be checked rather than trusted.
    """

    train_images: Tensor
    train_labels: Tensor
    val_images: Tensor
    val_labels: Tensor
    classes: tuple[str, ...]
    source: str
    train_boxes: Tensor | None = None
    val_boxes: Tensor | None = None

    def __post_init__(self) -> None:
        shapes = set()
        for split in ("train", "val"):
            images = getattr(self, f"{split}_images")
            labels = getattr(self, f"{split}_labels")
            if images.dtype != torch.uint8 or images.ndim != 4:
                raise ValueError(
                    f"{split}_images must be uint8 (N, C, H, W); got {images.dtype} "
                    f"{tuple(images.shape)}"
                )
            if labels.dtype != torch.int64 or labels.shape != (images.shape[0],):
                raise ValueError(
                    f"{split}_labels must be int64 ({images.shape[0]},); got "
                    f"{labels.dtype} {tuple(labels.shape)}"
                )
            if labels.numel() == 0:
                raise ValueError(f"the {split} split is empty; check the dataset's settings")
            if labels.min() < 0 or labels.max() >= len(self.classes):
                raise ValueError(f"{split}_labels fall outside 0..{len(self.classes) - 1}")
            shapes.add(tuple(images.shape[1:]))
        if len(shapes) != 1:
            raise ValueError(f"train and val images differ in shape: {sorted(shapes)}")


class DatasetSource:
    """Base class of a registered dataset.

    Subclasses define a frozen ``Settings`` dataclass, ``paper_name`` (how the papers call the
    data), ``kind`` and a classmethod ``load``. ``load`` must be deterministic in ``seed``.
    """

    Settings: ClassVar[type]
    paper_name: ClassVar[str]
    kind: ClassVar[SourceKind]
    downloads: ClassVar[bool]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Derived, so the two can never disagree: only download-backed sources touch the network.
        cls.downloads = cls.kind == "download"

    @classmethod
    def load(cls, settings: Any, root: Path, seed: int) -> RawSplits:
        """Return the splits; ``root`` is where downloads go (``data/raw/<name>``)."""
        raise NotImplementedError

    @classmethod
    def check_settings(cls, settings: Any) -> None:
        """Refuse settings that cannot yield the dataset, where that is known without the data
        (raise ConfigError naming the key and the fix); by default nothing is known."""

    @classmethod
    def train_labels(cls, settings: Any) -> np.ndarray | None:
        """The train split's labels, in order, when known without the data (else None): the
        configuration check partitions them to find clients with fewer images than a batch."""
        return None

    @classmethod
    def val_size(cls, settings: Any) -> int | None:
        """The validation images the settings yield, when known without the data (else None);
        the config check uses it to reject victims beyond the end of the validation split."""
        return None


def resize_images(images: Tensor, size: int, chunk: int = 2048) -> Tensor:
    """Bilinear resize of uint8 (N, C, H, W) images to ``size``×``size``, antialiased.

    Done in chunks: a float copy of all of CIFAR-10 at 64 px would need about 3 GB at once.
    """
    if images.shape[-2:] == (size, size):
        return images
    out = torch.empty((images.shape[0], images.shape[1], size, size), dtype=torch.uint8)
    for start in range(0, images.shape[0], chunk):
        part = F.interpolate(
            images[start : start + chunk].float(),
            size=(size, size),
            mode="bilinear",
            align_corners=False,
            antialias=True,
        )
        out[start : start + chunk] = part.round().clamp(0, 255).to(torch.uint8)
    return out


def split_per_class(
    labels: np.ndarray, val_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified split; both index arrays come back sorted, keeping the source order.

    Each class gives ``floor(n_c * val_fraction)`` samples to validation and the leftover
    fractions go to the classes with the largest remainders, so the validation split has
    ``round(N * val_fraction)`` samples even when every class is tiny.
    """
    groups = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    exact = np.array([len(g) for g in groups]) * val_fraction
    n_val = np.floor(exact).astype(int)
    extra = round(float(exact.sum())) - int(n_val.sum())
    n_val[np.argsort(-(exact - n_val), kind="stable")[:extra]] += 1
    val = [g[:n] for g, n in zip(groups, n_val, strict=True)]
    train = [g[n:] for g, n in zip(groups, n_val, strict=True)]
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def subsample(n: int, limit: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted seeded choice of ``limit`` of ``n`` indices; ``limit`` 0 keeps all of them."""
    if limit <= 0 or limit >= n:
        return np.arange(n)
    return np.sort(rng.choice(n, size=limit, replace=False))


def as_labels(values: Sequence[int] | np.ndarray) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64))
