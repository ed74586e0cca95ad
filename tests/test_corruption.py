"""Corrupted inputs: a truncated or altered dataset, checkpoint, capture or metrics file is
rejected with a message naming the file and the command that regenerates it."""

import pytest
import torch

from gradinv.io import FORMAT, CorruptFileError, content_digest, load_tensors, save_tensors
from stages import Stages, in_project


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One victim's whole chain (prepare .. score), in a folder the tests copy from."""
    root = tmp_path_factory.mktemp("chain")
    with in_project(root):
        Stages(root).all()
    return root


@pytest.fixture
def chain(finished, tmp_path, monkeypatch):
    import shutil

    root = tmp_path / "chain"
    shutil.copytree(finished, root)
    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(root))
    monkeypatch.setenv("GRADINV_TRACKING", "off")
    return Stages(root)


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def alter(path):
    """Change one value inside the payload but keep the file well-formed (a silent edit)."""
    saved = torch.load(path, weights_only=True)
    tensors = [(k, v) for k, v in _walk(saved["payload"]) if isinstance(v, torch.Tensor)]
    _, tensor = max(tensors, key=lambda kv: kv[1].numel())
    tensor.view(-1)[0] += 1
    torch.save(saved, path)  # the stored digest still describes the original


def _walk(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{prefix}[{i}]")
    else:
        yield prefix, obj


@pytest.mark.parametrize("damage", [truncate, alter], ids=["truncated", "altered"])
@pytest.mark.parametrize(
    ("file", "step"),
    [
        ("prepared", "partition_data"),  # the prepared dataset, read by every data stage
        ("captured_checkpoint", "capture_update"),
        ("victim", "capture_update"),
        ("capture", "run_attack"),
        ("attack", "score"),
    ],
)
def test_a_damaged_file_is_rejected_by_name_with_the_fix(chain, capsys, damage, file, step):
    path = getattr(chain, file)
    damage(path)
    assert getattr(chain, step)() == 3
    err = capsys.readouterr().err
    assert str(path) in err
    assert "Regenerate it with:" in err and "snakemake" in err


def test_the_regenerate_command_names_the_file(chain, capsys):
    truncate(chain.capture)
    chain.run_attack()
    err = capsys.readouterr().err
    assert f"rm -f {chain.capture} && snakemake {chain.capture}" in err


def test_a_truncated_metrics_file_stops_the_table_by_name(chain):
    from gradinv.tables import collect

    truncate(chain.scores)
    with pytest.raises(CorruptFileError) as err:
        collect([chain.scores])
    assert f"{chain.scores}: not valid JSON" in str(err.value)
    assert f"Regenerate it with: rm -f {chain.scores}" in str(err.value)


def test_a_changed_payload_fails_the_stored_digest(tmp_path):
    path = tmp_path / "x.pt"
    save_tensors(path, {"w": torch.ones(3), "round": 2})
    torch.save(
        {
            "format": FORMAT,
            "sha256": content_digest({"w": torch.ones(3), "round": 2}),
            "payload": {"w": torch.ones(3), "round": 3},
        },
        path,
    )
    with pytest.raises(CorruptFileError, match="does not match the sha256 stored with it"):
        load_tensors(path)


def test_a_foreign_tensor_file_is_not_taken_for_ours(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"w": torch.ones(3)}, path)
    with pytest.raises(CorruptFileError, match="not a gradinv tensor file"):
        load_tensors(path)


def test_the_digest_sees_every_value():
    base = {"a": torch.zeros(2, 2), "b": [1, "x"], "c": {"d": 0.5}}
    assert content_digest(base) == content_digest(
        {"a": torch.zeros(2, 2), "b": [1, "x"], "c": {"d": 0.5}}
    )
    for changed in (
        {**base, "a": torch.zeros(4)},  # same bytes, other shape
        {**base, "a": torch.zeros(2, 2, dtype=torch.float64)},
        {**base, "b": [1, "y"]},
        {**base, "c": {"d": 0.25}},
    ):
        assert content_digest(changed) != content_digest(base)
