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

from gradinv.data import DATASETS
from gradinv.data.download import DownloadSettings, TorchvisionSource, download, mirror_url

# Byte sizes of the official files, by torchvision's MD5: a size belongs to one exact file, so if
# torchvision's checksum changes no size is found here and download() falls back to the server's
# Content-Length (see download.py).
SIZES = {
    "e26dedcc434d2e4c54c9b2d4a06d8373": 182_040_794,  # train_32x32.mat
    "eb5a983be6a315427106f1b164d9cef3": 64_275_384,  # test_32x32.mat
    "a93ce644f1a588dc4d68dda5feec44a7": 1_329_278_602,  # extra_32x32.mat (not used)
}


@DATASETS.register("svhn")
class Svhn(TorchvisionSource):
    paper_name = "SVHN"
    name = "svhn"

    @classmethod
    def fetch_splits(
        cls, settings: DownloadSettings, root: Path
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[str, ...], str]:
        from torchvision import datasets  # on use: importing it costs seconds per job

        tv = datasets.SVHN
        out: list = []
        urls = {}
        for split in ("train", "test"):
            official, fname, md5 = tv.split_list[split]
            urls[split] = mirror_url(official, settings.mirror)  # checksums stay torchvision's
            download([urls[split]], root / fname, md5, name=cls.name, size=SIZES.get(md5))
            ds = tv(str(root), split=split, download=False)  # checks the MD5 again, then reads
            out.append(torch.from_numpy(np.ascontiguousarray(ds.data)))
            out.append(torch.as_tensor(ds.labels, dtype=torch.int64))
        return (*out, tuple(str(d) for d in range(10)), urls["train"].rsplit("/", 1)[0])
