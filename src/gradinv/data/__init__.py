"""Datasets, registered by name; see README.md to add one.

A dataset source turns raw material into :class:`RawSplits` (uint8 images, int64 labels, a train
and a validation split). ``prepare_dataset`` writes them once, with normalisation statistics and a
sha256, to ``data/prepared/<name>.pt``; every later stage reads that file with ``load_prepared``.

Sources come in three kinds: embedded (``patches``, ``digits``: shipped inside installed wheels,
no network, what the tests and the sanity path use), download (``cifar10``, ``cifar100``,
``mnist``, ``svhn``: torchvision, MD5-checked) and folder (``imagenet``, ``ffhq``: files the user
provides, since their licences forbid scripted downloads).
"""

from __future__ import annotations

from gradinv.data.base import (
    DatasetNotFoundError,
    DatasetSource,
    DownloadError,
    RawSplits,
)
from gradinv.registry import Registry

DATASETS: Registry[type[DatasetSource]] = Registry("dataset")

# Importing each module registers its datasets; listed explicitly, no star imports.
from gradinv.data import (  # noqa: E402, F401
    cifar,
    digits,
    ffhq,
    imagenet,
    mnist,
    patches,
    svhn,
)
from gradinv.data.partition import (  # noqa: E402
    PartitionSettings,
    partition_indices,
    public_indices,
    read_partition,
    read_public,
    write_partition,
)
from gradinv.data.prepared import (  # noqa: E402
    PreparedDataset,
    dataset_settings,
    load_prepared,
    prepare_dataset,
)

__all__ = [
    "DATASETS",
    "DatasetNotFoundError",
    "DatasetSource",
    "DownloadError",
    "PartitionSettings",
    "PreparedDataset",
    "RawSplits",
    "dataset_settings",
    "load_prepared",
    "partition_indices",
    "prepare_dataset",
    "public_indices",
    "read_partition",
    "read_public",
    "write_partition",
]
