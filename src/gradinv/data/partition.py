"""Splitting a training set among federated clients: IID, Dirichlet label skew, label shards.

Why: how much a client's update leaks depends on what its data looks like (a client holding one
label makes label recovery trivial), so the client split is an experimental variable, written to
a file and hashed like any other input. Schemes:

* ``iid``: a seeded shuffle cut into ``num_clients`` near-equal parts.
* ``dirichlet``: for every class, client shares drawn from Dirichlet(α·1) (Hsu et al. 2019,
  arXiv:1909.06335); small α gives strong label skew. Draws that leave a client empty are
  redrawn, as in NIID-Bench (Li et al. 2022, arXiv:2102.02079).
* ``shards``: each class is cut into single-label shards and every client is dealt
  ``labels_per_client`` of them (McMahan et al. 2017, arXiv:1602.05629), so no client holds more
  than ``labels_per_client`` labels. Unlike McMahan's sort-and-cut, no shard straddles two labels.

Every sample goes to exactly one client; each client's indices are sorted.

The attacker's public data (what the generative-prior attacks train their generator on) is held
out first: ``public_fraction`` of every class, drawn with the same seed, goes to no client
(:func:`public_indices`). The victims are validation images, so the public split meets neither a
client nor a victim.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from gradinv.io import CorruptFileError, read_json, regenerate_hint, write_json
from gradinv.settings import ConfigError, bounded

Scheme = Literal["iid", "dirichlet", "shards"]
SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "shards")
DIRICHLET_TRIES = 100


class PartitionFileError(CorruptFileError, ValueError):
    """A partition file that does not fit the split it indexes; the message names the fix."""


@dataclass(frozen=True)
class PartitionSettings:
    """The ``partition`` block of params.yaml; fields match :func:`partition_indices`."""

    scheme: Scheme = "iid"
    num_clients: int = bounded(10, ge=1)
    alpha: float = bounded(0.5, gt=0.0, doc="Dirichlet concentration; small = strong label skew")
    labels_per_client: int = bounded(2, ge=1, doc="shards scheme: labels (shards) per client")
    public_fraction: float = bounded(
        0.0, ge=0.0, lt=1.0, doc="share of each class held out of the clients as public data"
    )

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ConfigError(
                f"partition.scheme: {self.scheme!r} is not one of {', '.join(SCHEMES)}."
            )


def partition_indices(
    labels: Sequence[int] | np.ndarray | torch.Tensor,
    scheme: Scheme,
    num_clients: int,
    seed: int,
    alpha: float = 0.5,
    labels_per_client: int = 2,
) -> list[list[int]]:
    """Indices of ``labels`` for each of ``num_clients`` clients; see the module docstring."""
    y = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels, dtype=np.int64)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional; got shape {y.shape}")
    if num_clients < 1 or num_clients > len(y):
        raise ValueError(
            f"num_clients must lie in 1..{len(y)} (the number of samples), so that "
            f"no client is empty; got {num_clients}"
        )
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        parts = np.array_split(rng.permutation(len(y)), num_clients)
    elif scheme == "dirichlet":
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0; got {alpha}")
        parts = _dirichlet(y, num_clients, alpha, rng)
    elif scheme == "shards":
        parts = _shards(y, num_clients, labels_per_client, rng)
    else:
        raise ValueError(f"unknown partition scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    return [sorted(int(i) for i in p) for p in parts]


def public_indices(
    labels: Sequence[int] | np.ndarray | torch.Tensor, fraction: float, seed: int
) -> list[int]:
    """The attacker's public split: ``fraction`` of each class (rounded down), seeded, sorted.

    Drawn from its own generator (seed + 1), so the clients' split of the rest does not change
    the public one."""
    y = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels, dtype=np.int64)
    rng = np.random.default_rng(seed + 1)
    chosen = [
        rng.permutation(np.flatnonzero(y == c))[: int(fraction * np.sum(y == c))]
        for c in np.unique(y)
    ]
    return sorted(int(i) for i in np.concatenate(chosen)) if chosen else []


def _dirichlet(y: np.ndarray, k: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    for _ in range(DIRICHLET_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(k, alpha))) * len(idx)).astype(int)[:-1]
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
        merged = [np.concatenate(p) for p in parts]
        if min(len(p) for p in merged) > 0:
            return merged
    raise ValueError(
        f"dirichlet(alpha={alpha}) left a client empty in {DIRICHLET_TRIES} draws "
        f"for {k} clients and {len(y)} samples; raise alpha or lower num_clients."
    )


def _shards(y: np.ndarray, k: int, per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    classes, counts = np.unique(y, return_counts=True)
    total = k * per_client
    if total < len(classes) or total > len(y):
        raise ValueError(
            f"shards: num_clients*labels_per_client = {total} must lie between the "
            f"number of labels ({len(classes)}, so every sample has a client) and "
            f"the number of samples ({len(y)})."
        )
    # One shard per class, the rest by largest remainder in proportion to class size.
    per_class = np.ones(len(classes), dtype=int)
    share = (total - len(classes)) * counts / counts.sum()
    per_class += np.floor(share).astype(int)
    order = np.argsort(-(share - np.floor(share)), kind="stable")
    per_class[order[: total - per_class.sum()]] += 1
    # A class cannot give more shards than samples; move the excess to the largest classes.
    while (per_class > counts).any():
        over = np.flatnonzero(per_class > counts)[0]
        per_class[over] -= 1
        per_class[np.argmax(counts - per_class)] += 1
    shards = [
        chunk
        for c, n in zip(classes, per_class, strict=True)
        for chunk in np.array_split(rng.permutation(np.flatnonzero(y == c)), n)
    ]
    order = rng.permutation(len(shards))
    return [
        np.concatenate([shards[j] for j in order[i * per_client : (i + 1) * per_client]])
        for i in range(k)
    ]


def write_partition(
    path: str | os.PathLike[str],
    parts: list[list[int]],
    meta: dict[str, Any],
    public: Sequence[int] = (),
) -> None:
    """Write the client split (and the public split no client holds) as JSON, atomically."""
    write_json(
        path,
        {
            "meta": meta,
            "num_clients": len(parts),
            "num_samples": sum(len(p) for p in parts),
            "clients": [[int(i) for i in p] for p in parts],
            "public": [int(i) for i in public],
        },
    )


def read_partition(
    path: str | os.PathLike[str], num_train: int
) -> tuple[list[list[int]], dict[str, Any]]:
    """Read a file written by :func:`write_partition` for a train split of ``num_train`` images;
    return (clients, meta). See :func:`read_split` for what is checked."""
    parts, _, meta = read_split(path, num_train)
    return parts, meta


def read_public(path: str | os.PathLike[str], num_train: int) -> list[int]:
    """The public split of a partition file (train indices no client holds); see
    :func:`read_split`."""
    return read_split(path, num_train)[1]


def read_split(
    path: str | os.PathLike[str], num_train: int
) -> tuple[list[list[int]], list[int], dict[str, Any]]:
    """(clients, public, meta) of a partition file for a train split of ``num_train`` images.

    Besides the file's digest (:func:`gradinv.io.read_json`), every index must be an integer in
    ``[0, num_train)`` (Python would read -1 as the last train image, possibly one of the
    attacker's public split, and an index past the end fails only when a round draws it), and no
    image may be held twice: by two clients, by one client twice, or by a client and the public
    split. A file that breaks this raises :class:`PartitionFileError` naming the client and the
    index."""
    hint = regenerate_hint(path)
    data = read_json(path)
    try:
        clients, public, meta = data["clients"], data.get("public", []), dict(data["meta"])
    except (KeyError, TypeError, ValueError) as err:
        raise PartitionFileError(f"{path} is not a partition file ({err!r}).{hint}") from err
    if not isinstance(clients, list) or data.get("num_clients") != len(clients):
        raise PartitionFileError(
            f"{path} is inconsistent: num_clients is {data.get('num_clients')!r} but it "
            f"lists {len(clients) if isinstance(clients, list) else 'no'} clients.{hint}"
        )
    owner: dict[int, str] = {}
    for who, indices in [*((f"client {c}", p) for c, p in enumerate(clients)), ("public", public)]:
        for i in _indices(path, who, indices, hint):
            if not 0 <= i < num_train:
                raise PartitionFileError(
                    f"{path}: {who} holds index {i}, outside the train split of {num_train} "
                    f"images (0..{num_train - 1}).{hint}"
                )
            if i in owner:
                raise PartitionFileError(
                    f"{path} is inconsistent: train image {i} is held by both {owner[i]} and "
                    f"{who}, but every image belongs to one client or the public split.{hint}"
                )
            owner[i] = who
    return clients, public, meta


def _indices(path: str | os.PathLike[str], who: str, indices: Any, hint: str) -> list[int]:
    if not isinstance(indices, list):
        raise PartitionFileError(f"{path}: {who} holds {indices!r}, not a list of indices.{hint}")
    for i in indices:
        if not isinstance(i, int) or isinstance(i, bool):
            raise PartitionFileError(f"{path}: {who} holds {i!r}, not an integer index.{hint}")
    return indices
