"""The utility table: each defense's accuracy over its seeds beside training without a defense,
paired seed by seed."""

import pandas as pd
import pytest
from scipy import stats

from gradinv.io import write_json
from gradinv.stages.utility import run, run_table, training_metrics, utility_table

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
        "seeds": [0, 1, 2],
    },
    "defenses": {  # as job_settings writes them: canonical JSON, keys sorted
        "dp_sgd": {"kind": "dp_sgd", "label": "DP-SGD", "clip": 1.0, "noise_multiplier": 1.0},
        "noise": {"kind": "gaussian_noise", "label": "Noise", "std": 0.1},
        "none": {"kind": "none", "label": "No Defense"},
    },
}


def summary(defense, accuracies, seed=0, status="ok", privacy=None):
    history = [{"round": 0, "test_accuracy": 0.1}]
    history += [{"round": r + 1, "test_accuracy": a} for r, a in enumerate(accuracies)]
    return {
        "defense": defense,
        "dataset": "patches",
        "model": "cnn3",
        "seed": seed,
        "status": status,
        "failure": None if status == "ok" else "non-finite training loss at round 2",
        "history": history,
        "seconds": 8.0,
        "privacy": privacy,
        "git_commit": "abc",
    }


# the last two evaluations average to the accuracy: none 80/70/90%, dp_sgd 40/42/38%
RUNS = [
    summary("noise", [0.2, 0.3], seed=0, status="failed"),
    summary("noise", [0.5, 0.5, 0.6, 0.6], seed=1),
    summary("noise", [0.5, 0.5, 0.7, 0.7], seed=2),
    *(
        summary("dp_sgd", [0.2, 0.25, a - 0.1, a + 0.1], seed=s, privacy={"epsilon": 3.5})
        for s, a in enumerate((0.40, 0.42, 0.38))
    ),
    *(summary("none", [0.3, 0.5, a, a], seed=s) for s, a in enumerate((0.8, 0.7, 0.9))),
]


def test_each_run_is_a_line_and_each_defense_its_mean_over_the_seeds():
    runs = run_table(RUNS, SETTINGS)
    assert list(zip(runs["defense"], runs["seed"], strict=True)) == [
        (d, s) for d in ("none", "dp_sgd", "noise") for s in (0, 1, 2)
    ]
    assert runs.loc[3, "accuracy"] == pytest.approx(40.0)  # dp_sgd, seed 0
    assert runs.loc[3, "accuracy_spread"] == pytest.approx(14.142136)  # 30% and 50%, in points
    table = utility_table(RUNS, SETTINGS).set_index("defense")
    assert list(table.index) == ["none", "dp_sgd", "noise"]  # the study's order
    dp = table.loc["dp_sgd"]
    assert dp["accuracy"] == pytest.approx(40.0) and dp["seeds"] == 3
    ci = stats.ttest_1samp([40.0, 42.0, 38.0], 0).confidence_interval(0.95)
    assert (dp["accuracy_ci_low"], dp["accuracy_ci_high"]) == pytest.approx((ci.low, ci.high))
    # PMM: the ratio to no defense at the same seed, averaged over the seeds
    ratios = [40 / 80, 42 / 70, 38 / 90]
    assert dp["relative_accuracy"] == pytest.approx(sum(ratios) / 3)
    # the difference to no defense, paired by seed, with its paired t-interval
    paired = stats.ttest_rel([40.0, 42.0, 38.0], [80.0, 70.0, 90.0]).confidence_interval(0.95)
    assert dp["difference"] == pytest.approx(-40.0)
    assert (dp["difference_ci_low"], dp["difference_ci_high"]) == pytest.approx(
        (paired.low, paired.high)
    )
    assert dp["epsilon"] == 3.5 and pd.isna(table.loc["none", "epsilon"])
    assert dp["setting"] == "clip=1.0, noise_multiplier=1.0"
    assert dp["seconds_per_round"] == 2.0
    noise = table.loc["noise"]  # a failed seed keeps its line; the rest average without it
    assert noise["seeds"] == 2 and noise["failed_seeds"] == 1
    assert noise["accuracy"] == pytest.approx(65.0) and "seed 0: non-finite" in noise["failure"]
    assert noise["status"] == "1 of 3 seeds failed"


def test_the_tables_accuracy_and_pmm_come_seed_by_seed():
    values = training_metrics(RUNS, last=2)
    accuracy, why = values["accuracy"][("patches", "cnn3", "dp_sgd")]
    assert accuracy == pytest.approx({0: 40.0, 1: 42.0, 2: 38.0}) and why == ""
    pmm, _ = values["pmm"][("patches", "cnn3", "dp_sgd")]
    assert pmm == pytest.approx({0: 40 / 80, 1: 42 / 70, 2: 38 / 90})
    noise, why = values["pmm"][("patches", "cnn3", "noise")]
    assert sorted(noise) == [1, 2] and "seed 0" in why  # the failed seed has no PMM, and why
    runs = run_table(RUNS, SETTINGS)  # and run by run, over no defense's at the same seed
    assert runs.set_index(["defense", "seed"]).loc[("dp_sgd", 1), "relative_accuracy"] == (
        pytest.approx(42 / 70)
    )


def test_the_report_writes_both_csvs_and_a_labelled_markdown(tmp_path):
    paths = []
    for i, s in enumerate(RUNS):
        path = tmp_path / f"{i}.json"
        write_json(path, s)  # as the train stage writes it: with its digest
        paths.append(path)
    run(SETTINGS, paths, tmp_path)
    assert list(pd.read_csv(tmp_path / "utility.csv")["defense"]) == ["none", "dp_sgd", "noise"]
    assert len(pd.read_csv(tmp_path / "utility_runs.csv")) == 9
    md = (tmp_path / "utility.md").read_text()
    assert "SCALED-DOWN" in md and "over the seeds 0, 1, 2" in md
    assert "| DP-SGD | clip=1.0, noise_multiplier=1.0 | 40.00 [" in md
    assert "| 2 (1 failed) |" in md


def test_a_seed_without_its_run_without_defense_is_a_failed_pmm_not_a_silent_gap():
    """No defense failed at seed 2, the noise defense finished all three: the noise PMM rests on
    two seeds, and both the tables' PMM and the utility table say so instead of shrinking n."""
    runs = [
        *(summary("noise", [0.5, a], seed=s) for s, a in enumerate((0.6, 0.5, 0.7))),
        *(summary("none", [0.5, a], seed=s) for s, a in enumerate((0.8, 0.7))),
        summary("none", [0.2, 0.3], seed=2, status="failed"),
    ]
    pmm, why = training_metrics(runs, last=1)["pmm"][("patches", "cnn3", "noise")]
    assert sorted(pmm) == [0, 1]
    assert why == "training without defense did not finish (seed 2): no PMM at this seed"
    settings = {**SETTINGS, "utility": {**SETTINGS["utility"], "defenses": ["none", "noise"]}}
    noise = utility_table(runs, settings).set_index("defense").loc["noise"]
    assert (noise["seeds"], noise["failed_seeds"], noise["paired_seeds"]) == (3, 0, 2)
