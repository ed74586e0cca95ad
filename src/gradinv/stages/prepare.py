"""Stage: prepare a dataset once, and partition it among the clients."""

from __future__ import annotations

from contextlib import chdir
from pathlib import Path
from typing import Any

from gradinv.config import project_root
from gradinv.data import load_prepared, prepare_dataset
from gradinv.data.partition import (
    PartitionSettings,
    partition_indices,
    public_indices,
    write_partition,
)
from gradinv.settings import from_mapping


def prepare(settings: dict[str, Any], raw_dir: Path, out: Path) -> None:
    """Prepare ``settings["dataset"]`` into ``out``. The raw data params.yaml names
    (``data.raw_dir``, a source's folders) is the user's, read from the project's folder, while
    ``out`` is the run's (a relative ``out`` is the run's folder, the job's working directory)."""
    out = out.resolve()
    with chdir(project_root()):
        written = prepare_dataset(
            settings["dataset"], settings["settings"], raw_dir, out.parent, settings["seed"]
        )
    if written != out:
        raise RuntimeError(f"prepare_dataset wrote {written}, expected {out}")


def client_parts(labels: Any, p: PartitionSettings, seed: int) -> tuple[list[list[int]], list[int]]:
    """Each client's indices into the train split, and the public split's (held out first).

    The partition job's split; the configuration check runs it on the labels of a dataset whose
    labels are known without its data (:meth:`DatasetSource.train_labels`)."""
    public = public_indices(labels, p.public_fraction, seed)
    held = set(public)
    rest = [i for i in range(len(labels)) if i not in held]
    parts = partition_indices(
        labels[rest],
        p.scheme,
        p.num_clients,
        seed,
        alpha=p.alpha,
        labels_per_client=p.labels_per_client,
    )
    return [[rest[i] for i in part] for part in parts], public


def partition(settings: dict[str, Any], dataset: str, prepared_dir: Path, out: Path) -> None:
    ds = load_prepared(dataset, prepared_dir)
    p = from_mapping(PartitionSettings, settings["partition"], where="partition")
    clients, public = client_parts(ds.train_labels, p, settings["seed"])
    write_partition(
        out,
        clients,
        {
            "dataset": dataset,
            "data_sha256": ds.sha256,
            "seed": settings["seed"],
            **settings["partition"],
        },
        public=public,
    )
