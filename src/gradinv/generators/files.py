"""Generator files: a trained checkpoint the pipeline wrote, or published weights it fetched.

A ``generators.<name>`` block of params.yaml holds the generator's own settings (its ``Settings``
dataclass) plus these bookkeeping keys:

- ``kind``, ``label``; ``datasets``: the datasets whose attacks use it;
- ``label_map``: per dataset, the generator class of each dataset label (CIFAR-10 onto
  BigGAN's ImageNet classes); a dataset not listed uses its labels as they are;
- ``attack_settings``: per attack kind, settings that replace the attack's when it searches this
  generator (GIFD's stages and radii differ between BigGAN and StyleGAN2);
- pretrained kinds only: ``url`` (where rule ``fetch_generator`` downloads the weights),
  ``local_path`` (a copy already on disk, used instead), ``sha256`` (of the weights file, checked
  before anything is loaded) and ``source`` (the publisher, for the error messages).

Paths: a trained generator is ``data/generators/<name>/<dataset>.pt`` (one per dataset, trained
on that dataset's public split); a pretrained one ``data/generators/<name>/weights.pt``.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import urllib.request
from http.client import HTTPException
from pathlib import Path
from typing import Any
from urllib.error import URLError

from gradinv.generators import GENERATORS
from gradinv.generators.base import Generator, WeightsError, verified_weights
from gradinv.io import atomic_path, load_tensors, save_tensors, sha256_file, snakemake_command
from gradinv.paths import GENERATORS as GENERATORS_ROOT
from gradinv.settings import from_mapping

COMMON_KEYS = (
    "kind",
    "label",
    "datasets",
    "label_map",
    "url",
    "local_path",
    "sha256",
    "source",
    "attack_settings",
)
ROOT = GENERATORS_ROOT


def own_settings(name: str, block: dict[str, Any]) -> Any:
    """The generator's Settings from its params.yaml block (bookkeeping keys removed)."""
    cls = GENERATORS.get(block["kind"])
    values = {k: v for k, v in block.items() if k not in COMMON_KEYS}
    return from_mapping(cls.Settings, values, where=f"generators.{name}")


def save_trained(path: Path, name: str, kind: str, model: Generator, **record: Any) -> None:
    """A trained generator's file: its settings, shape and weights, and what produced it."""
    save_tensors(
        path,
        {
            "name": name,
            "kind": kind,
            "settings": dataclasses.asdict(model.settings),
            "resolution": model.resolution,
            "channels": model.rgb.out_channels,
            "num_classes": record.pop("num_classes"),
            "state": model.state_dict(),
            **record,
        },
    )


def load_generator(name: str, block: dict[str, Any], path: str | Path) -> Generator:
    """The generator of block ``name`` with the weights at ``path``, in eval mode, frozen."""
    cls = GENERATORS.get(block["kind"])
    settings = own_settings(name, block)
    if cls.trainable:
        remedy = f"{snakemake_command(path)} --forcerun train_generator"
        saved = load_tensors(path, remedy=remedy)
        model = cls(settings, saved["resolution"], saved["channels"], saved["num_classes"])
        model.load_state_dict(saved["state"])
    else:
        source = block.get("source") or block.get("url") or "its publisher"
        model = cls.load(
            settings, verified_weights(path, block.get("sha256", ""), source, name), name
        )
    model.eval()
    model.requires_grad_(False)
    return model


def fetch_weights(name: str, block: dict[str, Any], out: Path) -> Path:
    """Put the published weights of generator ``name`` at ``out``, verified by sha256.

    From ``local_path`` when it is set, else downloaded from ``url``. The file is written beside
    ``out`` and renamed onto it only after its sha256 matched, so a wrong or truncated file is
    never left where the attacks would load it."""
    sha256, source = block.get("sha256", ""), block.get("source") or block.get("url") or "?"
    if not sha256:
        raise WeightsError(
            f"generator {name}: no sha256 is recorded (generators.{name}.sha256), so the "
            f"weights from {source} cannot be verified; record the published checksum first."
        )
    out = Path(out)
    if out.is_file() and sha256_file(out) == sha256:
        return out
    local, url = block.get("local_path", ""), block.get("url", "")
    if not local and not url:
        raise WeightsError(
            f"generator {name}: neither generators.{name}.local_path nor .url is set; download "
            f"the weights from {source} (sha256 {sha256}) and set local_path to the file."
        )
    with atomic_path(out) as tmp:
        if local:
            if not Path(local).is_file():
                raise WeightsError(
                    f"generator {name}: generators.{name}.local_path {local} does not exist; "
                    f"download the weights from {source} (sha256 {sha256}) to it."
                )
            shutil.copyfile(local, tmp)
            origin = local
        else:
            print(f"gradinv: generator {name}: downloading {url}", file=sys.stderr, flush=True)
            try:
                with urllib.request.urlopen(url, timeout=60.0) as response, open(tmp, "wb") as f:
                    shutil.copyfileobj(response, f)
            except (URLError, OSError, HTTPException) as err:
                raise WeightsError(
                    f"generator {name}: {url} could not be downloaded ({type(err).__name__}: "
                    f"{err}). Download the weights from {source} (sha256 {sha256}) by hand and "
                    f"set generators.{name}.local_path to the file."
                ) from err
            origin = url
        found = sha256_file(tmp)
        if found != sha256:
            raise WeightsError(
                f"generator {name}: {origin} gave a file with sha256 {found}, expected {sha256} "
                f"(the published weights from {source}); nothing was written to {out}. Get the "
                "published file and point local_path at it."
            )
    return out
