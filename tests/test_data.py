"""Datasets: every registered source, prepared files, client partitions.

Embedded datasets are tested for real (they ship in installed wheels); folder-backed ones on tiny
folders of PNGs written here; download-backed ones in test_download.py against a local server.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gradinv.data import (
    DATASETS,
    DatasetNotFoundError,
    PartitionSettings,
    RawSplits,
    dataset_settings,
    load_prepared,
    partition_indices,
    prepare_dataset,
    read_partition,
    write_partition,
)
from gradinv.data.patches import PHOTOS, load_photo, photo_path
from gradinv.io import CorruptFileError, sha256_file
from gradinv.settings import ConfigError, from_mapping, settings_schema

EMBEDDED = [n for n in DATASETS if DATASETS.get(n).kind == "embedded"]
# Small but real settings, so the whole file stays fast; a new embedded dataset runs on defaults.
SMALL: dict[str, dict] = {"patches": {"train_per_class": 12, "val_per_class": 4}}


@cache
def load(name: str, seed: int = 0) -> RawSplits:
    return DATASETS.get(name).load(dataset_settings(name, SMALL.get(name)), Path("unused"), seed)


# --- every registered dataset ------------------------------------------------------------------


@pytest.mark.parametrize("name", DATASETS.available())
def test_dataset_declares_its_interface(name):
    cls = DATASETS.get(name)
    assert isinstance(cls.paper_name, str) and cls.paper_name
    assert cls.kind in ("embedded", "download", "folder")
    assert cls.downloads is (cls.kind == "download")
    assert dataclasses.is_dataclass(cls.Settings)
    s = cls.Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.image_size = 1
    assert s.image_size >= 8
    schema = settings_schema(cls.Settings)
    assert schema["additionalProperties"] is False
    with pytest.raises(ConfigError, match=rf"data\.sources\.{name}\.imagesize: unknown key"):
        dataset_settings(name, {"imagesize": 32})


def test_registry_lists_the_expected_datasets():
    expected = {"patches", "digits", "cifar10", "cifar100", "mnist", "svhn", "imagenet", "ffhq"}
    assert expected <= set(DATASETS.available())


# --- embedded datasets ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", EMBEDDED)
def test_embedded_shapes_and_labels(name):
    raw = load(name)
    size = dataset_settings(name, SMALL.get(name)).image_size
    for images, labels in ((raw.train_images, raw.train_labels), (raw.val_images, raw.val_labels)):
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert images.ndim == 4 and images.shape[1] in (1, 3)
        assert tuple(images.shape[2:]) == (size, size)
        assert labels.shape == (images.shape[0],) and images.shape[0] > 0
        assert labels.min() >= 0 and labels.max() < len(raw.classes)
    assert set(raw.train_labels.tolist()) == set(range(len(raw.classes)))
    assert len(raw.classes) >= 10
    assert raw.source


@pytest.mark.parametrize("name", EMBEDDED)
def test_embedded_is_deterministic_in_the_seed(name):
    a, b, c = (
        load(name, 0),
        DATASETS.get(name).load(dataset_settings(name, SMALL.get(name)), Path("unused"), 0),
        load(name, 1),
    )
    for key in ("train_images", "train_labels", "val_images", "val_labels"):
        assert torch.equal(getattr(a, key), getattr(b, key))
    assert not torch.equal(a.train_images, c.train_images)


def test_patches_are_ten_or_more_rgb_photo_classes():
    raw = load("patches")
    assert raw.train_images.shape[1] == 3 and len(raw.classes) >= 10
    assert not {"colorwheel", "chessboard", "logo", "horse", "phantom"} & set(raw.classes)
    for name in PHOTOS:  # read from the wheel itself: nothing is ever fetched
        assert photo_path(name).is_file()


def test_patch_validation_boxes_never_touch_train_boxes():
    raw = load("patches")
    gap = dataset_settings("patches", None).gap
    tb, vb = raw.train_boxes.numpy(), raw.val_boxes.numpy()
    assert tb.shape == (len(raw.train_labels), 5) and vb.shape == (len(raw.val_labels), 5)
    assert (tb[:, 0] == raw.train_labels.numpy()).all()
    for photo in np.unique(tb[:, 0]):
        t, v = tb[tb[:, 0] == photo][:, None, 1:], vb[vb[:, 0] == photo][None, :, 1:]
        # Boxes (top, left, h, w) are separated by >= gap on the rows or on the columns.
        rows_apart = (t[..., 0] + t[..., 2] + gap <= v[..., 0]) | (
            v[..., 0] + v[..., 2] + gap <= t[..., 0]
        )
        cols_apart = (t[..., 1] + t[..., 3] + gap <= v[..., 1]) | (
            v[..., 1] + v[..., 3] + gap <= t[..., 1]
        )
        assert (rows_apart | cols_apart).all(), f"photo {raw.classes[photo]} overlaps"


def test_patch_boxes_say_where_each_patch_was_cut():
    raw, s = load("patches"), dataset_settings("patches", SMALL["patches"])
    for i in (0, len(raw.val_labels) - 1):
        label, top, left, h, w = raw.val_boxes[i].tolist()
        photo = load_photo(raw.classes[label], s.source_side)
        expected = torch.from_numpy(photo[top : top + h, left : left + w]).permute(2, 0, 1)
        assert torch.equal(raw.val_images[i], expected)


def test_patch_settings_are_checked():
    with pytest.raises(ConfigError, match="unknown photo 'lena'"):
        dataset_settings("patches", {"photos": ["astronaut", "lena"]})
    with pytest.raises(ConfigError, match=r"data\.sources\.patches\.val_fraction"):
        dataset_settings("patches", {"val_fraction": 1.5})
    s = dataset_settings("patches", {"photos": ["coins", "camera"], "val_per_class": 10**6})
    with pytest.raises(ConfigError, match="distinct patch positions"):
        DATASETS.get("patches").load(s, Path("unused"), 0)


# --- prepared files ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", EMBEDDED)
def test_prepare_and_load_round_trip(name, tmp_path):
    path = prepare_dataset(name, SMALL.get(name), tmp_path / "raw", tmp_path / "prep", seed=0)
    assert path == tmp_path / "prep" / f"{name}.pt"
    manifest = json.loads((tmp_path / "prep" / f"{name}.json").read_text())
    assert manifest["sha256"] == sha256_file(path)
    assert manifest["dataset"] == name and manifest["seed"] == 0
    d = load_prepared(name, tmp_path / "prep")
    raw = load(name)
    assert torch.equal(d.train_images, raw.train_images) and torch.equal(
        d.val_labels, raw.val_labels
    )
    assert d.classes == raw.classes and d.num_classes == len(raw.classes)
    assert d.image_shape == tuple(raw.train_images.shape[1:]) == tuple(manifest["image_shape"])
    assert manifest["num_train"] == len(d.train_labels) and d.sha256 == manifest["sha256"]
    assert d.paper_name == DATASETS.get(name).paper_name
    x = raw.train_images.double() / 255
    assert np.allclose(d.mean, x.mean(dim=(0, 2, 3))) and np.allclose(
        d.std, x.std(dim=(0, 2, 3)), rtol=1e-3
    )
    images, labels = d.val_batch([0, 2])
    assert images.dtype == torch.float32 and images.min() >= 0 and images.max() <= 1
    assert torch.equal(labels, raw.val_labels[[0, 2]])
    images, labels = d.train_subset(torch.tensor([1]))
    assert images.shape == (1, *d.image_shape)
    with pytest.raises(IndexError, match="validation indices"):
        d.val_batch([len(d.val_labels)])


@pytest.fixture
def prepared_digits(tmp_path) -> Path:
    prepare_dataset("digits", {}, tmp_path / "raw", tmp_path / "prep", seed=0)
    return tmp_path / "prep"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _flip_byte])
def test_corrupted_prepared_file_is_rejected(prepared_digits, damage):
    path = prepared_digits / "digits.pt"
    damage(path)
    with pytest.raises(CorruptFileError) as err:
        load_prepared("digits", prepared_digits)
    assert str(path) in str(err.value)
    assert "snakemake data/prepared/digits.pt --cores 1 --forcerun prepare_data" in str(err.value)


def test_missing_manifest_names_the_fix(prepared_digits):
    (prepared_digits / "digits.json").unlink()
    with pytest.raises(FileNotFoundError, match="--forcerun prepare_data"):
        load_prepared("digits", prepared_digits)


def test_unknown_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(KeyError, match="Did you mean 'digits'"):
        prepare_dataset("digit", {}, tmp_path, tmp_path, seed=0)


# --- partitions ----------------------------------------------------------------------------------

LABELS = np.repeat(np.arange(10), 60)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_partition_puts_every_sample_in_exactly_one_client(scheme):
    parts = partition_indices(LABELS, scheme, num_clients=8, seed=0)
    assert len(parts) == 8 and all(parts)
    assert sorted(i for p in parts for i in p) == list(range(len(LABELS)))
    assert parts == partition_indices(torch.as_tensor(LABELS), scheme, num_clients=8, seed=0)
    assert parts != partition_indices(LABELS, scheme, num_clients=8, seed=1)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_shards_give_at_most_k_labels_per_client(k):
    parts = partition_indices(LABELS, "shards", num_clients=10, seed=3, labels_per_client=k)
    assert max(len(set(LABELS[p])) for p in parts) <= k


def test_dirichlet_with_small_alpha_is_skewed():
    def dominant_share(parts):
        return np.mean([np.bincount(LABELS[p]).max() / len(p) for p in parts])

    skewed = partition_indices(LABELS, "dirichlet", num_clients=10, seed=0, alpha=0.05)
    even = partition_indices(LABELS, "iid", num_clients=10, seed=0)
    assert dominant_share(skewed) > 0.6 > 0.3 > dominant_share(even)


def test_partition_rejects_impossible_requests():
    with pytest.raises(ValueError, match="num_clients"):
        partition_indices(LABELS[:5], "iid", num_clients=6, seed=0)
    with pytest.raises(ValueError, match="number of labels"):
        partition_indices(LABELS, "shards", num_clients=2, seed=0, labels_per_client=2)


def test_partition_file_round_trip(tmp_path):
    parts = partition_indices(LABELS, "dirichlet", num_clients=4, seed=0)
    path = tmp_path / "p" / "part.json"
    write_partition(path, parts, {"scheme": "dirichlet", "seed": 0})
    assert read_partition(path, len(LABELS)) == (parts, {"scheme": "dirichlet", "seed": 0})
    parts[1].append(parts[0][0])  # a sample in two clients (an edit fails the digest first)
    write_partition(path, parts, {"scheme": "dirichlet", "seed": 0})
    with pytest.raises(CorruptFileError, match="inconsistent"):
        read_partition(path, len(LABELS))


def test_partition_settings_are_checked():
    s = from_mapping(PartitionSettings, {"scheme": "shards", "num_clients": 5}, "partition")
    fields = {k: v for k, v in dataclasses.asdict(s).items() if k != "public_fraction"}
    assert partition_indices(LABELS, seed=0, **fields)
    with pytest.raises(ConfigError, match=r"partition\.scheme"):
        from_mapping(PartitionSettings, {"scheme": "powerlaw"}, "partition")
    with pytest.raises(ConfigError, match=r"partition\.alpha"):
        from_mapping(PartitionSettings, {"alpha": 0}, "partition")


# --- folder-backed datasets ----------------------------------------------------------------------

COLOURS = [(220, 30, 30), (30, 220, 30), (30, 30, 220)]


def _png(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (24, 18)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def _image_folder(root: Path, per_class: int = 5) -> None:
    for c, wnid in enumerate(["n0002", "n0001", "n0003"]):  # sorted order: n0001, n0002, n0003
        for i in range(per_class):
            _png(root / wnid / f"ILSVRC2012_val_{c}{i:03d}.JPEG", COLOURS[c], (20 + i, 16))


def _colour_index(images: torch.Tensor) -> list[int]:
    return images.float().mean(dim=(2, 3)).argmax(dim=1).tolist()


def test_imagenet_missing_folder_names_the_key(tmp_path):
    s = dataset_settings("imagenet", {"root": str(tmp_path / "nowhere")})
    with pytest.raises(DatasetNotFoundError) as err:
        DATASETS.get("imagenet").load(s, tmp_path, 0)
    assert "data.sources.imagenet.root" in str(err.value) and "nowhere" in str(err.value)
    assert "one sub-folder per class" in str(err.value)
    assert isinstance(err.value, FileNotFoundError)


def test_imagenet_incomplete_folder_is_an_error(tmp_path):
    _image_folder(tmp_path / "val")
    (tmp_path / "val" / "n0004").mkdir()
    s = dataset_settings("imagenet", {"root": str(tmp_path / "val")})
    with pytest.raises(DatasetNotFoundError, match="n0004"):
        DATASETS.get("imagenet").load(s, tmp_path, 0)


def test_imagenet_folder_loader(tmp_path):
    _image_folder(tmp_path / "val")
    s = dataset_settings(
        "imagenet", {"root": str(tmp_path / "val"), "image_size": 16, "val_fraction": 0.4}
    )
    raw = DATASETS.get("imagenet").load(s, tmp_path, 0)
    assert raw.classes == ("n0001", "n0002", "n0003")
    assert raw.train_images.shape == (9, 3, 16, 16) and raw.val_images.shape == (6, 3, 16, 16)
    # Class index is the sorted folder order: n0001 holds the green images.
    colour_of_class = {0: 1, 1: 0, 2: 2}
    for images, labels in ((raw.train_images, raw.train_labels), (raw.val_images, raw.val_labels)):
        assert _colour_index(images) == [colour_of_class[y] for y in labels.tolist()]
    _image_folder(tmp_path / "train", per_class=2)
    s = dataclasses.replace(s, train_root=str(tmp_path / "train"))
    raw = DATASETS.get("imagenet").load(s, tmp_path, 0)
    assert len(raw.train_labels) == 6 and len(raw.val_labels) == 15


def test_raw_folders_are_the_projects_and_the_prepared_file_the_runs(tmp_path, monkeypatch):
    """A run in its own folder (an overlay's run_dir, the job's working directory) reads the raw
    data params.yaml names from the project's folder and writes the prepared file into its own."""
    from gradinv.stages.prepare import prepare

    project, run = tmp_path / "project", tmp_path / "project" / "runs" / "paper"
    _image_folder(project / "data/raw/imagenet/val")
    run.mkdir(parents=True)
    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(project))
    monkeypatch.chdir(run)
    source = {"root": "data/raw/imagenet/val", "image_size": 16, "val_fraction": 0.4}
    settings = {"dataset": "imagenet", "settings": source, "seed": 0}
    prepare(settings, Path("data/raw"), Path("data/prepared/imagenet.pt"))
    manifest = json.loads((run / "data/prepared/imagenet.json").read_text())
    assert manifest["num_train"] + manifest["num_val"] == 15
    assert manifest["settings"]["root"] == "data/raw/imagenet/val"  # as params.yaml names it
    assert not (project / "data/prepared").exists()


def test_ffhq_missing_folders_name_the_keys(tmp_path):
    s = dataset_settings("ffhq", {"root": str(tmp_path / "none"), "labels": str(tmp_path)})
    with pytest.raises(DatasetNotFoundError, match=r"data\.sources\.ffhq\.root"):
        DATASETS.get("ffhq").load(s, tmp_path, 0)
    _png(tmp_path / "img" / "00000.png", COLOURS[0])
    s = dataset_settings("ffhq", {"root": str(tmp_path / "img"), "labels": str(tmp_path / "json")})
    with pytest.raises(DatasetNotFoundError, match=r"data\.sources\.ffhq\.labels"):
        DATASETS.get("ffhq").load(s, tmp_path, 0)


AGES = [3, 15, 27, 31, 44, 58, 62, 77, 85, 96, 23, 33]


def _ffhq_images(root: Path) -> None:
    for i, _ in enumerate(AGES):
        _png(root / "00000" / f"{i:05d}.png", COLOURS[i % 3], (32, 32))


def test_ffhq_with_feature_jsons(tmp_path):
    _ffhq_images(tmp_path / "img")
    for i, age in enumerate(AGES):
        face = [{"faceId": "x", "faceAttributes": {"age": float(age), "gender": "female"}}]
        (tmp_path / "json").mkdir(exist_ok=True)
        (tmp_path / "json" / f"{i:05d}.json").write_text(json.dumps(face))
    (tmp_path / "json" / "00011.json").write_text("[]")  # the Face API found no face
    s = dataset_settings(
        "ffhq",
        {
            "root": str(tmp_path / "img"),
            "labels": str(tmp_path / "json"),
            "image_size": 16,
            "val_fraction": 0.25,
        },
    )
    with pytest.warns(UserWarning, match="1 of 12 images have no age label"):
        raw = DATASETS.get("ffhq").load(s, tmp_path, 0)
    assert len(raw.classes) == 10 and raw.classes[-1] == "90+"
    labels = sorted(raw.train_labels.tolist() + raw.val_labels.tolist())
    assert labels == sorted(min(a // 10, 9) for a in AGES[:11])
    assert raw.train_images.shape[1:] == (3, 16, 16)


def test_ffhq_with_csv(tmp_path):
    _ffhq_images(tmp_path / "img")
    rows = "\n".join(f"{i:05d}.png,{age}" for i, age in enumerate(AGES))
    (tmp_path / "ages.csv").write_text(f"image,age\n{rows}\n")
    s = dataset_settings(
        "ffhq",
        {"root": str(tmp_path / "img"), "labels": str(tmp_path / "ages.csv"), "image_size": 8},
    )
    raw = DATASETS.get("ffhq").load(s, tmp_path, 0)
    assert len(raw.train_labels) + len(raw.val_labels) == len(AGES)
    assert 9 in raw.train_labels.tolist() + raw.val_labels.tolist()  # age 96 -> "90+"
    (tmp_path / "ages.csv").write_text("image,age\n00000.png,old\n")
    with pytest.raises(CorruptFileError, match="line 2"):
        DATASETS.get("ffhq").load(s, tmp_path, 0)
