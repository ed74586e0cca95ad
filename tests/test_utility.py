"""The utility table: each defense's final accuracy beside training without a defense."""

import pandas as pd

from gradinv.stages.utility import run, utility_table

SETTINGS = {
    "scale": "embedded",
    "seed": 0,
    "partition": {"scheme": "iid"},
    "fl": {"rounds": 4, "eval_every": 1},
    "utility": {
        "title": "Utility",
        "dataset": "patches",
        "model": "cnn3",
        "scaled_down_note": "small",
        "defenses": ["none", "dp_sgd", "noise"],
        "average_last": 2,
    },
    "defenses": {  # as job_settings writes them: canonical JSON, keys sorted
        "dp_sgd": {"kind": "dp_sgd", "label": "DP-SGD", "clip": 1.0, "noise_multiplier": 1.0},
        "noise": {"kind": "gaussian_noise", "label": "Noise", "std": 0.1},
        "none": {"kind": "none", "label": "No Defense"},
    },
}


def summary(defense, accuracies, status="ok", privacy=None):
    history = [{"round": 0, "test_accuracy": 0.1}]
    history += [{"round": r + 1, "test_accuracy": a} for r, a in enumerate(accuracies)]
    return {
        "defense": defense,
        "status": status,
        "failure": None if status == "ok" else "non-finite training loss at round 2",
        "history": history,
        "seconds": 8.0,
        "privacy": privacy,
        "git_commit": "abc",
    }


def test_each_defense_is_relative_to_no_defense_and_a_failed_run_keeps_its_row():
    runs = [
        summary("noise", [0.2, 0.3], status="failed"),
        summary("dp_sgd", [0.2, 0.25, 0.3, 0.5], privacy={"epsilon": 3.5}),  # last two: 40%
        summary("none", [0.3, 0.5, 0.7, 0.9]),  # last two: 80%
    ]
    table = utility_table(runs, SETTINGS).set_index("defense")
    assert list(table.index) == ["none", "dp_sgd", "noise"]  # the study's order
    assert table.loc["none", "relative_accuracy"] == 1.0
    assert abs(table.loc["dp_sgd", "accuracy"] - 40.0) < 1e-9
    assert abs(table.loc["dp_sgd", "relative_accuracy"] - 0.5) < 1e-9
    assert abs(table.loc["dp_sgd", "difference"] + 40.0) < 1e-9
    # the spread is the sample std of the same two evaluations, 30% and 50%, in points
    assert abs(table.loc["dp_sgd", "accuracy_spread"] - 14.142136) < 1e-5
    assert pd.isna(table.loc["noise", "accuracy_spread"])
    assert table.loc["dp_sgd", "epsilon"] == 3.5 and pd.isna(table.loc["none", "epsilon"])
    assert table.loc["dp_sgd", "setting"] == "clip=1.0, noise_multiplier=1.0"
    assert table.loc["dp_sgd", "seconds_per_round"] == 2.0
    assert pd.isna(table.loc["noise", "accuracy"]) and "non-finite" in table.loc["noise", "failure"]


def test_the_report_writes_the_csv_and_a_labelled_markdown(tmp_path):
    import json

    paths = []
    for name, acc in (("none", [0.5, 0.5]), ("dp_sgd", [0.25, 0.25])):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(summary(name, acc)))
        paths.append(path)
    run(SETTINGS, paths, tmp_path)
    assert list(pd.read_csv(tmp_path / "utility.csv")["defense"]) == ["none", "dp_sgd"]
    md = (tmp_path / "utility.md").read_text()
    assert (
        "SCALED-DOWN" in md
        and "| DP-SGD | clip=1.0, noise_multiplier=1.0 | 25.00 ± 0.00 | 0.500" in md
    )
