"""Stage: the floor, the uninformative reconstruction every attack is compared with.

An attack whose reconstruction of a victim is no closer than an image that knows nothing of the
victim has recovered nothing of it, and a defense cannot be shown to lower it. The floor is the
per-pixel mean of the dataset's public split (the training images no client holds,
``partition.public_fraction``): the best constant guess in squared error an attacker could make
without the update. The score stage scores it against every victim with the attack's own
metrics, so each metrics file carries its victim's floor beside the attack's values, and the
tables and claims compare them victim by victim (``gradinv.claims``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradinv.data import load_prepared
from gradinv.io import save_tensors, sha256_file
from gradinv.stages.common import public_split, record, setup


def run(settings: dict[str, Any], prepared_dir: Path, partition: Path, out: Path) -> None:
    setup(settings)
    ds = load_prepared(settings["dataset"], prepared_dir)
    public = public_split(settings, ds, partition, "the floor (the public split's mean image)")
    images, _ = ds.train_subset(public)
    save_tensors(
        out,
        {
            "image": images.mean(0),  # (C, H, W) in [0, 1]
            "public_images": len(public),
            "dataset": ds.name,
            **record(settings, ds.sha256),
            "partition_sha256": sha256_file(partition),
        },
    )
