"""Corrupted inputs: a truncated or altered dataset, checkpoint, capture or metrics file is
rejected with a message naming the file and the command that regenerates it."""

import json

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


# ----------------------------------------------------------------------------------------------
# JSON result files carry a sha256 of their content (issue 31): an edited value is refused


def edit_json(path, change):
    """Change a value of a JSON file and keep it valid JSON (the stored digest is left as is)."""
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def test_an_edited_metrics_value_stops_the_table_by_name(chain):
    from gradinv.tables import collect

    assert collect([chain.scores])["psnr"].tolist() != [55.93]
    edit_json(chain.scores, lambda d: d["runs"][0].update(psnr=55.93))
    with pytest.raises(CorruptFileError) as err:  # before: a table cell of 55.93, silently
        collect([chain.scores])
    assert f"{chain.scores} is corrupted: its content does not match the sha256" in str(err.value)
    assert f"Regenerate it with: rm -f {chain.scores} && snakemake {chain.scores}" in str(err.value)


def test_an_edited_partition_stops_the_training_by_name(chain, capsys):
    def move_one_image(data):  # still disjoint, still the same clients: only the digest knows
        data["clients"][0].append(data["clients"][1].pop())

    edit_json(chain.partition, move_one_image)
    assert chain.train() == 3  # before: 0, trained on the edited split
    err = capsys.readouterr().err
    assert f"{chain.partition} is corrupted" in err
    assert f"Regenerate it with: rm -f {chain.partition} && snakemake {chain.partition}" in err


def test_an_edited_training_summary_stops_the_utility_table_by_name(chain, tmp_path):
    from gradinv.jobs import job_settings
    from gradinv.stages import utility

    settings = json.loads(job_settings(chain.config, "utility_report"))
    utility.run(settings, [chain.summary], tmp_path)  # the untouched summary makes a table
    edit_json(chain.summary, lambda d: d["history"][-1].update(test_accuracy=0.99))
    with pytest.raises(CorruptFileError) as err:
        utility.run(settings, [chain.summary], tmp_path)
    assert f"{chain.summary} is corrupted" in str(err.value)
    assert f"rm -f {chain.summary} && snakemake {chain.summary}" in str(err.value)


@pytest.mark.parametrize(
    ("index", "why"),
    [(-1, "outside the train split"), (10**6, "outside the train split")],
    ids=["negative", "past-the-end"],
)
def test_a_partition_index_outside_the_split_is_bad_input(chain, capsys, index, why):
    """Written with a valid digest (a bug, or a file made for another dataset): -1 would alias
    the last train image, one of the attacker's public split; 10**6 would fail mid-training."""
    from gradinv.data.partition import write_partition
    from gradinv.io import read_json

    data = read_json(chain.partition)
    data["clients"][1][0] = index
    write_partition(chain.partition, data["clients"], data["meta"], data["public"])
    assert chain.train() == 3  # before: 0 (negative) or an IndexError traceback
    err = capsys.readouterr().err
    assert f"{chain.partition}: client 1 holds index {index}, {why}" in err
    assert f"Regenerate it with: rm -f {chain.partition}" in err


def test_the_regenerate_command_repeats_the_pipelines_options(chain, capsys, monkeypatch):
    options = "--configfile workflow/configs/paper.yaml 'my extra.yaml' --profile profiles/slurm"
    monkeypatch.setenv("GRADINV_SNAKEMAKE_OPTIONS", options)
    truncate(chain.capture)
    assert chain.run_attack() == 3
    err = capsys.readouterr().err
    # before: "... snakemake <capture> --cores 1", which rebuilds it at the default scale
    assert f"rm -f {chain.capture} && snakemake {chain.capture} --cores 1 {options}" in err
