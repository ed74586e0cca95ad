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

from gradinv.data import DATASETS
from gradinv.data.download import DownloadSettings, TorchvisionSource, download, gunzip


@DATASETS.register("mnist")
class Mnist(TorchvisionSource):
    paper_name = "MNIST"
    name = "mnist"

    @classmethod
    def fetch_splits(
        cls, settings: DownloadSettings, root: Path
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[str, ...], str]:
        from torchvision import datasets  # on use: importing it costs seconds per job

        tv = datasets.MNIST
        mirrors = [settings.mirror.rstrip("/") + "/"] if settings.mirror else list(tv.mirrors)
        # torchvision's folder (root/MNIST/raw), file names and checksums; it reads the unpacked
        # files, which have no recorded checksum, so they are unpacked again from the verified
        # archives on every load rather than trusted.
        raw = root / tv.__name__ / "raw"
        for fname, md5 in tv.resources:
            archive = download([m + fname for m in mirrors], raw / fname, md5, name=cls.name)
            gunzip(archive, raw / fname.removesuffix(".gz"))
        splits = [tv(str(root), train=train, download=False) for train in (True, False)]
        out: list = []
        for ds in splits:
            out.append(ds.data.unsqueeze(1).contiguous())
            out.append(ds.targets.to(torch.int64))
        return (*out, tuple(str(d) for d in range(10)), " or ".join(mirrors))
