"""MNIST (LeCun et al. 1998, "Gradient-based learning applied to document recognition"),
downloaded by torchvision.

Why: DLG (Zhu et al. 2019, arXiv:1906.08935) and its successors report MNIST with a LeNet; like
DLG we resize the 28×28 digits to 32×32 by default. The official train split is our train split,
the official test split our validation split. Offline, ``digits`` stands in for it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor
from torchvision import datasets

from gradinv.data import DATASETS
from gradinv.data.download import DownloadSettings, TorchvisionSource, fetch, verify


@DATASETS.register("mnist")
class Mnist(TorchvisionSource):
    paper_name = "MNIST"
    name = "mnist"

    @classmethod
    def fetch_splits(
        cls, settings: DownloadSettings, root: Path
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[str, ...], str]:
        base = datasets.MNIST
        mirrors = [settings.mirror.rstrip("/") + "/"] if settings.mirror else list(base.mirrors)
        # Same class name, so torchvision's folder (root/MNIST/raw) and checksums are unchanged.
        tv = type(base.__name__, (base,), {"mirrors": mirrors})
        splits = [
            fetch(
                lambda train=train: tv(str(root), train=train, download=True),
                name=cls.name,
                urls=mirrors,
                root=root,
            )
            for train in (True, False)
        ]
        raw = Path(splits[0].raw_folder)
        # torchvision only checks that the unpacked files exist; check the archives' MD5s too.
        verify(cls.name, [(raw / f, md5) for f, md5 in tv.resources])
        out: list = []
        for ds in splits:
            out.append(ds.data.unsqueeze(1).contiguous())
            out.append(ds.targets.to(torch.int64))
        return (*out, tuple(str(d) for d in range(10)), " or ".join(mirrors))
