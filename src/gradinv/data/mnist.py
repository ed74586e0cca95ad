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

# Byte sizes of the official files, by torchvision's MD5: a size belongs to one exact file, so if
# torchvision's checksum changes no size is found here and download() falls back to the server's
# Content-Length (see download.py).
SIZES = {
    "f68b3c2dcbeaaa9fbdd348bbdeb94873": 9_912_422,  # train-images-idx3-ubyte.gz
    "d53e105ee54ea40749a09fcbcd1e9432": 28_881,  # train-labels-idx1-ubyte.gz
    "9fb629c4189551a2d022fa330f9573f3": 1_648_877,  # t10k-images-idx3-ubyte.gz
    "ec29112dd5afa0611ce80d1b7f02629c": 4_542,  # t10k-labels-idx1-ubyte.gz
}


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
            urls = [m + fname for m in mirrors]
            archive = download(urls, raw / fname, md5, name=cls.name, size=SIZES.get(md5))
            gunzip(archive, raw / fname.removesuffix(".gz"))
        splits = [tv(str(root), train=train, download=False) for train in (True, False)]
        out: list = []
        for ds in splits:
            out.append(ds.data.unsqueeze(1).contiguous())
            out.append(ds.targets.to(torch.int64))
        return (*out, tuple(str(d) for d in range(10)), " or ".join(mirrors))
