"""ImageNet (ILSVRC2012, Russakovsky et al. 2015, IJCV 115:211) validation images from a folder.

Why: CENSOR (NDSS 2025) and the GIFD harness it reuses attack 64×64 ImageNet validation images
with a ResNet-18; the images cannot be downloaded by script (licence), so the user provides them
in the ``torchvision.datasets.ImageFolder`` layout, one sub-folder per class. The class index is
the sorted folder order, as in ImageFolder, so image ``i`` of the validation split is image ``i``
of the papers' ImageFolder when ``train_root`` is given and ``max_per_class`` is 0.

Without ``train_root`` a seeded, per-class ``1 - val_fraction`` share of the validation folder
becomes the train split; the rest stays the validation split, in ImageFolder order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gradinv.data import DATASETS
from gradinv.data.base import (
    DatasetNotFoundError,
    DatasetSource,
    RawSplits,
    as_labels,
    split_per_class,
)
from gradinv.data.folders import list_images, read_images
from gradinv.settings import bounded


@DATASETS.register("imagenet")
class ImageNet(DatasetSource):
    paper_name = "ImageNet"
    kind = "folder"

    @dataclass(frozen=True)
    class Settings:
        root: str = "data/raw/imagenet/val"  # ILSVRC2012 validation images, one folder per class
        train_root: str = ""  # optional train images in the same layout; empty: split ``root``
        image_size: int = bounded(64, ge=8, doc="shorter side resized to this, then centre crop")
        val_fraction: float = bounded(
            0.2, gt=0.0, lt=1.0, doc="without train_root: share of each class kept for validation"
        )
        max_per_class: int = bounded(
            0, ge=0, doc="first N images (sorted) of each class folder; 0 keeps all"
        )

    @classmethod
    def load(cls, settings: Settings, root: Path, seed: int) -> RawSplits:
        s = settings
        val_classes, val_files, val_labels = scan(Path(s.root), "root", s.max_per_class)
        if s.train_root:
            train_classes, train_files, train_labels = scan(
                Path(s.train_root), "train_root", s.max_per_class
            )
            if train_classes != val_classes:
                missing = sorted(set(val_classes) ^ set(train_classes))[:5]
                raise DatasetNotFoundError(
                    f"data.sources.imagenet.train_root ({s.train_root}) and "
                    f"data.sources.imagenet.root ({s.root}) must hold the same class folders; "
                    f"they differ in {', '.join(missing)}..."
                )
            how = f"train images from {s.train_root}"
        else:
            labels = np.asarray(val_labels)
            train_idx, val_idx = split_per_class(
                labels, s.val_fraction, np.random.default_rng(seed)
            )
            train_files = [val_files[i] for i in train_idx]
            train_labels = labels[train_idx].tolist()
            val_files = [val_files[i] for i in val_idx]
            val_labels = labels[val_idx].tolist()
            how = f"seeded split, {s.val_fraction:g} of each class kept for validation"
        return RawSplits(
            train_images=read_images(train_files, s.image_size),
            train_labels=as_labels(train_labels),
            val_images=read_images(val_files, s.image_size),
            val_labels=as_labels(val_labels),
            classes=tuple(val_classes),
            source=(
                f"ImageNet (ILSVRC2012) validation images from {s.root} ({how}), "
                f"{len(val_classes)} classes, resized+centre-cropped to {s.image_size}px"
            ),
        )


def scan(folder: Path, key: str, limit: int) -> tuple[list[str], list[Path], list[int]]:
    """Class names, image files and labels of an ImageFolder-style ``folder``."""
    split = "validation" if key == "root" else "train"
    fix = (
        f"Put the ILSVRC2012 {split} images there, one sub-folder per class (wnid), e.g. "
        f"{folder}/n01440764/ILSVRC2012_val_00000293.JPEG (the layout of "
        f"torchvision.datasets.ImageFolder), or set data.sources.imagenet.{key} in params.yaml to "
        f"the folder that holds them."
    )
    if not folder.is_dir():
        raise DatasetNotFoundError(f"ImageNet folder not found: {folder} does not exist. {fix}")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    files: list[Path] = []
    labels: list[int] = []
    empty = []
    for label, name in enumerate(classes):
        found = list_images(folder / name)
        if not found:
            empty.append(name)
        found = found[:limit] if limit else found
        files += found
        labels += [label] * len(found)
    if not classes or empty:
        what = (
            f"class folders without images: {', '.join(empty[:5])}"
            if classes
            else "no class sub-folders"
        )
        raise DatasetNotFoundError(f"ImageNet folder {folder} is incomplete ({what}). {fix}")
    return classes, files, labels
