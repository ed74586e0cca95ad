"""The claims checker: each relation, each expectation, the verdicts and the errors."""

import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from gradinv.claims import Claim, ClaimError, evaluate, load_claims, markdown, reference_cells
from gradinv.claims.spec import UTILITY_KEYS, is_utility
from gradinv.config import REPO_ROOT, load
from gradinv.jobs import job_settings
from gradinv.stages.utility import RUN_COLUMNS
from gradinv.stats import units_to_decide
from gradinv.table_inputs import claim_inputs, claim_tables, claim_values
from gradinv.tables.aggregate import training_scope
from gradinv.tables.files import SEED_COLUMNS, VICTIM_COLUMNS


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


def _victims(values, floor=None, **columns):
    """Per-victim values (as ``<table>_victims.csv``) from {(defense, attack, metric): [value of
    victim 0, 1, ...]}; ``floor`` gives each metric's floor value, the same for every victim."""
    rows = {}
    for (d, a, m), series in values.items():
        for v, value in enumerate(series):
            row = rows.setdefault(
                (d, a, v),
                {
                    "dataset": "patches",
                    "model": "cnn3",
                    "defense": d,
                    "attack": a,
                    "round": 0,
                    "batch_size": 1,
                    "victim": v,
                    "status": "ok",
                    **columns,
                },
            )
            row[m] = value
            if floor and m in floor:
                row[f"floor_{m}"] = floor[m]
    return pd.DataFrame.from_records(list(rows.values()))


def _around(center, n=8, spread=0.02):
    """n values around ``center``, none equal, symmetric: a consistent measurement."""
    return [center + spread * ((i % 4) - 1.5) for i in range(n)]


VICTIMS = _victims(
    {
        ("none", "ig", "ssim"): _around(0.6),
        ("censor", "ig", "ssim"): _around(0.1),
        ("soteria", "ig", "ssim"): _around(0.05),
        ("none", "ggl", "ssim"): _around(0.5),
        ("censor", "ggl", "ssim"): _around(0.2),
        ("soteria", "ggl", "ssim"): _around(0.4),
        ("none", "ig", "mse"): _around(0.01, spread=0.001),
        ("censor", "ig", "mse"): _around(0.09, spread=0.001),
        ("none", "ggl", "mse"): _around(0.02, spread=0.001),
        ("censor", "ggl", "mse"): _around(0.01, spread=0.001),
    }
)


TABLE = (  # the same as cell means, the layout of a published table (reference_cells)
    VICTIMS.melt(
        id_vars=["dataset", "defense", "attack", "victim"],
        value_vars=["ssim", "mse"],
        var_name="metric",
        value_name="mean",
    )
    .dropna()
    .groupby(["dataset", "defense", "attack", "metric"], as_index=False)["mean"]
    .mean()
)


def test_a_consistent_gap_over_eight_victims_holds_and_its_reverse_fails(tmp_path):
    claims = _claims(tmp_path, _check(), _check(relation="greater"))
    table = evaluate(claims, {"t": VICTIMS}, "embedded")
    assert list(table["verdict"]) == ["holds", "fails"]
    assert list(table["holds_groups"]) == [2, 0] and list(table["fails_groups"]) == [0, 2]
    evidence = table.loc[0, "evidence"]
    assert "patches/ig: censor − none −0.5 [" in evidence and "(n 8 victims): holds" in evidence
    assert set(table["scale"]) == {"embedded"}


def test_a_claim_over_two_victims_with_a_small_gap_is_not_called_holds(tmp_path):
    """Two victims, both a little lower under CENSOR: no sign-flip test can tell that from
    chance (2 of the 4 sign patterns are as extreme), so the verdict is inconclusive."""
    two = _victims({("none", "ig", "ssim"): [0.30, 0.42], ("censor", "ig", "ssim"): [0.29, 0.41]})
    table = evaluate(_claims(tmp_path, _check()), {"t": two}, "embedded")
    assert table.loc[0, "verdict"] == "inconclusive"
    evidence = table.loc[0, "evidence"]
    assert "−0.01 [−∞, ∞] (n 2 victims), about 6 victims in all would decide it" in evidence
    # the two differences are equal: the fewest victims a sign-flip interval decides with
    assert table.loc[0, "to_decide"].startswith("about 6 victims a group in all, not 6 more")


def test_an_interval_across_zero_is_inconclusive_and_a_mixed_claim_says_so(tmp_path):
    mixed = _victims(
        {
            ("none", "ig", "ssim"): [0.5] * 8,
            ("censor", "ig", "ssim"): [0.4, 0.6, 0.45, 0.55, 0.3, 0.7, 0.48, 0.52],
            ("none", "ggl", "ssim"): _around(0.5),
            ("censor", "ggl", "ssim"): _around(0.2),
        }
    )
    table = evaluate(_claims(tmp_path, _check()), {"t": mixed}, "embedded")
    assert table.loc[0, "verdict"] == "inconclusive"  # GGL holds, IG cannot tell
    assert (table.loc[0, "holds_groups"], table.loc[0, "inconclusive_groups"]) == (1, 1)
    # IG's differences (mean 0, spread 0.12) are on the boundary: no number of victims decides it
    assert "no estimate of the victims that would decide it" in table.loc[0, "evidence"]
    assert table.loc[0, "to_decide"].startswith("no estimate of the victims that would decide it")
    half = evaluate(_claims(tmp_path, _check(expect=0.5)), {"t": mixed}, "embedded")
    assert half.loc[0, "verdict"] == "holds"  # one of the two groups is enough
    assert half.loc[0, "to_decide"] == ""  # a decided claim needs nothing more


def test_an_inconclusive_claim_says_how_many_victims_would_decide_it(tmp_path):
    """8 victims a little lower under CENSOR, with a spread as large as the gap: inconclusive,
    and the claim names the victims a group would need (the paired t-test's sample size)."""
    gap = [-0.05, 0.02, -0.08, -0.01, -0.06, 0.03, -0.04, -0.05]  # censor − none, mean −0.03
    frame = _victims(
        {
            ("none", "ig", "ssim"): [0.5] * 8,
            ("censor", "ig", "ssim"): [0.5 + g for g in gap],
        }
    )
    row = evaluate(_claims(tmp_path, _check()), {"t": frame}, "embedded").iloc[0]
    assert row["verdict"] == "inconclusive"
    needed = units_to_decide(gap, "less", minimum=9, sign_flip=True)
    assert 12 < needed < 20  # mean −0.03, sd 0.037: ((1.96 + 0.84) · 0.037 / 0.03)² ≈ 12, t: more
    assert f"about {needed} victims in all would decide it (holds at its mean)" in row["evidence"]
    assert row["to_decide"].startswith(f"about {needed} victims a group in all")
    assert "the claim would then hold" in row["to_decide"]
    text = markdown(evaluate(_claims(tmp_path, _check()), {"t": frame}, "embedded"), "embedded")
    assert f"What would decide it: about {needed} victims a group" in text
    assert "0 decided (holds or fails)" in text


def test_a_claim_plans_for_the_groups_that_decide_it(tmp_path):
    """Two inconclusive groups: GI's gap (CENSOR lower) needs about 15 victims, GGL's mean sits
    just on the other side of the boundary and needs over a thousand. With ``expect: 0.5`` GI
    holding decides the claim; with ``all`` it takes GGL failing; the reverse claim fails with
    GI."""
    small = [-0.05, 0.02, -0.08, -0.01, -0.06, 0.03, -0.04, -0.05]  # mean −0.03
    tiny = [-0.05, 0.05, -0.04, 0.04, -0.06, 0.06, -0.03, 0.062]  # mean +0.004
    frame = _victims(
        {
            ("none", "gi", "ssim"): [0.5] * 8,
            ("censor", "gi", "ssim"): [0.5 + g for g in small],
            ("none", "ggl", "ssim"): [0.5] * 8,
            ("censor", "ggl", "ssim"): [0.5 + g for g in tiny],
        }
    )
    gi = units_to_decide(small, "less", minimum=9, sign_flip=True)
    ggl = units_to_decide(tiny, "less", minimum=9, sign_flip=True)
    assert gi < 20 and ggl > 1000
    half, both, fails = (
        evaluate(_claims(tmp_path, c), {"t": frame}, "embedded").iloc[0]
        for c in (_check(expect=0.5), _check(), _check(relation="greater"))
    )
    assert half["to_decide"].startswith(f"about {gi} victims a group")  # GI alone decides it
    assert "would then hold" in half["to_decide"]
    assert both["to_decide"].startswith(f"about {ggl:,} victims a group")  # GGL fails it
    assert "would then fail" in both["to_decide"]
    assert fails["to_decide"].startswith(f"about {gi} victims a group")  # GI fails it
    assert "would then fail" in fails["to_decide"]


def test_a_plan_counts_more_victims_than_the_comparison_has(tmp_path):
    """Six victims, five far above the boundary and one just below: the t-formula alone would
    say 6, which is what the group has; the plan never asks for fewer than one more."""
    frame = _victims(
        {
            ("none", "ig", "ssim"): [0.1] * 6,
            ("censor", "ig", "ssim"): [0.4, 0.4, 0.4, 0.4, 0.4, 0.099],
        }
    )
    row = evaluate(_claims(tmp_path, _check(relation="greater")), {"t": frame}, "embedded")
    assert row.loc[0, "verdict"] == "inconclusive"
    assert "about 7 victims in all would decide it" in row.loc[0, "evidence"]


def test_a_tolerance_moves_the_boundary_a_plan_aims_at(tmp_path):
    """CENSOR lowers SSIM by about 0.2 on every victim: that holds with no tolerance, and with a
    tolerance of 0.18 the interval straddles the boundary, so the plan aims at −0.18."""
    gap = [-0.22, -0.17, -0.25, -0.19, -0.21, -0.16, -0.23, -0.2]  # mean −0.204
    frame = _victims(
        {("none", "ig", "ssim"): [0.5] * 8, ("censor", "ig", "ssim"): [0.5 + g for g in gap]}
    )
    plain = evaluate(_claims(tmp_path, _check()), {"t": frame}, "embedded").iloc[0]
    assert plain["verdict"] == "holds" and plain["to_decide"] == ""
    row = evaluate(_claims(tmp_path, _check(tolerance=0.18)), {"t": frame}, "embedded").iloc[0]
    assert row["verdict"] == "inconclusive"
    expected = units_to_decide(gap, "less", tolerance=0.18, minimum=9, sign_flip=True)
    assert expected == units_to_decide([-g - 0.18 for g in gap], "greater", minimum=9)
    assert f"about {expected} victims in all would decide it" in row["evidence"]


def test_an_attack_at_the_floor_without_a_defense_decides_nothing(tmp_path):
    """GI's undefended reconstructions are no closer than the public mean image on the median
    victim: a defense cannot lower it, so its group is undecidable, not failed."""
    floor = {"psnr": 14.0}
    frame = _victims(
        {
            ("none", "ig", "psnr"): _around(20.0, spread=1.0),  # beats the floor by ~6 dB
            ("censor", "ig", "psnr"): _around(8.0, spread=1.0),
            ("none", "gi", "psnr"): _around(12.0, spread=1.0),  # 2 dB below the floor
            ("censor", "gi", "psnr"): _around(13.0, spread=1.0),
        },
        floor=floor,
    )
    check = _check(metrics=["psnr"], relation="better")
    table = evaluate(_claims(tmp_path, check), {"t": frame}, "embedded", undefended=frame)
    row = table.iloc[0]
    assert row["verdict"] == "holds"  # IG decides it; GI is left out, and the note says so
    assert (row["holds_groups"], row["undecidable_groups"]) == (1, 1)
    assert (
        "patches/gi: undecidable (undefended gi at round 0 does not beat the floor"
        in (row["evidence"])
    )
    assert "1 group(s) undecidable" in row["reason"]
    only_gi = _claims(tmp_path, {**check, "where": {"attack": ["gi"]}})
    gi = evaluate(only_gi, {"t": frame}, "embedded", undefended=frame).iloc[0]
    assert gi["verdict"] == "undecidable"
    assert gi["to_decide"].startswith("a stronger attack rather than more victims")
    # the undefended runs may be another table's: the floor check looks them up there
    defended_only = frame[frame["defense"] != "none"]
    elsewhere = evaluate(only_gi, {"t": defended_only}, "embedded", undefended=frame)
    assert elsewhere.loc[0, "verdict"] == "not evaluated"  # no "none" side to compare with
    censor_vs_nothing = _check(metrics=["psnr"], compare="attack", left="gi", right="ig")
    by_attack = evaluate(
        _claims(tmp_path, {**censor_vs_nothing, "relation": "greater", "over": ["dataset"]}),
        {"t": defended_only},
        "embedded",
        undefended=frame,
    )
    assert by_attack.loc[0, "verdict"] == "undecidable"  # GI, one of the two, is at the floor


def test_the_floor_check_counts_each_undefended_victim_once(tmp_path):
    """Tables that share runs list the same victims: Table I's undefended IG victims are also
    CENSOR's variants' and CVB's. The floor check takes the median over the victims, each once,
    not over the tables' rows (which weigh the victims the most tables share)."""
    floor = {"psnr": 14.0}
    gains = [-1.0, -1.0, 2.0, 3.0]  # the median victim beats the floor (by 0.5 dB)
    table1 = _victims(
        {
            ("none", "ig", "psnr"): [14.0 + g for g in gains],
            ("censor", "ig", "psnr"): [8.0, 9.0, 8.5, 9.5],
        },
        floor=floor,
    )
    shared = table1[table1["victim"] < 2]  # two more tables that read victims 0 and 1
    undefended = pd.concat([table1, shared, shared], ignore_index=True)
    check = _check(metrics=["psnr"], relation="better", over=["dataset"])
    row = evaluate(_claims(tmp_path, check), {"t": table1}, "embedded", undefended=undefended)
    assert row.loc[0, "verdict"] != "undecidable"  # per row the median gain would be -1 dB
    assert row.loc[0, "undecidable_groups"] == 0


def test_the_floor_check_says_which_round_it_used_and_when_it_had_none(tmp_path):
    """The undefended attack is looked up at the group's round, else the earliest round with
    one, and the evidence says so; with none anywhere the group is decided unchecked, and says
    so too."""
    at_floor = _victims({("none", "gifd", "mse"): _around(0.2, spread=0.01)}, floor={"mse": 0.2})
    censor = pd.concat(
        [_victims({("censor", "gifd", "mse"): _around(0.2, spread=0.01)}, round=r) for r in (0, 9)],
        ignore_index=True,
    )
    frame = pd.concat([at_floor, censor], ignore_index=True)
    check = _check(compare="round", left=9, right=0, relation="greater", metrics=["mse"])
    claims = _claims(tmp_path, {**check, "over": ["dataset"]})
    row = evaluate(claims, {"t": frame}, "embedded", undefended=frame).iloc[0]
    assert row["verdict"] == "undecidable"
    assert (
        "undefended gifd at round 0 (none at round 9) does not beat the floor" in (row["evidence"])
    )
    beats = frame.assign(mse=frame["mse"].where(frame["defense"] != "none", 0.01))
    row = evaluate(claims, {"t": beats}, "embedded", undefended=beats).iloc[0]
    assert "(the floor checked on undefended gifd at round 0 (none at round 9))" in row["evidence"]
    unchecked = evaluate(claims, {"t": censor}, "embedded", undefended=censor).iloc[0]
    assert unchecked["verdict"] != "undecidable"
    assert "(the floor not checked: no undefended gifd run)" in unchecked["evidence"]


def test_an_attack_success_rate_is_checked_against_the_floor_through_ssim(tmp_path):
    """A success rate is the share of images above an SSIM threshold: an attack whose undefended
    SSIM does not beat the floor's succeeds at nothing a defense could lower."""
    frame = _victims(
        {
            ("none", "ig", "ssim"): _around(0.05, spread=0.01),
            ("none", "ig", "attack_success"): [0.0] * 8,
            ("cvb", "ig", "attack_success"): [0.0] * 8,
        },
        floor={"ssim": 0.1},
    )
    check = _check(metrics=["attack_success"], left="cvb", relation="less")
    row = evaluate(_claims(tmp_path, check), {"t": frame}, "embedded", undefended=frame).iloc[0]
    assert row["verdict"] == "undecidable"
    assert "does not beat the floor in SSIM" in row["evidence"]
    # a table whose victims carry no SSIM cannot say: the evidence says it was not checked
    no_ssim = frame.drop(columns=["ssim", "floor_ssim"])
    row = evaluate(_claims(tmp_path, check), {"t": no_ssim}, "embedded", undefended=no_ssim)
    assert "(the floor not checked: undefended ig has no SSIM values)" in row.iloc[0]["evidence"]


def test_better_follows_each_metrics_arrow(tmp_path):
    # MSE: higher is better for the defender; SSIM: lower. CENSOR's GGL MSE is worse.
    claims = _claims(tmp_path, _check(metrics=["mse", "ssim"], relation="better"))
    table = evaluate(claims, {"t": VICTIMS}, "embedded")
    assert table.loc[0, "verdict"] == "fails"
    assert (table.loc[0, "holds_groups"], table.loc[0, "fails_groups"]) == (3, 1)
    fraction = _claims(tmp_path, _check(metrics=["mse", "ssim"], relation="better", expect=0.75))
    assert _verdicts(fraction, VICTIMS) == ["holds"]


def test_only_where_holds_exactly_in_the_named_groups(tmp_path):
    soteria = dict(left="soteria", right="censor", relation="better")
    exact = _claims(tmp_path, _check(**soteria, only_where={"attack": ["ig"]}))
    assert _verdicts(exact, VICTIMS) == ["holds"]
    wrong = _claims(tmp_path, _check(**soteria, only_where={"attack": ["ggl"]}))
    assert _verdicts(wrong, VICTIMS) == ["fails"]


def test_others_compares_against_every_other_value(tmp_path):
    claims = _claims(tmp_path, _check(right="others"), _check(left="soteria", right="others"))
    assert _verdicts(claims, VICTIMS) == ["fails", "fails"]  # soteria loses at GGL, censor at IG
    only_ggl = _claims(tmp_path, _check(right="others", where={"attack": "ggl"}))
    assert _verdicts(only_ggl, VICTIMS) == ["holds"]


def test_others_with_a_side_that_has_no_values_cannot_hide_a_failure(tmp_path):
    """Every run of Noise failed: CENSOR cannot be compared with it, so the group cannot hold,
    but CENSOR losing to Clipping at IG still fails the group and the claim."""
    frame = _victims(
        {
            ("censor", "ig", "ssim"): _around(0.5),
            ("clipping", "ig", "ssim"): _around(0.1),
            ("noise", "ig", "ssim"): [math.nan] * 8,
            ("censor", "gi", "ssim"): _around(0.1),
            ("clipping", "gi", "ssim"): _around(0.5),
            ("noise", "gi", "ssim"): [math.nan] * 8,
        }
    )
    row = evaluate(_claims(tmp_path, _check(right="others")), {"t": frame}, "embedded").iloc[0]
    assert row["verdict"] == "fails"
    assert (row["fails_groups"], row["inconclusive_groups"]) == (1, 1)
    assert "censor and noise share no" in row["evidence"]
    winning = frame.assign(ssim=frame["ssim"].where(frame["defense"] != "censor", 0.01))
    row = evaluate(_claims(tmp_path, _check(right="others")), {"t": winning}, "embedded").iloc[0]
    assert row["verdict"] == "inconclusive"  # beats Clipping everywhere; Noise cannot say
    only_noise = frame[frame["defense"] != "clipping"]
    row = evaluate(_claims(tmp_path, _check(right="others")), {"t": only_noise}, "embedded")
    assert row.loc[0, "verdict"] == "not evaluated"  # no comparison of any group has pairs


def test_the_floor_check_reads_a_metric_from_the_table_that_scores_it(tmp_path):
    """Refiner's Fig. 6 (PSNR only) and Fig. 9 (the noise ratio) share their undefended runs:
    the floor check on the noise ratio finds it in Fig. 9's copy, whichever table comes first."""
    fig9 = _victims(
        {
            ("none", "ig", "noise_ratio"): [0.9] * 8,  # 0.4 farther than the floor: no gain
            ("refiner", "ig", "noise_ratio"): [0.95] * 8,
        },
        floor={"noise_ratio": 0.5},
    )
    fig6 = _victims({("none", "ig", "psnr"): [12.0] * 8}, floor={"psnr": 10.0})
    check = _check(metrics=["noise_ratio"], left="refiner", relation="greater")
    claims = _claims(tmp_path, check)
    for first, second in ((fig6, fig9), (fig9, fig6)):
        undefended = pd.concat([first, second], ignore_index=True)
        row = evaluate(claims, {"t": fig9}, "embedded", undefended=undefended).iloc[0]
        assert row["verdict"] == "undecidable", row["evidence"]


def _utility(accuracies):
    """The utility runs, one line per defense and seed, from {defense: [accuracy per seed]}."""
    return pd.DataFrame.from_records(
        [
            {"defense": d, "seed": s, "accuracy": a, "status": "ok"}
            for d, values in accuracies.items()
            for s, a in enumerate(values)
        ]
    )


def test_accuracy_claims_pair_the_training_seeds(tmp_path):
    utility = _utility(
        {"none": [50.0, 46.0, 53.0], "dcs2": [49.6, 45.8, 52.5], "dp": [40.0, 35.0, 44.0]}
    )
    base = dict(table="utility", metrics=["accuracy"], over=[], right="none")
    claims = _claims(
        tmp_path,
        {**_check(**base), "left": "dcs2", "relation": "within", "tolerance": 1.0},
        {**_check(**base), "left": "dp", "relation": "within", "tolerance": 1.0},
        {**_check(**base), "left": "dp", "relation": "less", "tolerance": 5.0},
        {**_check(**base), "left": "dcs2", "relation": "not_below", "tolerance": 1.0},
        {**_check(**base), "left": "dp", "relation": "not_below", "tolerance": 1.0},
    )
    table = evaluate(claims, {"utility": utility}, "embedded")
    assert list(table["verdict"]) == ["holds", "fails", "holds", "holds", "fails"]
    assert "(n 3 seeds)" in table.loc[0, "evidence"]
    one_seed = _utility({"none": [50.0], "dcs2": [49.9]})
    single = evaluate(claims[:1], {"utility": one_seed}, "embedded")
    assert single.loc[0, "verdict"] == "inconclusive"  # one run decides nothing


def test_psnrs_beyond_8_bit_rounding_pair_as_equal(tmp_path):
    """PSNR +inf (Imprint's exact reconstructions) and 135 dB are both closer to the victim than
    its own 8-bit rounding: paired as the ceiling, they are no difference; below it, a PSNR
    counts as it is."""
    frame = _victims(
        {
            ("none", "imprint", "psnr"): [math.inf] * 8,
            ("soteria", "imprint", "psnr"): [math.inf] * 4 + _around(135.0, n=4, spread=10.0),
            ("dcs2", "imprint", "psnr"): _around(20.0, spread=2.0),
        }
    )
    check = dict(metrics=["psnr"], right="none", tolerance=1.0)
    claims = _claims(
        tmp_path,
        _check(**check, left="soteria", relation="within"),
        _check(**check, left="dcs2", relation="less"),
        _check(**check, left="soteria", relation="less"),
    )
    table = evaluate(claims, {"t": frame}, "embedded")
    assert list(table["verdict"]) == ["holds", "holds", "fails"]
    assert "dcs2 − none −40 [" in table.loc[1, "evidence"]  # 20 dB against the 60 dB ceiling
    # the ceiling is PSNR's alone: an SSIM of 1 is not capped, nor anything else
    ssim = _victims({("none", "ig", "ssim"): [1.0] * 8, ("censor", "ig", "ssim"): [0.99] * 8})
    assert _verdicts(_claims(tmp_path, _check()), ssim) == ["holds"]


def test_missing_values_and_tables_are_not_evaluated_with_the_reason(tmp_path):
    claims = _claims(tmp_path, _check(left="refiner"), _check(table="absent"))
    table = evaluate(claims, {"t": VICTIMS}, "paper")
    assert list(table["verdict"]) == ["not evaluated", "not evaluated"]
    assert "no group has both values" in table.loc[0, "reason"]
    assert "patches/ig: no values for refiner" in table.loc[0, "evidence"]
    assert "absent is not built by this configuration" in table.loc[1, "reason"]
    text = markdown(table, "paper")
    assert "0 holds, 0 fails, 0 inconclusive, 0 undecidable, 2 not evaluated** of 2 claims" in (
        text
    )
    assert "SCALED-DOWN" not in text and "SCALED-DOWN" in markdown(table, "embedded")


def test_claims_md_counts_the_four_verdicts_apart(tmp_path):
    floor = {"ssim": 0.05}
    frame = _victims(
        {
            ("none", "ig", "ssim"): _around(0.6),
            ("censor", "ig", "ssim"): _around(0.1),
            ("none", "gi", "ssim"): _around(0.04, spread=0.005),  # below the floor
            ("censor", "gi", "ssim"): _around(0.03, spread=0.005),
        },
        floor=floor,
    )
    claims = _claims(
        tmp_path,
        _check(where={"attack": ["ig"]}),
        _check(where={"attack": ["ig"]}, relation="greater"),
        _check(where={"attack": ["ig"]}, relation="within", tolerance=0.6),
        _check(where={"attack": ["gi"]}),
        _check(expect=0.5),  # IG holds, GI is undecidable: it holds on IG alone
    )
    table = evaluate(claims, {"t": frame}, "embedded", undefended=frame)
    assert list(table["verdict"]) == ["holds", "fails", "holds", "undecidable", "holds"]
    text = markdown(table, "embedded")
    assert "**3 holds, 1 fails, 0 inconclusive, 1 undecidable, 0 not evaluated**" in text
    assert "; 1 of those that hold hold on their decidable groups only" in text
    # each claim says how its groups combine
    assert (
        "checked on `t`: one group per dataset, attack (defense censor against none, paired "
        "victim by victim); the claim holds if every decidable group holds, fails if any fails."
    ) in text
    assert "holds if at least 50% of the decidable groups hold, fails once" in text


def test_a_metric_with_no_value_anywhere_is_left_out_with_a_note(tmp_path):
    frame = VICTIMS.assign(lpips=math.nan)
    claims = _claims(tmp_path, _check(metrics=["ssim", "lpips"], relation="better"))
    table = evaluate(claims, {"t": frame}, "embedded")
    assert table.loc[0, "verdict"] == "holds"  # on SSIM, the metric this run computed
    assert "lpips has no value in this run" in table.loc[0, "reason"]
    only_lpips = evaluate(_claims(tmp_path, _check(metrics=["lpips"])), {"t": frame}, "embedded")
    assert only_lpips.loc[0, "verdict"] == "not evaluated"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"where": {"colour": ["red"]}}, r"t_victims.csv has no column\(s\) \['colour'\];"),
        (  # a table's accuracy is one value per defense and seed, the same for every attack
            {"metrics": ["accuracy"], "where": {"attack": ["ig"]}},
            r"t_training.csv has no column\(s\) \['attack'\] \(accuracy: one value per "
            r"defense and seed, the same for every attack\)",
        ),
        ({"metrics": ["accuracy", "ssim"]}, r"\['accuracy'\] come from the training runs"),
        ({"table": "utility", "metrics": ["accuracy"]}, r"utility_runs.csv has no column"),
    ],
)
def test_a_check_on_a_column_its_file_lacks_is_refused_when_the_claims_load(
    tmp_path, change, message
):
    """Caught when Snakemake builds the workflow (claim_inputs loads the claims), not by the
    claims job at the end of a long run."""
    with pytest.raises(ClaimError, match=message) as err:
        _claims(tmp_path, {**_check(), **change})
    assert "claims[0] (c0).check" in str(err.value)


def test_a_check_on_a_column_the_table_lacks_names_it(tmp_path):
    claims = _claims(tmp_path, _check(over=["dataset", "model"]))
    with pytest.raises(ClaimError, match=r"c0: t has no column\(s\) \['model'\]"):
        evaluate(claims, {"t": VICTIMS.drop(columns="model")}, "embedded")


def test_the_keys_a_utility_claim_may_name_are_columns_of_the_utility_runs():
    assert set(UTILITY_KEYS) <= set(RUN_COLUMNS)


def test_rounds_are_paired_victim_by_victim(tmp_path):
    early = _victims({("censor", "gifd", "mse"): _around(0.05, spread=0.004)}, round=0)
    later = _victims({("censor", "gifd", "mse"): _around(0.10, spread=0.004)}, round=9)
    frame = pd.concat([early, later], ignore_index=True)
    check = _check(compare="round", left=9, right=0, relation="greater", metrics=["mse"])
    assert _verdicts(_claims(tmp_path, {**check, "over": ["dataset"]}), frame) == ["holds"]


def test_the_published_numbers_are_checked_on_their_cell_means(tmp_path):
    """The paper gives cell means only: its verdict compares them as they are."""
    claims = _claims(tmp_path, _check(), _check(relation="greater"))
    table = evaluate(claims, {"t": VICTIMS}, "embedded", published={"t": TABLE})
    assert list(table["paper_verdict"]) == ["holds", "fails"]


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


@pytest.mark.parametrize(
    "overlays", [(), ("workflow/configs/paper.yaml",)], ids=["default", "paper"]
)
def test_every_claim_names_what_its_table_holds(overlays):
    """A claim names runs by what its table's result calls them: a sweep point by its own name
    even where it reads its base's runs (Fig. 9's T = 20 is ``censor-trials20``, not ``censor``).
    A name the table lacks leaves the claim "not evaluated" at the end of a long run."""
    config = load(REPO_ROOT / "params.yaml", tuple(REPO_ROOT / o for o in overlays))
    built = set(claim_tables(config))
    for claim in load_claims(REPO_ROOT / "workflow/claims.yaml"):
        check = claim.check
        if check.table not in built:
            continue
        values = claim_values(config, check.table)
        if check.compare in values:
            sides = {str(n) for n in (check.left, check.right)} - {"others"}
            missing = sides - values[check.compare]
            assert not missing, (claim.id, check.table, check.compare, missing)
        for column, chosen in {**check.where, **check.only_where}.items():
            # a selection may list more than one configuration builds (every sweep point)
            if column in values:
                assert {str(n) for n in chosen} & values[column], (claim.id, column, chosen)


def test_the_stage_writes_csv_and_markdown(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    VICTIMS.to_csv(results / "t_victims.csv", index=False)
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
    assert "u_victims.csv does not exist: build it first (snakemake" in table.loc[1, "reason"]
    assert "## `a`: holds" in (results / "claims.md").read_text()
    summary = json.loads((results / "claims_summary.json").read_text())
    assert (summary["holds"], summary["not evaluated"], summary["decided"]) == (1, 1, 1)


def test_every_claim_holds_on_the_papers_own_numbers():
    """Each claim's check, run on the published table it cites, bears the claim out: a claim
    that fails on the paper's own numbers is encoded wrongly (or overstates the paper)."""
    # the paper overlay's labels: its sweeps name every point the published tables report
    config = load(REPO_ROOT / "params.yaml", (REPO_ROOT / "workflow/configs/paper.yaml",))
    settings = json.loads(job_settings(config, "claims"))
    references = {**settings["references"], "table2": "workflow/reference/censor_table2.csv"}
    runs = settings["reference_runs"]
    published = {
        table: reference_cells(pd.read_csv(REPO_ROOT / csv), settings["labels"], runs.get(table))
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


def test_a_published_name_is_matched_among_the_tables_own_defenses():
    """Two papers may name different settings alike (CENSOR's Soteria, DCS²'s at its Table 10;
    DCS² and its one-sensitive-sample variant): a published table's names are read among its
    own runs, whatever the order of the defenses in params.yaml."""
    labels = {
        "defenses": {"dcs2_one": "DCS²", "dcs2": "DCS²", "none": "No Defense"},
        "attacks": {"ig": "IG"},
    }
    reference = pd.DataFrame(
        {
            "dataset": ["MNIST", "MNIST"],
            "defense": ["DCS²", "No Defense"],
            "attack": ["IG", "IG"],
            "metric": ["PSNR", "PSNR"],
            "value": [10.0, 30.0],
        }
    )
    runs = {"defenses": ["none", "dcs2_one"], "attacks": ["ig"]}
    cells = reference_cells(reference, labels, runs)
    assert list(cells["defense"]) == ["dcs2_one", "none"]
    other = {"defenses": ["none", "dcs2"], "attacks": ["ig"]}
    assert list(reference_cells(reference, labels, other)["defense"]) == ["dcs2", "none"]


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


def test_a_claim_on_a_tables_accuracy_pairs_its_training_seeds(tmp_path):
    """Accuracy in an attack table comes from the defenses' training runs: the claim pairs them
    seed by seed (``<table>_training.csv``), model by model, not victim by victim."""
    seeds = pd.DataFrame.from_records(
        [
            {"dataset": "patches", "model": m, "defense": d, "seed": s, "accuracy": a + 0.3 * s}
            for m, gap in (("cnn3", -0.2), ("vit", -6.0))
            for d, base in (("none", 50.0), ("cvb", 50.0 + gap))
            for s, a in enumerate([base, base + 1.0, base - 1.0])
        ]
    )
    check = _check(
        metrics=["accuracy"],
        left="cvb",
        relation="not_below",
        tolerance=1.0,
        over=["dataset", "model"],
    )
    table = evaluate(_claims(tmp_path, check), {"t": VICTIMS}, "embedded", training={"t": seeds})
    row = table.iloc[0]
    assert row["verdict"] == "fails"  # the ViT loses 6 points, surely more than 1
    assert (row["holds_groups"], row["fails_groups"]) == (1, 1)  # the CNN keeps it
    assert "patches/vit: cvb − none −6 [−6, −6] (n 3 seeds): fails" in row["evidence"]
    missing = evaluate(_claims(tmp_path, check), {"t": VICTIMS}, "embedded")
    assert missing.loc[0, "verdict"] == "not evaluated"


def _files_in_the_stages_layout(claim):
    """Per-victim values (or a study's runs) and training values for ``claim``'s check, in the
    columns the stages write: its two sides (a third value for ``others``) in each selected
    group, 8 victims or 3 seeds, each value drawn at random."""
    check = claim.check
    rng = np.random.default_rng(len(claim.id))
    base = {"dataset": "patches", "model": "cnn3", "attack": "ig", "round": 0, "batch_size": 1}
    selected = {c: list(vs) for c, vs in {**check.where, **check.only_where}.items()}
    sides = [check.left, "other" if check.right == "others" else check.right]
    if check.right == "others":
        sides += [v for v in check.where.get(check.compare, ()) if v != check.left][:1]
    groups = [dict(zip(selected, vs, strict=True)) for vs in itertools.product(*selected.values())]
    seeded = is_utility(check.table) or all(training_scope(m) for m in check.metrics)
    metrics = list(check.metrics or ["accuracy"])
    rows = []
    for group, side, unit in itertools.product(groups, sides, range(3 if seeded else 8)):
        keys = {**base, **group, check.compare: side}
        values = {m: float(rng.uniform(0.1, 0.9)) for m in metrics}
        if seeded:
            columns = UTILITY_KEYS if is_utility(check.table) else SEED_COLUMNS
            row = {c: keys.get(c, "x") for c in columns} | {"seed": unit, "status": "ok"}
        else:
            row = {c: keys.get(c) for c in VICTIM_COLUMNS} | {"victim": unit, "status": "ok"}
            values |= {f"floor_{m}": 0.0 for m in metrics}
        rows.append(row | values)
    frame = pd.DataFrame.from_records(rows)
    if seeded and not is_utility(check.table):
        return pd.DataFrame(columns=list(VICTIM_COLUMNS)), frame
    return frame, None


def test_every_project_claim_is_evaluated_on_files_in_the_stages_layout():
    """Each claim of workflow/claims.yaml, on values in the columns the table and utility stages
    write, gets a verdict: none stops the claims job at the end of a long run, none finds
    nothing to compare."""
    claims = load_claims(REPO_ROOT / "workflow/claims.yaml")
    for claim in claims:
        frame, training = _files_in_the_stages_layout(claim)
        table = claim.check.table
        seeds = {} if training is None else {table: training}
        row = evaluate([claim], {table: frame}, "embedded", training=seeds).iloc[0]
        assert row["verdict"] in ("holds", "fails", "inconclusive"), (claim.id, row["reason"])
