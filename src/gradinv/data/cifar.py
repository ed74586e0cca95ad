"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny
Images"), downloaded by torchvision.

Why: CIFAR-10 is the small-image benchmark of CENSOR (NDSS 2025) and of most gradient-inversion
papers since Inverting Gradients (Geiping et al. 2020, arXiv:2003.14053); CIFAR-100 is used for
the many-class label-recovery settings. The official train split is our train split, the official
test split our validation split (the attacked images come from it, as in breaching).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from gradinv.data import DATASETS
from gradinv.data.download import (
    DownloadSettings,
    TorchvisionSource,
    download,
    extract_tar,
    md5_file,
    mirror_url,
    verify,
)

# Byte sizes of the official files, by torchvision's MD5: a size belongs to one exact file, so if
# torchvision's checksum changes no size is found here and download() falls back to the server's
# Content-Length (see download.py).
SIZES = {
    "c58f30108f718f92721af3b95e74349a": 170_498_071,  # cifar-10-python.tar.gz
    "eb9058c3a382ffc7106e4002c42a8d85": 169_001_437,  # cifar-100-python.tar.gz
}


class _Cifar(TorchvisionSource):
    tv_name: ClassVar[str]  # torchvision's dataset class

    @classmethod
    def val_size(cls, settings: Any) -> int:
        return min(settings.val_limit or 10_000, 10_000)  # the official test split: 10,000

    @classmethod
    def fetch_splits(
        cls, settings: DownloadSettings, root: Path
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[str, ...], str]:
        from torchvision import datasets  # on use: importing it costs seconds per job

        tv = getattr(datasets, cls.tv_name)
        url = mirror_url(tv.url, settings.mirror)  # file name and checksums stay torchvision's
        folder = root / tv.base_folder
        extracted = [(folder / f, md5) for f, md5 in tv.train_list + tv.test_list]
        extracted.append((folder / tv.meta["filename"], tv.meta["md5"]))
        # Files already extracted are used only if every one matches its MD5; otherwise the
        # (verified) archive is unpacked again over them.
        if any(not path.is_file() or md5_file(path) != md5 for path, md5 in extracted):
            size = SIZES.get(tv.tgz_md5)
            archive = download([url], root / tv.filename, tv.tgz_md5, name=cls.name, size=size)
            extract_tar(archive, root, name=cls.name)
        verify(cls.name, extracted)
        splits = [tv(str(root), train=train, download=False) for train in (True, False)]
        out: list = []
        for ds in splits:
            out.append(torch.from_numpy(np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2))))
            out.append(torch.as_tensor(ds.targets, dtype=torch.int64))
        return (*out, tuple(splits[0].classes), url)


@DATASETS.register("cifar10")
class Cifar10(_Cifar):
    paper_name = "CIFAR-10"
    name = "cifar10"
    tv_name = "CIFAR10"


@DATASETS.register("cifar100")
class Cifar100(_Cifar):
    paper_name = "CIFAR-100"
    name = "cifar100"
    tv_name = "CIFAR100"
