"""SVHN, Street View House Numbers (Netzer et al. 2011, NIPS workshop on deep learning), cropped
32×32 digits, downloaded by torchvision.

Why: a colour digit task with real-world clutter, between MNIST and CIFAR-10 in difficulty, used
by several gradient-inversion evaluations. The ``train`` split is our train split, ``test`` our
validation split; ``extra`` is not used. torchvision maps the label 10 of digit 0 to 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torchvision import datasets

from gradinv.data import DATASETS
from gradinv.data.download import DownloadSettings, TorchvisionSource, fetch, mirror_url, verify


@DATASETS.register("svhn")
class Svhn(TorchvisionSource):
    paper_name = "SVHN"
    name = "svhn"

    @classmethod
    def fetch_splits(
        cls, settings: DownloadSettings, root: Path
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[str, ...], str]:
        base = datasets.SVHN
        split_list = {
            k: [mirror_url(url, settings.mirror), fname, md5]
            for k, (url, fname, md5) in base.split_list.items()
        }
        tv = type(base.__name__, (base,), {"split_list": split_list})
        out: list = []
        for split in ("train", "test"):
            url, fname, md5 = split_list[split]
            ds = fetch(
                lambda split=split: tv(str(root), split=split, download=True),
                name=cls.name,
                urls=[url],
                root=root,
            )
            verify(cls.name, [(root / fname, md5)])
            out.append(torch.from_numpy(np.ascontiguousarray(ds.data)))
            out.append(torch.as_tensor(ds.labels, dtype=torch.int64))
        return (*out, tuple(str(d) for d in range(10)), split_list["train"][0].rsplit("/", 1)[0])
