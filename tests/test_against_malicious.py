"""A table that attacks with a malicious server at its own batch size, and defenses that take
their own settings against it: DCS²'s Table 1 attacks DLG and GS on batches of 2 and Imprint on
batches of 4, with DCS² tuned against Imprint (α 30, β 100, T 100) and its baselines at Table
10's Imprint column (Appendix B.3)."""

from __future__ import annotations

import copy
import json

import pytest

from gradinv.config import REPO_ROOT, load, validate
from gradinv.jobs import job_settings
from gradinv.settings import ConfigError
from gradinv.table_inputs import (
    table_files,
    table_score_files,
    table_victim_files,
    undefended_score_files,
)


@pytest.fixture(scope="module")
def base():
    return load(REPO_ROOT / "params.yaml")


def _settings(config, stage, **w):
    return json.loads(job_settings(config, stage, **w))


def _revalidated(config, change):
    """``config`` before validation resolved its variants, changed by ``change``."""
    raw = copy.deepcopy(config)
    change(raw)
    return validate(raw)


CELL = {"dataset": "patches", "model": "lenet", "round": "0", "first": "0", "last": "7"}


def test_a_table_attacks_an_attack_at_its_own_batch_size(base):
    files = table_files(base, "dcs2_table1", "attacks", "pt")
    imprint = [f for f in files if "/imprint/" in f]
    honest = [f for f in files if "/imprint/" not in f]
    assert imprint and all("/r0_b4/" in f for f in imprint)
    assert honest and all("/r0_b2/" in f for f in honest)
    victims = table_victim_files(base, "dcs2_table1")
    assert {f.split("/")[3] for f, a in zip(victims, files, strict=True) if "/imprint/" in a} == {
        "b4"
    }
    scores = table_score_files(base, "dcs2_table1")
    assert "results/metrics/patches/lenet/dcs2_plus_one/r0_b4/imprint/v24.json" in scores
    assert "results/metrics/patches/lenet/dcs2_plus_one/r0_b2/dlg/v24.json" in scores
    table = _settings(base, "table", table="dcs2_table1")
    assert table["capture"]["batch_size"] == 2 and table["capture"]["batch_sizes"] == {"imprint": 4}


def test_a_table_without_an_undefended_row_reads_the_undefended_run_at_each_attacks_size(base):
    # DCS²'s Table 4 has no undefended row: Table 1's say whether each attack works at all
    files = undefended_score_files(base, "dcs2_table4")
    assert "results/metrics/patches/lenet/none/r0_b4/imprint/v24.json" in files
    assert "results/metrics/patches/lenet/none/r0_b2/dlg/v24.json" in files
    assert not any("r0_b2/imprint" in f for f in files)


def test_a_table_with_one_batch_size_keeps_its_settings_as_they_were(base):
    table = _settings(base, "table", table="table1")
    assert "batch_sizes" not in table["capture"]


def test_a_defense_takes_its_settings_against_imprint_in_imprints_captures_only(base):
    against = _settings(base, "capture", defense="dcs2_plus_one", bs="4", attack="imprint", **CELL)
    honest = _settings(base, "capture", defense="dcs2_plus_one", bs="2", **CELL)
    picked = ("alpha", "beta", "iterations")
    assert [against["defense"][k] for k in picked] == [30.0, 100.0, 100]
    assert [honest["defense"][k] for k in picked] == [0.1, 0.001, 50]
    assert against["defense"]["projection"] is True  # DCS²+ itself, only retuned
    assert "against" not in against["defense"] and "against" not in honest["defense"]
    # the baselines at Table 10's Imprint column
    prune = _settings(base, "capture", defense="sparsi_dcs2", bs="4", attack="imprint", **CELL)
    assert prune["defense"]["prune"] == 0.3
    assert _settings(base, "capture", defense="sparsi_dcs2", bs="2", **CELL)["defense"][
        "prune"
    ] == pytest.approx(0.7)
    # the scores record the settings the capture ran under
    w = {k: CELL[k] for k in ("dataset", "model", "round")}
    scored = _settings(base, "score", defense="dcs2_one", bs="4", attack="imprint", **w)
    assert scored["defense"]["alpha"] == 30.0
    assert _settings(base, "score", defense="dcs2_one", bs="2", attack="dlg", **w)["defense"][
        "alpha"
    ] == pytest.approx(0.1)


def test_settings_against_imprint_rerun_nothing_but_imprints_captures_and_scores(base):
    without = _revalidated(base, lambda c: c["defenses"]["dcs2_one"].pop("against"))
    train = {"dataset": "patches", "model": "lenet", "defense": "dcs2_one"}
    assert job_settings(base, "train", **train) == job_settings(without, "train", **train)
    honest = {**CELL, "defense": "dcs2_one", "bs": "2"}
    assert job_settings(base, "capture", **honest) == job_settings(without, "capture", **honest)
    malicious = {**honest, "bs": "4", "attack": "imprint"}
    assert job_settings(base, "capture", **malicious) != job_settings(
        without, "capture", **malicious
    )


def test_settings_against_an_honest_servers_attack_are_refused(base):
    def against_dlg(c):
        c["defenses"]["dcs2"]["against"] = {"dlg": {"alpha": 1.0}}

    with pytest.raises(ConfigError, match=r"defenses\.dcs2\.against\.dlg: 'dlg' is not the kind"):
        _revalidated(base, against_dlg)


def test_a_setting_the_defense_lacks_is_named_where_it_is_given(base):
    def unknown(c):
        c["defenses"]["sparsi_dcs2"]["against"] = {"imprint": {"alpha": 1.0}}

    with pytest.raises(ConfigError, match=r"defenses\.sparsi_dcs2\.against\.imprint"):
        _revalidated(base, unknown)


def test_a_batch_size_for_an_attack_the_table_does_not_run_is_refused(base):
    def stray(c):
        c["tables"]["table1"]["batch_sizes"] = {"imprint": 4}

    with pytest.raises(ConfigError, match=r"tables\.table1\.batch_sizes: 'imprint' is not one"):
        _revalidated(base, stray)


def test_the_tables_setting_line_names_the_attack_with_its_own_batch_size(base):
    from gradinv.stages.report import _batch_sizes

    table = _settings(base, "table", table="dcs2_table1")
    attacks = table["attacks_by_model"]["lenet"]
    assert _batch_sizes(table["capture"], attacks) == "2 (Imprint: 4)"
    one = _settings(base, "table", table="table1")
    assert _batch_sizes(one["capture"], one["attacks_by_model"]["cnn3"]) == "1"
