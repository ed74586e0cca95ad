"""Patches of the real photographs bundled in scikit-image's wheel: a CIFAR-sized stand-in.

Why: the pipeline, its tests and the sanity path must run without network access, and a gradient
inversion attack is only meaningfully scored on natural images (edges, texture, colour), which
random or synthetic images are not. scikit-image ships a handful of public-domain / CC0
photographs inside its wheel (van der Walt et al. 2014, "scikit-image: image processing in
Python", PeerJ 2:e453); each becomes one class, and 32×32 patches of it become its samples.

Only photographs whose file is inside the installed wheel are used (read straight from the
package folder, so pooch never downloads anything); synthetic images (colorwheel, chessboard,
logo, phantom, horse silhouette) are left out. ``cell``, ``clock`` and ``moon`` are real photos
too but mostly flat grey, so they are available but not in the default list.

Train and validation patches come from disjoint regions of every photo: after downscaling, the
photo is cut along its longer axis into a train region and a validation region (the last
``val_fraction`` of that axis), with ``gap`` pixels between them, so no validation patch shares a
pixel with any training patch. Each sample's box is recorded in ``RawSplits.*_boxes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import skimage.data
import torch
from PIL import Image

from gradinv.data import DATASETS
from gradinv.data.base import DatasetSource, RawSplits, as_labels
from gradinv.settings import ConfigError, bounded


class Photo(NamedTuple):
    filename: str
    credit: str
    crop: tuple[float, float, float, float] | None = None  # (top, left, bottom, right) fractions


# Files present in the scikit-image wheel itself (no pooch download). Gray photos become RGB.
PHOTOS: dict[str, Photo] = {
    "astronaut": Photo("astronaut.png", "Eileen Collins, NASA (public domain)"),
    "brick": Photo("brick.png", "brick wall, CC0Textures Bricks25"),
    "camera": Photo("camera.png", "cameraman, Lav Varshney (CC0)"),
    "chelsea": Photo("chelsea.png", "Chelsea the cat, Stefan van der Walt (CC0)"),
    "coffee": Photo("coffee.png", "cup of coffee, Rachel Michetti (CC0)"),
    "coins": Photo("coins.png", "Greek coins from Pompeii, Brooklyn Museum"),
    "grass": Photo("grass.png", "grass, linolafett on DeviantArt (CC0)"),
    "gravel": Photo("gravel.png", "gravel, CC0Textures Gravel04"),
    "hubble_deep_field": Photo("hubble_deep_field.jpg", "Hubble eXtreme Deep Field, NASA"),
    "immunohistochemistry": Photo("ihc.png", "immunohistochemistry stain (no known copyright)"),
    "motorcycle": Photo("motorcycle_left.png", "Middlebury 2014 stereo, left view"),
    "page": Photo("page.png", "scanned book page"),
    # The fundus photo sits in a black disc: keep the square inscribed in the disc.
    "retina": Photo(
        "retina.jpg", "human retina fundus, Häggström (public domain)", (0.17, 0.17, 0.83, 0.83)
    ),
    "rocket": Photo("rocket.jpg", "Falcon 9 at Launch Complex 40, SpaceX (public domain)"),
    "text": Photo("text.png", "handwritten text, Wikipedia Corner.png (public domain)"),
    "cell": Photo("cell.png", "microscopy of a cell"),
    "clock": Photo("clock_motion.png", "motion-blurred wall clock, Stefan van der Walt"),
    "moon": Photo("moon.png", "surface of the moon"),
}
DEFAULT_PHOTOS: tuple[str, ...] = tuple(list(PHOTOS)[:15])


def photo_path(name: str) -> Path:
    return Path(skimage.data.__file__).parent / PHOTOS[name].filename


def _crop_box(size: tuple[int, int], crop: tuple[float, ...]) -> tuple[int, int, int, int]:
    """PIL's (left, top, right, bottom) of a photo of ``size`` (width, height) for its crop."""
    w, h = size
    return round(crop[1] * w), round(crop[0] * h), round(crop[3] * w), round(crop[2] * h)


def _target_size(size: tuple[int, int], source_side: int) -> tuple[int, int]:
    """(width, height) after the resize that makes the shorter side ``source_side``."""
    w, h = size
    scale = source_side / min(w, h)
    return max(source_side, round(w * scale)), max(source_side, round(h * scale))


def photo_shape(name: str, source_side: int) -> tuple[int, int]:
    """(height, width) of :func:`load_photo`'s array, from the file's header alone."""
    path = photo_path(name)
    if not path.is_file():
        return source_side, source_side  # load_photo names the missing file
    with Image.open(path) as img:
        size = img.size
    crop = PHOTOS[name].crop
    if crop is not None:
        left, top, right, bottom = _crop_box(size, crop)
        size = (right - left, bottom - top)
    w, h = _target_size(size, source_side)
    return h, w


def load_photo(name: str, source_side: int) -> np.ndarray:
    """The photo as uint8 RGB (H, W, 3), cropped and resized so its shorter side is ``source_side``.

    The same array the patches are cut from, so a test can re-cut a patch from its recorded box.
    """
    path = photo_path(name)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: this scikit-image wheel does not bundle "
            f"{name!r}; drop it from data.sources.patches.photos in params.yaml."
        )
    with Image.open(path) as img:
        img = img.convert("RGB")
        crop = PHOTOS[name].crop
        if crop is not None:
            img = img.crop(_crop_box(img.size, crop))
        size = _target_size(img.size, source_side)
        # PIL's bilinear filter widens with the reduction factor, so downscaling is antialiased.
        img = img.resize(size, Image.Resampling.BILINEAR)
        return np.asarray(img, dtype=np.uint8).copy()


@DATASETS.register("patches")
class Patches(DatasetSource):
    paper_name = "Patches (scikit-image photos)"
    kind = "embedded"

    @dataclass(frozen=True)
    class Settings:
        photos: tuple[str, ...] = DEFAULT_PHOTOS
        image_size: int = bounded(32, ge=8, doc="side of each square patch, in pixels")
        source_side: int = bounded(
            160,
            ge=16,
            doc="shorter side of each photo after downscaling; "
            "a 32-px patch then spans a fifth of it",
        )
        val_fraction: float = bounded(
            0.3, gt=0.0, lt=1.0, doc="share of each photo's longer axis kept for validation"
        )
        gap: int = bounded(8, ge=0, doc="pixels between the train and the validation region")
        train_per_class: int = bounded(500, ge=1)
        val_per_class: int = bounded(100, ge=1)

        def __post_init__(self) -> None:
            unknown = [p for p in self.photos if p not in PHOTOS]
            if unknown:
                raise ConfigError(
                    f"data.sources.patches.photos: unknown photo {unknown[0]!r}; "
                    f"available: {', '.join(PHOTOS)}."
                )
            if len(set(self.photos)) != len(self.photos) or len(self.photos) < 2:
                raise ConfigError("data.sources.patches.photos: list at least two distinct photos.")

    @classmethod
    def check_settings(cls, settings: Settings) -> None:
        """Every photo's train and validation strips hold the patches asked of them (read from
        the photos' headers and their crops, the same arithmetic as :func:`load_photo`)."""
        for name in settings.photos:
            h, w = photo_shape(name, settings.source_side)
            train_box, val_box = regions((h, w), settings)
            for split, box, n in (
                ("train", train_box, settings.train_per_class),
                ("val", val_box, settings.val_per_class),
            ):
                _check_positions(box, settings.image_size, n, f"the {split} region of {name!r}")

    @classmethod
    def train_labels(cls, settings: Settings) -> np.ndarray:
        return np.repeat(np.arange(len(settings.photos)), settings.train_per_class)

    @classmethod
    def val_size(cls, settings: Any) -> int:
        return len(settings.photos) * settings.val_per_class

    @classmethod
    def load(cls, settings: Settings, root: Path, seed: int) -> RawSplits:
        s, p = settings, settings.image_size
        rng = np.random.default_rng(seed)
        cut = {split: {"images": [], "labels": [], "boxes": []} for split in ("train", "val")}
        for label, name in enumerate(s.photos):
            photo = load_photo(name, s.source_side)
            train_box, val_box = regions(photo.shape[:2], s)
            for split, box, n in (
                ("train", train_box, s.train_per_class),
                ("val", val_box, s.val_per_class),
            ):
                corners = sample_corners(box, p, n, rng, f"the {split} region of {name!r}")
                cut[split]["images"] += [photo[y : y + p, x : x + p] for y, x in corners]
                cut[split]["labels"] += [label] * n
                cut[split]["boxes"] += [(label, y, x, p, p) for y, x in corners]

        def images(split: str) -> torch.Tensor:
            return torch.from_numpy(np.stack(cut[split]["images"])).permute(0, 3, 1, 2).contiguous()

        return RawSplits(
            train_images=images("train"),
            train_labels=as_labels(cut["train"]["labels"]),
            val_images=images("val"),
            val_labels=as_labels(cut["val"]["labels"]),
            classes=tuple(s.photos),
            source=(
                f"{p}px patches of {len(s.photos)} photographs bundled with "
                f"scikit-image {skimage.__version__} (shorter side {s.source_side}px; "
                f"validation from the last {s.val_fraction:g} of the longer axis, "
                f"{s.gap}px gap)"
            ),
            train_boxes=torch.tensor(cut["train"]["boxes"], dtype=torch.int64),
            val_boxes=torch.tensor(cut["val"]["boxes"], dtype=torch.int64),
        )


Box = tuple[int, int, int, int]  # top, left, bottom, right (exclusive)


def regions(shape: tuple[int, int], s: Patches.Settings) -> tuple[Box, Box]:
    """Disjoint train and validation regions of a photo of ``shape``, split on its longer axis."""
    h, w = shape
    long_axis = 0 if h > w else 1
    length = (h, w)[long_axis]
    val_len = round(length * s.val_fraction)
    train_len = length - val_len - s.gap
    if min(val_len, train_len, h, w) < s.image_size:
        raise ConfigError(
            f"data.sources.patches: a {h}x{w} photo leaves a {train_len}-px train and a "
            f"{val_len}-px validation strip, too small for {s.image_size}-px patches; raise "
            f"source_side or lower image_size/gap."
        )
    if long_axis == 0:
        return (0, 0, train_len, w), (length - val_len, 0, h, w)
    return (0, 0, h, train_len), (0, length - val_len, h, w)


def _check_positions(box: Box, size: int, n: int, what: str) -> tuple[int, int]:
    """The rows and columns of ``size`` patch corners inside ``box``; at least ``n`` of them."""
    top, left, bottom, right = box
    rows, cols = bottom - top - size + 1, right - left - size + 1
    if n > rows * cols:
        raise ConfigError(
            f"data.sources.patches: {what} has only {rows * cols} distinct patch positions "
            f"but {n} were asked for; lower train_per_class/val_per_class or raise "
            f"source_side."
        )
    return rows, cols


def sample_corners(
    box: Box, size: int, n: int, rng: np.random.Generator, what: str
) -> list[tuple[int, int]]:
    """``n`` distinct top-left corners of ``size`` patches lying wholly inside ``box``."""
    top, left = box[:2]
    rows, cols = _check_positions(box, size, n, what)
    flat = rng.choice(rows * cols, size=n, replace=False)
    return [(top + int(i // cols), left + int(i % cols)) for i in flat]
