"""Reading folders of image files the way the papers' loaders do.

ImageNet and FFHQ cannot be downloaded by a script (licence terms), so the user puts them in a
folder. Each image is resized so its shorter side is ``size`` and centre-cropped to a square,
which is torchvision's ``Resize(size)`` + ``CenterCrop(size)`` used by Inverting Gradients and
GIFD. Decoding runs in a thread pool: PIL releases the GIL while it decodes.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from gradinv.io import CorruptFileError

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".tif", ".tiff"})


def list_images(folder: Path, recursive: bool = False) -> list[Path]:
    """Image files in ``folder`` (and below, if ``recursive``), in sorted order."""
    pattern = folder.rglob("*") if recursive else folder.iterdir()
    return sorted(p for p in pattern if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def read_image(path: Path, size: int) -> Tensor:
    """One image as uint8 (3, size, size): shorter side resized to ``size``, centre crop."""
    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
    except (UnidentifiedImageError, OSError) as err:
        raise CorruptFileError(
            f"{path} is not a readable image ({err}); replace or remove it."
        ) from err
    # on use: importing torchvision costs seconds per job
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    img = TF.resize(img, size, interpolation=InterpolationMode.BILINEAR, antialias=True)
    return TF.pil_to_tensor(TF.center_crop(img, [size, size]))


def read_images(paths: list[Path], size: int) -> Tensor:
    """Many images as uint8 (N, 3, size, size), in the order of ``paths``."""
    if not paths:
        return torch.empty((0, 3, size, size), dtype=torch.uint8)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return torch.stack(list(pool.map(lambda p: read_image(p, size), paths)))
