"""The files a table or the claims read: every per-victim run of a table (each once, whatever
runs two of its cells share), the utility runs behind its accuracy and PMM, and the result files
the claims are checked on. The rules in ``workflow/rules/`` and :mod:`gradinv.jobs` list inputs
with these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gradinv.adaptive import as_run_against, attack_runs
from gradinv.config import (
    COMMON,
    table_batch_size,
    table_batch_sizes,
    table_models,
    table_rounds,
    table_victims,
)
from gradinv.methods import fact
from gradinv.sensitive import BATCH, rule_of, scores_whole_batch, whole_batch
from gradinv.settings import ConfigError
from gradinv.sweeps import table_runs

TRAINING_METRICS = ("accuracy", "pmm")  # the table metrics read from FL training runs


def table_files(config: dict[str, Any], table: str, stage: str, ext: str) -> list[str]:
    """Every per-victim file of ``stage`` (attacks, captures) that table ``table`` reads: each
    (dataset, model, run, round, attack run, victim) once. A sweep point at its base's value
    reads the base's runs (:func:`gradinv.sweeps.table_runs`), an adaptive attack with nothing
    to adapt to against a defense the plain attack's (:func:`gradinv.adaptive.attack_runs`)."""
    return [
        f"results/{stage}/{d}/{m}/{run}/r{r}_b{bs}/{a}/victim{v}.{ext}"
        for d, m, run, r, bs, a, v in _table_runs(config, table)
    ]


def table_score_files(config: dict[str, Any], table: str) -> list[str]:
    """The scores a table reads: one file per cell (dataset, model, run, round, attack run)
    holding its first n victims' records, n the table's victims (``v{n}.json``); each once."""
    n = table_victims(config, table)
    cells = dict.fromkeys(
        f"results/metrics/{d}/{m}/{run}/r{r}_b{bs}/{a}/v{n}.json"
        for d, m, run, r, bs, a, _ in _table_runs(config, table)
    )
    return list(cells)


def table_attack_files(config: dict[str, Any], table: str) -> list[str]:
    """The attack jobs' files behind a table's cells (``victims_per_job`` victims a file), each
    once: for a stage whose numbers come from the reconstructions themselves, not their scores
    (Fig. 10's drift toward the public images)."""
    from gradinv.jobs import victim_groups  # gradinv.jobs builds on this module

    groups = victim_groups(table_victims(config, table), config["victims_per_job"])
    files = dict.fromkeys(
        f"results/attacks/{d}/{m}/{run}/r{r}_b{bs}/{a}/victims{first}-{last}.pt"
        for d, m, run, r, bs, a, _ in _table_runs(config, table)
        for first, last in groups
    )
    return list(files)


UNDEFENDED = "none"


def undefended_score_files(config: dict[str, Any], table: str) -> list[str]:
    """For a table without an undefended row: the score files of other tables' undefended runs
    of its attacks (the same dataset, model, batch size, attack settings and samples scored,
    those of a DCS² defense in it; its round, else the earliest attacked one), which its
    Markdown reads to say whether each attack works at
    all. Empty for a table with one (its own runs say it)."""
    spec = config["tables"][table]
    if UNDEFENDED in table_runs(config, table):
        return []
    index = _undefended_index(config)
    on = _protection(config, table)[0]  # on the samples its rows are scored on
    files = []
    for d in spec["datasets"]:
        for m in table_models(config, table):
            for a in spec["attacks"]:
                bs = table_batch_size(config, table, a)
                scoring = _rule_text(_at_batch_size(on, bs))
                key = (d, m, str(bs), _undefended_settings(config, a), scoring)
                rounds = index.get(key, {})
                for r in table_rounds(config, table):
                    found = rounds.get(str(r)) or (rounds[min(rounds, key=int)] if rounds else None)
                    if found:
                        files.append(found)
    return list(dict.fromkeys(files))


def _undefended_settings(config: dict[str, Any], attack: str) -> str:
    block = as_run_against(config["attacks"][attack], config["defenses"][UNDEFENDED])
    return json.dumps({k: v for k, v in block.items() if k != "label"}, sort_keys=True)


_UNDEFENDED: dict[int, tuple[dict[str, Any], dict[tuple[str, ...], dict[str, str]]]] = {}


def _undefended_index(config: dict[str, Any]) -> dict[tuple[str, ...], dict[str, str]]:
    """Every table's undefended score files by (dataset, model, batch size, attack settings, the
    samples scored), then round: the first table (in params.yaml's order) that runs each."""
    cached = _UNDEFENDED.get(id(config))
    if cached is not None and cached[0] is config:
        return cached[1]
    index: dict[tuple[str, ...], dict[str, str]] = {}
    for table, spec in config["tables"].items():
        if UNDEFENDED not in table_runs(config, table):
            continue
        n, on = table_victims(config, table), _protection(config, table)[0]
        for d in spec["datasets"]:
            for m in table_models(config, table):
                for a in attack_runs(config, UNDEFENDED, spec["attacks"]):
                    bs = table_batch_size(config, table, a)
                    scoring = _rule_text(_at_batch_size(on, bs))
                    key = (d, m, str(bs), _undefended_settings(config, a), scoring)
                    rounds = index.setdefault(key, {})
                    for r in table_rounds(config, table):
                        rounds.setdefault(
                            str(r), f"results/metrics/{d}/{m}/{UNDEFENDED}/r{r}_b{bs}/{a}/v{n}.json"
                        )
    _UNDEFENDED[id(config)] = (config, index)
    return index


def table_victim_files(config: dict[str, Any], table: str) -> list[str]:
    """The private batch behind each entry of :func:`table_files` (same order)."""
    return [
        f"results/victims/{d}/b{bs}/victim{v}.pt"
        for d, _, _, _, bs, _, v in _table_runs(config, table)
    ]


def _table_runs(config: dict[str, Any], table: str) -> list[tuple[Any, ...]]:
    spec = config["tables"][table]
    attacks = {run: attack_runs(config, run, spec["attacks"]) for run in table_runs(config, table)}
    return [
        (d, m, run, r, table_batch_size(config, table, a), a, v)
        for d in spec["datasets"]
        for m in table_models(config, table)
        for run in attacks
        for r in table_rounds(config, table)
        for a in attacks[run]
        for v in range(table_victims(config, table))
    ]


def scored_on(config: dict[str, Any], cell: tuple[Any, ...]) -> dict[str, Any] | str | None:
    """The samples of each victim's batch that the score job of ``cell`` (dataset, model, run,
    round, batch size, attack run) scores: None, the whole batch (or, for a defense that
    protects some samples only, those: its capture says which); else the defense of the tables
    reading the cell that protects some samples only (DCS²), ``{"defense", "kind", "rule"}``
    (``rule``: its settings that say which, :func:`gradinv.sensitive.sensitive_samples`), where
    they are not every sample. A table compares its defenses on the same images,
    so its other defenses are scored on the samples that one protects. ``BATCH``: every sample,
    that defense's own runs too (a table with ``scored: batch``)."""
    return _scored_cells(config).get(tuple(str(k) for k in cell))


def check_scored_samples(config: dict[str, Any]) -> None:
    """Raise the ``ConfigError`` :func:`scored_on` would raise at the first score job: called
    when the workflow is built (:func:`gradinv.pipeline.validated`), so that no job runs first."""
    _scored_cells(config)


_SCORED: dict[int, tuple[dict[str, Any], dict[tuple[str, ...], dict[str, Any] | None]]] = {}


def _scored_cells(config: dict[str, Any]) -> dict[tuple[str, ...], dict[str, Any] | None]:
    """:func:`scored_on` for the cells of the tables with a defense that protects some samples
    only and of any table reading the same runs (those of no other table are scored whole),
    computed once per config; a table whose defenses protect different samples, or a cell two
    tables would score differently, is a ``ConfigError`` naming them and the fix."""
    cached = _SCORED.get(id(config))
    if cached is not None and cached[0] is config:
        return cached[1]
    tables = {table: _protection(config, table) for table in config["tables"]}
    # the runs (without attacks: an adaptive attack's runs may need a defense's class, torch)
    # that some table scores on fewer samples
    partial = {r for t, (on, _) in tables.items() if on is not None for r in _runs(config, t)}
    cells: dict[tuple[str, ...], tuple[str, dict[str, Any] | str | None]] = {}
    for table, (on_table, protecting) in tables.items():
        whole = scores_whole_batch(config["tables"][table])
        if on_table is None and not (whole and protecting) and not partial & _runs(config, table):
            continue
        for d, m, run, r, bs, a, _ in _table_runs(config, table):
            key = tuple(str(k) for k in (d, m, run, r, bs, a))
            # a DCS² run: its capture says which samples, unless the table scores them all
            on = (BATCH if whole else None) if run in protecting else _at_batch_size(on_table, bs)
            if key in cells and _rule_text(cells[key][1]) != _rule_text(on):
                other, before = cells[key]
                raise ConfigError(
                    f"tables {other} and {table} both read the runs of {'/'.join(key)} but score "
                    f"them on different samples ({_rule_text(before)}; {_rule_text(on)}): give "
                    "one of them another batch_size, so that each reads runs of its own"
                )
            cells.setdefault(key, (table, on))
    mapping = {key: on for key, (_, on) in cells.items()}
    _SCORED[id(config)] = (config, mapping)
    return mapping


def _protection(config: dict[str, Any], table: str) -> tuple[dict[str, Any] | None, set[str]]:
    """The samples ``table`` scores its defenses on (None: the whole batch, also with
    ``scored: batch``; else its DCS² defense's, as :func:`scored_on` gives them, the whole batch
    at a batch size where they are every sample: :func:`_at_batch_size`) and its runs that
    protect some samples only."""
    protecting = {}
    for run in table_runs(config, table):
        block = config["defenses"][run]
        fields = fact("defenses", block["kind"], "protects_samples_by") or ()
        if fields:
            rule = rule_of({f: block[f] for f in fields if f in block})
            protecting[run] = {"defense": run, "kind": block["kind"], "rule": rule}
    rules = {_rule_text(p) for p in protecting.values()}
    if len(rules) > 1:
        raise ConfigError(
            f"tables.{table}: its defenses {', '.join(protecting)} protect different samples "
            f"of a batch ({'; '.join(sorted(rules))}), and a table compares its defenses on "
            "the same images: give them the same settings, or put them in tables of their own"
        )
    on = next(iter(protecting.values()), None)
    sizes = table_batch_sizes(config, table)
    if on is not None and all(whole_batch(on["rule"], bs) for bs in sizes):
        on = None  # it protects every sample: the whole batch (one image of one)
    if scores_whole_batch(config["tables"][table]):
        on = None
    return on, set(protecting)


def _at_batch_size(on: dict[str, Any] | None, batch_size: Any) -> dict[str, Any] | None:
    """The samples ``on`` names in a batch of ``batch_size``: None (the whole batch) where it
    names every one (one image of one)."""
    if on is not None and whole_batch(on["rule"], int(batch_size)):
        return None
    return on


def _runs(config: dict[str, Any], table: str) -> set[tuple[str, ...]]:
    """The (dataset, model, run, round, batch size) whose runs ``table`` reads."""
    spec = config["tables"][table]
    return {
        tuple(str(k) for k in (d, m, run, r, bs))
        for d in spec["datasets"]
        for m in table_models(config, table)
        for run in table_runs(config, table)
        for r in table_rounds(config, table)
        for bs in table_batch_sizes(config, table)
    }


def _rule_text(on: dict[str, Any] | str | None) -> str:
    if on is None:
        return "the whole batch"
    if on == BATCH:
        return "every sample of the batch, those its defense protects and the others"
    return f"the samples {on['kind']} protects under {json.dumps(on['rule'], sort_keys=True)}"


def table_utility_runs(config: dict[str, Any], table: str) -> list[str]:
    """The training runs a table reads when it shows what its defenses cost (metrics accuracy or
    pmm), under the table's ``recipe`` (default ``common``: the utility study's FL setting): one
    per dataset, model, run the table reads (a shared sweep point's base) and seed
    (``utility.seeds``), and no defense's for PMM."""
    spec = config["tables"][table]
    if not shows_training(spec):
        return []
    defenses = list(dict.fromkeys([*table_runs(config, table), "none"]))
    recipe = spec.get("recipe", COMMON)
    return [
        f"results/utility/{recipe}/{d}/{m}/{f}/seed{s}/summary.json"
        for d in spec["datasets"]
        for m in table_models(config, table)
        for f in defenses
        for s in config["utility"]["seeds"]
    ]


def shows_training(spec: dict[str, Any]) -> bool:
    """Whether a table block shows what its defenses cost (metrics accuracy or pmm), read from
    FL training runs under its recipe."""
    return bool(set(spec.get("metrics", ())) & set(TRAINING_METRICS))


def trained_datasets(config: dict[str, Any]) -> dict[str, list[str]]:
    """The datasets each recipe's training runs train on, by recipe (``common`` first): the
    utility study's under every recipe (results/utility.csv, each utility_<recipe>.csv), and
    the datasets of each table that shows accuracy or PMM under the table's recipe
    (:func:`table_utility_runs`). The data stage prepares their partitions, and the cross-checks
    check each recipe's batch size against its clients there."""
    trained = {r: {config["utility"]["dataset"]} for r in [COMMON, *config.get("recipes", {})]}
    for spec in config["tables"].values():
        if shows_training(spec):
            trained[spec.get("recipe", COMMON)].update(spec["datasets"])
    return {recipe: sorted(datasets) for recipe, datasets in trained.items()}


def claim_tables(config: dict[str, Any]) -> list[str]:
    """The results a claim may be checked on: every attack table, the utility study (the
    common recipe) and each paper's recipe's utility runs (``utility_<recipe>``)."""
    return [*config["tables"], "utility", *(f"utility_{r}" for r in config.get("recipes", {}))]


def claim_values(config: dict[str, Any], table: str) -> dict[str, set[str]]:
    """What a claim can compare in ``table``'s result, by column: its defenses (a sweep point by
    its own name, shared run or not), attacks and rounds; a utility study's defenses only."""
    if table == "utility":
        return {"defense": set(config["utility"]["defenses"])}
    if table.startswith("utility_"):
        return {"defense": set(config["recipes"][table.removeprefix("utility_")]["defenses"])}
    spec = config["tables"][table]
    return {
        "defense": set(spec["defenses"]),
        "attack": set(spec["attacks"]),
        "round": {str(r) for r in table_rounds(config, table)},
    }


def claim_inputs(config: dict[str, Any], claims_file: str | Path) -> list[str]:
    """The result files the claims in ``claims_file`` read, of the tables this config builds,
    and every attack table's per-victim values, where the floor checks find each undefended
    attack (:mod:`gradinv.claims.paired`)."""
    from gradinv.claims import is_utility, load_claims, result_file, training_file
    from gradinv.tables.aggregate import training_scope

    claims = load_claims(claims_file)
    tables = {c.check.table for c in claims} & set(claim_tables(config))
    tables |= {t for t in claim_tables(config) if not is_utility(t)}
    seeded = {
        c.check.table
        for c in claims
        if c.check.metrics and all(training_scope(m) for m in c.check.metrics)
    } & {t for t in tables if not is_utility(t)}
    files = [result_file(t) for t in tables] + [training_file(t) for t in seeded]
    return sorted(str(f) for f in files)


# Where a result sits in the browsable report (``snakemake --report``): a category per paper,
# in the order the papers are reproduced, then the studies across papers. A table is its paper's
# by the prefix of its name; any other (``frontier_runs``, ``data_centric``, a table of your own)
# is filed with the studies across papers.
CENSOR = "CENSOR (NDSS 2025)"
PAPERS = {
    "table": CENSOR,  # CENSOR's tables and figures keep the paper's own numbering
    "fig": CENSOR,
    "censor_": CENSOR,
    "refiner_": "Refiner (USENIX Security 2025)",
    "cvb_": "CVB: Convolutional Variational Bottlenecks",
    "dcs2_": "DCS²: Concealing Sensitive Samples",
}
ACROSS = "Across papers: utility, frontier, claims"


def report_category(table: str) -> str:
    """The report's category of ``table``: its paper, or the studies across papers."""
    return next((paper for prefix, paper in PAPERS.items() if table.startswith(prefix)), ACROSS)


def report_subcategory(config: dict[str, Any], table: str) -> str:
    """The report's subcategory of ``table``: what its title names before the colon, with the
    paper's name left out (``Table I``), or the table's name."""
    title = str(config["tables"].get(table, {}).get("title", table))
    head = title.split(":")[0]
    short = head
    for paper in (CENSOR, "Refiner (USENIX Security 2025)", "CVB", "DCS²"):
        short = short.replace(paper, "")
    short = short.strip()
    return short if short.startswith(("Table", "Figure", "Section")) else head.strip() or table
