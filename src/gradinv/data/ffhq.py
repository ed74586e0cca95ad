"""FFHQ faces (Karras et al. 2019, arXiv:1812.04948) from a folder, labelled by age decade.

Why: CENSOR (NDSS 2025) evaluates on 64×64 FFHQ with the GIFD harness, whose classification task
is the age decade, ``min(age // 10, 9)``, with ages from the ffhq-features-dataset (Microsoft Face
API attributes, one JSON per image, ``[{"faceAttributes": {"age": 28.0, ...}}]``). FFHQ cannot be
fetched by script here, so the user provides a folder of images and either that JSON folder or a
CSV with columns ``image,age``. Images and labels are matched by file stem (``00042.png`` ↔
``00042.json``); the feature set has empty JSONs for faces the API missed, and those images are
skipped (the count is recorded in ``source`` and warned about). Train and validation are a seeded
split stratified by decade.
"""

from __future__ import annotations

import csv
import json
import warnings
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
from gradinv.io import CorruptFileError
from gradinv.settings import bounded

CLASSES: tuple[str, ...] = (*(f"{10 * d}-{10 * d + 9}" for d in range(9)), "90+")


def age_label(age: float) -> int:
    """Decade of ``age``; 90 and above share the last class, as in GIFD."""
    return min(int(age) // 10, 9)


@DATASETS.register("ffhq")
class Ffhq(DatasetSource):
    paper_name = "FFHQ"
    kind = "folder"

    @dataclass(frozen=True)
    class Settings:
        root: str = "data/raw/ffhq/images"  # FFHQ images, searched recursively
        labels: str = "data/raw/ffhq/json"  # ffhq-features-dataset json/ folder, or a CSV
        image_size: int = bounded(64, ge=8, doc="shorter side resized to this, then centre crop")
        val_fraction: float = bounded(0.2, gt=0.0, lt=1.0, doc="share of each decade held out")
        max_images: int = bounded(0, ge=0, doc="first N labelled images (sorted); 0 keeps all")

    @classmethod
    def load(cls, settings: Settings, root: Path, seed: int) -> RawSplits:
        s = settings
        images = find_images(Path(s.root))
        ages = read_ages(Path(s.labels))
        labelled = [(p, ages[p.stem]) for p in images if ages.get(p.stem) is not None]
        skipped = len(images) - len(labelled)
        if not labelled:
            raise DatasetNotFoundError(
                f"FFHQ: none of the {len(images)} images in {s.root} has an age in {s.labels}; "
                f"names must match by stem (00042.png <-> 00042.json or a CSV row '00042.png,"
                f"31'). Check data.sources.ffhq.root and data.sources.ffhq.labels in params.yaml."
            )
        if skipped:
            warnings.warn(
                f"FFHQ: {skipped} of {len(images)} images have no age label and are skipped.",
                stacklevel=2,
            )
        if s.max_images:
            labelled = labelled[: s.max_images]
        files = [p for p, _ in labelled]
        labels = np.asarray([age_label(a) for _, a in labelled], dtype=np.int64)
        train, val = split_per_class(labels, s.val_fraction, np.random.default_rng(seed))
        return RawSplits(
            train_images=read_images([files[i] for i in train], s.image_size),
            train_labels=as_labels(labels[train]),
            val_images=read_images([files[i] for i in val], s.image_size),
            val_labels=as_labels(labels[val]),
            classes=CLASSES,
            source=(
                f"FFHQ images from {s.root} with ages from {s.labels} ({len(files)} used, "
                f"{skipped} without a label skipped), age decade labels, resized+centre-"
                f"cropped to {s.image_size}px"
            ),
        )


def find_images(folder: Path) -> list[Path]:
    fix = (
        "Put the FFHQ images there (e.g. thumbnails128x128/ or images1024x1024/ from "
        "NVlabs/ffhq-dataset; sub-folders are searched), or set data.sources.ffhq.root in "
        "params.yaml to the folder that holds them."
    )
    if not folder.is_dir():
        raise DatasetNotFoundError(f"FFHQ image folder not found: {folder} does not exist. {fix}")
    images = list_images(folder, recursive=True)
    if not images:
        raise DatasetNotFoundError(f"FFHQ image folder {folder} holds no images. {fix}")
    stems = [p.stem for p in images]
    if len(set(stems)) != len(stems):
        dup = next(s for s in stems if stems.count(s) > 1)
        raise DatasetNotFoundError(
            f"FFHQ: two images in {folder} share the name {dup!r}; "
            f"labels are matched by name, so keep one of them."
        )
    return images


def read_ages(source: Path) -> dict[str, float | None]:
    """Age per image stem, from a folder of ffhq-features JSONs or an ``image,age`` CSV."""
    fix = (
        "Put the ffhq-features-dataset json/ folder there (one 00042.json per image, "
        "DCGM/ffhq-features-dataset), or a CSV with header 'image,age', and set "
        "data.sources.ffhq.labels in params.yaml to it."
    )
    if source.is_file() and source.suffix.lower() == ".csv":
        return read_age_csv(source)
    if not source.is_dir():
        raise DatasetNotFoundError(
            f"FFHQ age labels not found: {source} is neither a folder nor a .csv file. {fix}"
        )
    files = sorted(source.rglob("*.json"))
    if not files:
        raise DatasetNotFoundError(f"FFHQ label folder {source} holds no .json files. {fix}")
    return {f.stem: age_from_json(f) for f in files}


def age_from_json(path: Path) -> float | None:
    """The first face's age, or None where the Face API found no face (an empty list)."""
    try:
        data = json.loads(path.read_text())
        faces = data if isinstance(data, list) else [data]
        return check_age(float(faces[0]["faceAttributes"]["age"]), path) if faces else None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as err:
        raise CorruptFileError(
            f"FFHQ label {path} is not an ffhq-features JSON with "
            f"faceAttributes.age ({err!r}); restore it from "
            f"DCGM/ffhq-features-dataset."
        ) from err


def read_age_csv(path: Path) -> dict[str, float | None]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not {"image", "age"} <= set(reader.fieldnames or ()):
            raise CorruptFileError(
                f"FFHQ label CSV {path} needs the header 'image,age'; it has {reader.fieldnames}."
            )
        ages: dict[str, float | None] = {}
        for line, row in enumerate(reader, start=2):
            text = (row["age"] or "").strip()
            try:
                ages[Path(row["image"].strip()).stem] = (
                    check_age(float(text), path) if text else None
                )
            except ValueError as err:
                raise CorruptFileError(
                    f"FFHQ label CSV {path}, line {line}: age {text!r} is not a valid age ({err})."
                ) from err
        return ages


def check_age(age: float, path: Path) -> float:
    if not age >= 0:  # also catches NaN
        raise ValueError(f"age {age} in {path} must be a number >= 0")
    return age
