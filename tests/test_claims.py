"""The claims checker: each relation, each expectation, the verdicts and the errors."""

import json
import math
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from gradinv.claims import Claim, ClaimError, evaluate, load_claims, markdown, reference_cells
from gradinv.config import REPO_ROOT, load
from gradinv.jobs import job_settings
from gradinv.table_inputs import claim_inputs, claim_tables


def _cells(values):
    """A long table (as ``<table>_cells.csv``) from {(defense, attack, metric): mean}."""
    return pd.DataFrame.from_records(
        [
            {"dataset": "patches", "defense": d, "attack": a, "metric": m, "mean": v, "n": 2}
            for (d, a, m), v in values.items()
        ]
    )


def _claims(tmp_path, *checks):
    entries = [
        {"id": f"c{i}", "paper": "P", "source": "Sec. 1", "claim": "text", "check": check}
        for i, check in enumerate(checks)
    ]
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": entries}))
    return load_claims(path)


def _check(**overrides):
    check = dict(
        table="t",
        metrics=["ssim"],
        compare="defense",
        left="censor",
        right="none",
        relation="less",
        over=["dataset", "attack"],
    )
    return {**check, **overrides}


def _verdicts(claims: list[Claim], frame) -> list[str]:
    return list(evaluate(claims, {"t": frame}, "embedded")["verdict"])


TABLE = _cells(
    {
        ("none", "ig", "ssim"): 0.6,
        ("censor", "ig", "ssim"): 0.1,
        ("soteria", "ig", "ssim"): 0.05,
        ("none", "ggl", "ssim"): 0.5,
        ("censor", "ggl", "ssim"): 0.2,
        ("soteria", "ggl", "ssim"): 0.4,
        ("none", "ig", "mse"): 0.01,
        ("censor", "ig", "mse"): 0.09,
        ("none", "ggl", "mse"): 0.02,
        ("censor", "ggl", "mse"): 0.01,
    }
)


def test_a_relation_that_holds_in_every_group_holds_and_its_reverse_fails(tmp_path):
    claims = _claims(tmp_path, _check(), _check(relation="greater"))
    table = evaluate(claims, {"t": TABLE}, "embedded")
    assert list(table["verdict"]) == ["holds", "fails"]
    assert list(table["evaluated"]) == [2, 2] and list(table["satisfied"]) == [2, 0]
    assert "patches/ig: censor 0.1 vs none 0.6 (yes)" in table.loc[0, "evidence"]
    assert set(table["scale"]) == {"embedded"}


def test_better_follows_each_metrics_arrow(tmp_path):
    # MSE: higher is better for the defender; SSIM: lower. CENSOR's GGL MSE is worse (0.01).
    claims = _claims(tmp_path, _check(metrics=["mse", "ssim"], relation="better"))
    table = evaluate(claims, {"t": TABLE}, "embedded")
    assert table.loc[0, "verdict"] == "fails"
    assert (table.loc[0, "satisfied"], table.loc[0, "evaluated"]) == (3, 4)
    fraction = _claims(tmp_path, _check(metrics=["mse", "ssim"], relation="better", expect=0.75))
    assert _verdicts(fraction, TABLE) == ["holds"]


def test_only_where_holds_exactly_in_the_named_groups(tmp_path):
    soteria = dict(left="soteria", right="censor", relation="better")
    exact = _claims(tmp_path, _check(**soteria, only_where={"attack": ["ig"]}))
    assert _verdicts(exact, TABLE) == ["holds"]
    wrong = _claims(tmp_path, _check(**soteria, only_where={"attack": ["ggl"]}))
    table = evaluate(wrong, {"t": TABLE}, "embedded")
    assert table.loc[0, "verdict"] == "fails"
    assert table.loc[0, "reason"] == "unlike the claim in patches/ig, patches/ggl"


def test_others_compares_against_every_other_value(tmp_path):
    claims = _claims(tmp_path, _check(right="others"), _check(left="soteria", right="others"))
    assert _verdicts(claims, TABLE) == ["fails", "fails"]  # soteria loses at GGL, censor at IG
    only_ggl = _claims(tmp_path, _check(right="others", where={"attack": "ggl"}))
    assert _verdicts(only_ggl, TABLE) == ["holds"]


def test_within_and_tolerance(tmp_path):
    utility = pd.DataFrame({"defense": ["none", "dcs2", "dp"], "accuracy": [50.0, 49.5, 40.0]})
    base = dict(table="utility", metrics=["accuracy"], over=[], right="none", relation="within")
    claims = _claims(
        tmp_path,
        {**_check(**base), "left": "dcs2", "tolerance": 1.0},
        {**_check(**base), "left": "dp", "tolerance": 1.0},
        {**_check(**base), "left": "dp", "relation": "less", "tolerance": 5.0},
        {**_check(**base), "left": "dp", "relation": "less", "tolerance": 15.0},
        {**_check(**base), "left": "dcs2", "relation": "not_below", "tolerance": 1.0},
        {**_check(**base), "left": "dp", "relation": "not_below", "tolerance": 1.0},
        {**_check(**base), "left": "none", "right": "dp", "relation": "not_below"},
        {**_check(**base), "left": "dcs2", "relation": "not_below", "tolerance": 0.5},  # boundary
    )
    table = evaluate(claims, {"utility": utility}, "embedded")
    expected = ["holds", "fails", "holds", "fails", "holds", "fails", "holds", "holds"]
    assert list(table["verdict"]) == expected


def test_exact_reconstructions_compare_as_the_best_psnr(tmp_path):
    """PSNR +inf (Imprint's exact reconstructions): equal to another +inf, above any finite."""
    table = _cells(
        {
            ("none", "imprint", "psnr"): math.inf,
            ("soteria", "imprint", "psnr"): math.inf,
            ("dcs2", "imprint", "psnr"): 20.0,
        }
    )
    check = dict(metrics=["psnr"], right="none", tolerance=1.0)
    claims = _claims(
        tmp_path,
        _check(**check, left="soteria", relation="within"),
        _check(**check, left="dcs2", relation="within"),
        _check(**check, left="dcs2", relation="less"),
        _check(**check, left="soteria", relation="less"),
    )
    assert _verdicts(claims, table) == ["holds", "fails", "holds", "fails"]


def test_an_accuracy_claim_shows_each_runs_spread(tmp_path):
    """A single run's accuracy moves between evaluations; the evidence says by how much, so a
    verdict decided by less than that is seen to be."""
    utility = pd.DataFrame(
        {"defense": ["none", "dcs2"], "accuracy": [50.0, 49.5], "accuracy_spread": [6.0, None]}
    )
    check = dict(table="utility", metrics=["accuracy"], over=[], left="dcs2", right="none")
    claims = _claims(tmp_path, {**_check(**check), "relation": "within", "tolerance": 1.0})
    table = evaluate(claims, {"utility": utility}, "embedded")
    assert table.loc[0, "verdict"] == "holds"
    assert table.loc[0, "evidence"] == "all: dcs2 49.5 vs none 50 ± 6 (yes)"


def test_missing_values_and_tables_are_not_evaluated_with_the_reason(tmp_path):
    claims = _claims(tmp_path, _check(left="refiner"), _check(table="absent"))
    table = evaluate(claims, {"t": TABLE}, "paper")
    assert list(table["verdict"]) == ["not evaluated", "not evaluated"]
    assert table.loc[0, "reason"] == "no group has both values"
    assert "patches/ig: no value for refiner" in table.loc[0, "evidence"]
    assert "absent is not built by this configuration" in table.loc[1, "reason"]
    text = markdown(table, "paper")
    assert "2 not evaluated of 2 claims" in text and "SCALED-DOWN" not in text
    assert "SCALED-DOWN" in markdown(table, "embedded")


def test_groups_without_both_values_never_count_in_the_claims_favour(tmp_path):
    # IG has both values (CENSOR lowers SSIM there); GGL has no CENSOR cell (no runs).
    gap = TABLE[~((TABLE["defense"] == "censor") & (TABLE["attack"] == "ggl"))]
    claims = _claims(
        tmp_path,
        _check(),  # all: the missing group could fail it, so undecided
        _check(expect=0.5),  # half: IG alone carries it
        _check(relation="greater"),  # IG already fails it
        _check(left="soteria", right="censor", relation="better", only_where={"attack": "ig"}),
    )
    table = evaluate(claims, {"t": gap}, "embedded")
    assert list(table["verdict"]) == ["not evaluated", "holds", "fails", "not evaluated"]
    assert list(table["groups"]) == [2, 2, 2, 2] and list(table["evaluated"]) == [1, 1, 1, 1]
    assert "1 of 2 group(s) without both values" in table.loc[0, "reason"]
    assert "undecided: the relation holds in 1 of 1 evaluated group(s)" in table.loc[0, "reason"]
    assert "| 1/1 (1 without values) |" in markdown(table, "embedded")


def test_a_cell_without_runs_joins_its_group(tmp_path):
    # a cell with no runs has no model (the table's context comes from runs): it takes the
    # table's one model, so GGL is one group short of CENSOR's value, not two half groups
    frame = TABLE.assign(model="lenet")
    frame.loc[(frame["defense"] == "censor") & (frame["attack"] == "ggl"), ["model", "mean"]] = None
    claims = _claims(tmp_path, _check(over=["dataset", "model", "attack"]))
    table = evaluate(claims, {"t": frame}, "embedded")
    assert table.loc[0, "verdict"] == "not evaluated"
    assert table.loc[0, "groups"] == 2 and table.loc[0, "evaluated"] == 1
    assert "patches/lenet/ggl: no value for censor" in table.loc[0, "evidence"]


def test_a_metric_with_no_value_anywhere_is_left_out_with_a_note(tmp_path):
    lpips = _cells(
        {(d, a, "lpips"): float("nan") for d in ("none", "censor") for a in ("ig", "ggl")}
    )
    lpips["note"] = "LPIPS unavailable: no pretrained weights"
    frame = pd.concat([TABLE, lpips.assign(unavailable=2)])
    claims = _claims(tmp_path, _check(metrics=["ssim", "lpips"], relation="better"))
    table = evaluate(claims, {"t": frame}, "embedded")
    assert table.loc[0, "verdict"] == "holds"  # on SSIM, the metric this run computed
    assert (table.loc[0, "evaluated"], table.loc[0, "groups"]) == (2, 2)
    reason = "lpips is unavailable in this run (LPIPS unavailable: no pretrained weights)"
    assert reason in table.loc[0, "reason"]
    # a metric with no value for another reason (every run failed) is kept: it decides nothing
    failed = pd.concat([TABLE, lpips.assign(unavailable=0, note="2 failed")])
    kept = evaluate(_claims(tmp_path, _check(metrics=["ssim", "lpips"])), {"t": failed}, "e")
    assert kept.loc[0, "verdict"] == "not evaluated" and kept.loc[0, "groups"] == 4
    only_lpips = evaluate(_claims(tmp_path, _check(metrics=["lpips"])), {"t": frame}, "embedded")
    assert only_lpips.loc[0, "verdict"] == "not evaluated"
    absent = evaluate(_claims(tmp_path, _check(metrics=["psnr"])), {"t": TABLE}, "embedded")
    assert absent.loc[0, "verdict"] == "not evaluated"
    assert "psnr is not in t" in absent.loc[0, "reason"]


def test_a_check_on_a_column_the_table_lacks_names_it(tmp_path):
    claims = _claims(tmp_path, _check(where={"model": ["lenet"]}))
    with pytest.raises(ClaimError, match=r"c0: t has no column\(s\) \['model'\]"):
        evaluate(claims, {"t": TABLE}, "embedded")


def test_rounds_are_compared_by_name(tmp_path):
    rounds = _cells({("censor", "gifd", "mse"): 0.05}).assign(round=0)
    later = _cells({("censor", "gifd", "mse"): 0.10}).assign(round=9)
    frame = pd.concat([rounds, later])
    check = _check(compare="round", left=9, right=0, relation="greater", metrics=["mse"])
    assert _verdicts(_claims(tmp_path, {**check, "over": ["dataset"]}), frame) == ["holds"]
    # Two cells per compared value: the check must say which column tells them apart.
    with pytest.raises(ClaimError, match="several cells per defense"):
        evaluate(_claims(tmp_path, _check(over=["dataset"])), {"t": TABLE}, "embedded")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"relation": "lower"}, "relation: 'lower' is not one of"),
        ({"metrics": ["ssim2"]}, "unknown metric"),
        ({"expect": 2}, "expect: 'all' or a fraction"),
        ({"colour": "red"}, "unknown key"),
        ({"left": None}, "missing 'left'"),
        ({"expect": 0.5, "only_where": {"attack": "ig"}}, "not both"),
    ],
)
def test_a_malformed_claim_is_named_with_the_key(tmp_path, change, message):
    check = {k: v for k, v in {**_check(), **change}.items() if v is not None}
    with pytest.raises(ClaimError, match=message) as err:
        _claims(tmp_path, check)
    assert "claims[0]" in str(err.value)


def test_duplicate_ids_are_refused(tmp_path):
    path = tmp_path / "claims.yaml"
    entry = {"id": "x", "paper": "P", "source": "S", "claim": "c", "check": _check()}
    path.write_text(yaml.safe_dump({"claims": [entry, entry]}))
    with pytest.raises(ClaimError, match="'x' is listed twice"):
        load_claims(path)


def test_the_projects_claims_load_and_name_known_runs():
    claims = load_claims(REPO_ROOT / "workflow/claims.yaml")
    assert len(claims) >= 15
    config = load(REPO_ROOT / "params.yaml", (REPO_ROOT / "workflow/configs/paper.yaml",))
    for claim in claims:
        check = claim.check
        if check.compare == "defense":
            for name in (check.left, check.right):
                assert name == "others" or name in config["defenses"], (claim.id, name)
        if check.compare == "attack":
            assert {check.left, check.right} <= set(config["attacks"]), claim.id
    built = set(claim_tables(load(REPO_ROOT / "params.yaml")))
    assert {"table1", "utility"} <= built


def test_the_stage_writes_csv_and_markdown(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    TABLE.to_csv(results / "t_cells.csv", index=False)
    claims = tmp_path / "claims.yaml"
    claims.write_text(
        yaml.safe_dump(
            {
                "claims": [
                    {"id": "a", "paper": "P", "source": "S", "claim": "c", "check": _check()},
                    {
                        "id": "b",
                        "paper": "P",
                        "source": "S",
                        "claim": "c",
                        "check": _check(table="u"),
                    },
                ]
            }
        )
    )
    # "u" is built by the configuration but its file is missing: not evaluated, and why
    settings = json.dumps({"scale": "embedded", "tables": ["t", "u"]})
    cmd = [sys.executable, "-m", "gradinv.cli", "claims", "--settings", settings]
    cmd += ["--claims", str(claims), "--results-dir", str(results), "--out-dir", str(results)]
    subprocess.run(cmd, check=True, capture_output=True)
    table = pd.read_csv(results / "claims.csv")
    assert list(table["verdict"]) == ["holds", "not evaluated"]
    assert "u_cells.csv does not exist: build it first (snakemake" in table.loc[1, "reason"]
    assert "## `a`: holds" in (results / "claims.md").read_text()


def test_every_claim_holds_on_the_papers_own_numbers():
    """Each claim's check, run on the published table it cites, bears the claim out: a claim
    that fails on the paper's own numbers is encoded wrongly (or overstates the paper)."""
    # the paper overlay's labels: its sweeps name every point the published tables report
    config = load(REPO_ROOT / "params.yaml", (REPO_ROOT / "workflow/configs/paper.yaml",))
    settings = json.loads(job_settings(config, "claims"))
    references = {**settings["references"], "table2": "workflow/reference/censor_table2.csv"}
    published = {
        table: reference_cells(pd.read_csv(REPO_ROOT / csv), settings["labels"])
        for table, csv in references.items()
    }
    claims = load_claims(REPO_ROOT / "workflow/claims.yaml")
    table = evaluate(claims, {}, "paper", published).set_index("id")
    # "not evaluated": the published table lacks the cells. CVB's DP rows lost their settings;
    # CENSOR's Table VII has only the layer-wise row (the whole-model MSE and PSNR come from a
    # summary of the paper, its SSIM and LPIPS are lost), so 2 of its 4 metrics decide nothing.
    undecided = table[table["paper_verdict"] == "not evaluated"].index
    assert set(undecided) == {"dp-more-noise-less-leakage", "layerwise-beats-whole-model"}
    checked = table[table["paper_verdict"].isin(["holds", "fails"])]
    assert len(checked) >= 19
    assert (checked["paper_verdict"] == "holds").all(), checked["paper_verdict"].to_dict()


def test_a_bad_claims_file_stops_the_stage_with_the_key(tmp_path):
    claims = tmp_path / "claims.yaml"
    claims.write_text("claims:\n  - {id: a, paper: P, source: S, claim: c, check: {table: t}}\n")
    settings = json.dumps({"scale": "embedded", "tables": ["t"]})
    cmd = [sys.executable, "-m", "gradinv.cli", "claims", "--settings", settings]
    proc = subprocess.run([*cmd, "--claims", str(claims)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "configuration error" in proc.stderr and "claims[0] (a).check: missing 'compare'" in (
        proc.stderr
    )


def test_dvcs_claims_stage_reads_every_result_a_claim_reads():
    """`dvc repro` reruns the claims when any result they read changes: its deps must list each
    (a claim added on a new table without its file there would go stale under DVC)."""
    config = load(REPO_ROOT / "params.yaml")
    stage = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]["claims"]
    results = {d for d in stage["deps"] if d.startswith("results/")}
    assert results == set(claim_inputs(config, REPO_ROOT / "workflow/claims.yaml"))
