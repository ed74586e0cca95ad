"""Result files that cannot change without notice (issue 31): JSON results carry a sha256 of
their content, partition indices must fit the split they index, and every "Regenerate it with"
command repeats the options the pipeline was started with."""

import json
import math

import pytest

from gradinv.data.partition import PartitionFileError, read_partition, read_public, write_partition
from gradinv.io import (
    JSON_DIGEST,
    CorruptFileError,
    read_json,
    regenerate_hint,
    snakemake_command,
    write_json,
)

OPTIONS = "--configfile workflow/configs/paper.yaml 'my extra.yaml' --profile profiles/slurm"


@pytest.fixture
def no_options(monkeypatch):
    monkeypatch.delenv("GRADINV_SNAKEMAKE_OPTIONS", raising=False)


# ----------------------------------------------------------------------------------------------
# JSON result files


def test_a_json_result_reads_back_as_written_and_stays_readable(tmp_path):
    path = tmp_path / "metrics.json"
    record = {"runs": [{"psnr": math.inf, "ssim": None, "shape": (3, 8, 8)}], "round": 2}
    write_json(path, record)
    assert read_json(path) == {
        "runs": [{"psnr": math.inf, "ssim": None, "shape": [3, 8, 8]}],
        "round": 2,
    }
    on_disk = json.loads(path.read_text())  # plain JSON: one more top-level field
    assert set(on_disk) == {"runs", "round", JSON_DIGEST}
    path.write_text(json.dumps(on_disk))  # re-indented (jq, an editor): the values are the same
    assert read_json(path)["round"] == 2


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["runs"][0].update(psnr=55.93),  # a number
        lambda d: d["runs"].append({"psnr": 1.0}),  # a record more
        lambda d: d.update(extra=True),  # a field more
        lambda d: d.pop("round"),  # a field less
    ],
    ids=["value", "record", "field-added", "field-removed"],
)
def test_an_edited_json_result_is_refused_by_name(tmp_path, no_options, change):
    path = tmp_path / "v1.json"
    write_json(path, {"runs": [{"psnr": 9.75}], "round": 2})
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptFileError) as err:
        read_json(path)
    assert str(err.value) == (
        f"{path} is corrupted: its content does not match the sha256 stored with it (a value "
        f"was changed after it was written). Regenerate it with: rm -f {path} && "
        f"snakemake {path} --cores 1"
    )


def test_a_json_result_without_a_digest_is_not_taken_as_verified(tmp_path):
    """A file written before results were checksummed (or by hand) is refused, with the fix."""
    from gradinv.tables import collect

    legacy = tmp_path / "v1.json"
    legacy.write_text(json.dumps({"runs": [{"psnr": 55.93}]}))
    for read in (read_json, lambda p: collect([p])):
        with pytest.raises(CorruptFileError, match=f"{legacy} carries no {JSON_DIGEST}"):
            read(legacy)
    legacy.write_text("[1, 2]")  # not even an object
    with pytest.raises(CorruptFileError, match=f"Regenerate it with: rm -f {legacy}"):
        read_json(legacy)


def test_a_missing_json_result_names_the_command_that_makes_it(tmp_path, no_options):
    with pytest.raises(FileNotFoundError, match=r"x\.json does not exist\. Regenerate it with"):
        read_json(tmp_path / "x.json")


def test_the_digest_field_is_the_files_own(tmp_path):
    with pytest.raises(ValueError, match=JSON_DIGEST):
        write_json(tmp_path / "x.json", {JSON_DIGEST: "mine"})
    with pytest.raises(TypeError, match="holds an object"):
        write_json(tmp_path / "x.json", [1, 2])


# ----------------------------------------------------------------------------------------------
# Partition files against the split they index

PARTS = [[0, 2, 4], [1, 3]]
META = {"scheme": "iid", "seed": 0}


def written(tmp_path, parts, public=(5,)):
    path = tmp_path / "partition.json"
    write_partition(path, parts, META, public=public)
    return path


def test_a_fitting_partition_reads_back(tmp_path):
    path = written(tmp_path, PARTS)
    assert read_partition(path, 6) == (PARTS, META)
    assert read_public(path, 6) == [5]


@pytest.mark.parametrize(
    ("parts", "public", "message"),
    [
        ([[0, 2, 4], [-1, 3]], (5,), "client 1 holds index -1, outside the train split of 6"),
        ([[0, 2, 4], [1, 6]], (5,), "client 1 holds index 6, outside the train split of 6"),
        ([[0, 2, 4], [1, 3]], (9,), "public holds index 9, outside the train split of 6"),
        ([[0, 2, 2], [1, 3]], (5,), "train image 2 is held by both client 0 and client 0"),
        ([[0, 2, 4], [1, 4]], (5,), "train image 4 is held by both client 0 and client 1"),
        ([[0, 2, 4], [1, 3]], (3,), "train image 3 is held by both client 1 and public"),
        ([[0, 2, 4], [1, 3.5]], (5,), "client 1 holds 3.5, not an integer index"),
        ([[0, 2, 4], [1, "3"]], (5,), "client 1 holds '3', not an integer index"),
        ([[0, 2, True], [1, 3]], (5,), "client 0 holds True, not an integer index"),
    ],
    ids=[
        "negative",
        "past-the-end",
        "public-past-the-end",
        "twice-in-a-client",
        "two-clients",
        "client-and-public",
        "float",
        "string",
        "bool",
    ],
)
def test_a_partition_that_does_not_fit_its_split_is_bad_input(
    tmp_path, no_options, parts, public, message
):
    """Written with a valid digest, so only the index checks can tell (before: -1 aliased the
    last train image, one of the attacker's public split; 6 failed mid-training)."""
    path = tmp_path / "partition.json"
    write_json(
        path,
        {"meta": META, "num_clients": 2, "num_samples": 5, "clients": parts, "public": public},
    )
    with pytest.raises(PartitionFileError) as err:
        read_partition(path, 6)
    assert str(err.value).startswith(f"{path}")
    assert message in str(err.value)
    assert str(err.value).endswith(
        f"Regenerate it with: rm -f {path} && snakemake {path} --cores 1"
    )
    assert isinstance(err.value, CorruptFileError | ValueError)  # the CLI: "bad input", exit 3


def test_a_partition_of_the_wrong_client_count_is_refused(tmp_path):
    path = tmp_path / "partition.json"
    write_json(path, {"meta": META, "num_clients": 3, "clients": PARTS, "public": []})
    with pytest.raises(PartitionFileError, match="inconsistent: num_clients is 3"):
        read_partition(path, 6)


# ----------------------------------------------------------------------------------------------
# The regenerate command repeats the pipeline's options


def test_the_snakemake_command_without_options(no_options):
    assert snakemake_command("results/x.json") == "snakemake results/x.json --cores 1"
    assert snakemake_command("results/a b.json") == "snakemake 'results/a b.json' --cores 1"
    assert regenerate_hint("results/x.json") == (
        " Regenerate it with: rm -f results/x.json && snakemake results/x.json --cores 1"
    )


def test_the_snakemake_command_repeats_the_overlays(monkeypatch):
    monkeypatch.setenv("GRADINV_SNAKEMAKE_OPTIONS", f"  {OPTIONS} ")
    assert snakemake_command("results/x.json") == f"snakemake results/x.json --cores 1 {OPTIONS}"
    assert regenerate_hint("results/x.json") == (
        f" Regenerate it with: rm -f results/x.json && snakemake results/x.json --cores 1 {OPTIONS}"
    )
    monkeypatch.setenv("GRADINV_SNAKEMAKE_OPTIONS", "")
    assert snakemake_command("results/x.json") == "snakemake results/x.json --cores 1"


def test_every_regenerate_command_repeats_the_overlays(tmp_path, monkeypatch):
    """The prepared data's, the evaluation network's and a trained generator's, not only the
    default one (before: each dropped the overlays and rebuilt at the default scale)."""
    from gradinv.data.prepared import load_prepared
    from gradinv.generators.base import verified_weights
    from gradinv.metrics.evaluation_network import load_evaluation_network, make_command

    monkeypatch.setenv("GRADINV_SNAKEMAKE_OPTIONS", OPTIONS)
    assert make_command("data/evalnet/cifar10.pt").endswith(f"--cores 1 {OPTIONS}")
    with pytest.raises(FileNotFoundError, match=f"--cores 1 {OPTIONS}"):
        load_evaluation_network(tmp_path / "evalnet" / "cifar10.pt")
    (tmp_path / "patches.json").write_text("{}")  # a manifest without a digest
    with pytest.raises(CorruptFileError) as err:
        load_prepared("patches", tmp_path)
    assert f"snakemake data/prepared/patches.pt --cores 1 {OPTIONS} --forcerun prepare_data" in str(
        err.value
    )
    with pytest.raises(Exception, match=f"--cores 1 {OPTIONS}"):
        verified_weights(tmp_path / "w.pt", "", "its publisher", "dcgan")
