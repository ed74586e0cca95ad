"""scikit-learn's handwritten digits, resized: an embedded stand-in for MNIST.

Why: the MNIST experiments of the gradient-inversion literature (DLG, Zhu et al. 2019,
arXiv:1906.08935, resizes MNIST to 32×32 for its LeNet) need grey handwritten digits, and MNIST
itself must be downloaded. ``sklearn.datasets.load_digits`` ships 1,797 real handwritten digits
inside the wheel: the test set of the UCI "Optical Recognition of Handwritten Digits" data
(Alpaydin & Kaynak 1998), 8×8 pixels with 17 grey levels (0..16). They are scaled to 0..255 and
bilinearly resized to ``image_size``; the train/validation split is stratified and seeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gradinv.data import DATASETS
from gradinv.data.base import DatasetSource, RawSplits, as_labels, resize_images, split_per_class
from gradinv.settings import bounded


@DATASETS.register("digits")
class Digits(DatasetSource):
    paper_name = "Digits (scikit-learn, MNIST stand-in)"
    kind = "embedded"

    @dataclass(frozen=True)
    class Settings:
        image_size: int = bounded(32, ge=8, doc="side after bilinear resizing from 8 px")
        val_fraction: float = bounded(0.2, gt=0.0, lt=1.0, doc="share of each class held out")

    @classmethod
    def load(cls, settings: Settings, root: Path, seed: int) -> RawSplits:
        import sklearn  # on use: importing it costs seconds for every job that loads data
        from sklearn.datasets import load_digits

        bunch = load_digits()
        # 0..16 grey levels -> 0..255 before resizing, so rounding happens once, at the end.
        small = torch.from_numpy(bunch.images.astype(np.float32) * (255.0 / 16.0))
        small = small.round().clamp(0, 255).to(torch.uint8).unsqueeze(1)
        images = resize_images(small, settings.image_size)
        labels = np.asarray(bunch.target, dtype=np.int64)
        train, val = split_per_class(labels, settings.val_fraction, np.random.default_rng(seed))
        return RawSplits(
            train_images=images[train],
            train_labels=as_labels(labels[train]),
            val_images=images[val],
            val_labels=as_labels(labels[val]),
            classes=tuple(str(d) for d in range(10)),
            source=(
                f"scikit-learn {sklearn.__version__} load_digits (UCI optical digits, "
                f"1797 images, 8x8) resized to {settings.image_size}px"
            ),
        )
