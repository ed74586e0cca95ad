"""Stage: check the papers' claims (``workflow/claims.yaml``) against this run's result files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from gradinv.claims import (
    evaluate,
    is_utility,
    load_claims,
    markdown,
    reference_cells,
    result_file,
    training_file,
)
from gradinv.claims.verdicts import VERDICTS
from gradinv.io import atomic_path, write_text
from gradinv.stages.common import project_path
from gradinv.tables.html import write_markdown_page
from gradinv.tables.render import write_csv


def run(settings: dict[str, Any], claims_file: Path, results_dir: Path, out_dir: Path) -> None:
    """Write ``claims.csv``, ``claims.md``, ``claims.html`` (the report's page) and
    ``claims_summary.json`` (the count of each verdict and of the decided claims, holds or
    fails, for `dvc metrics show`); a claim on a table this run does not build is reported as
    not evaluated, never dropped."""
    claims = load_claims(claims_file)
    built = {c.check.table for c in claims} & set(settings["tables"])
    files = {table: result_file(table, results_dir) for table in built}
    results = {table: pd.read_csv(path) for table, path in files.items() if path.exists()}
    missing = {
        table: f"{path} does not exist: build it first (snakemake {path})"
        for table, path in files.items()
        if not path.exists()
    }
    published = {
        table: reference_cells(
            pd.read_csv(project_path(csv)),
            settings["labels"],
            settings.get("reference_runs", {}).get(table),
        )
        for table, csv in settings.get("references", {}).items()
    }
    # every table's victims: where the floor checks find each undefended attack
    victims = [
        pd.read_csv(path)
        for t in settings["tables"]
        if not is_utility(t) and (path := result_file(t, results_dir)).exists()
    ]
    undefended = pd.concat(victims, ignore_index=True) if victims else None
    training = {
        table: pd.read_csv(path)
        for table in built
        if not is_utility(table)
        if (path := training_file(table, results_dir)).exists()
    }
    table = evaluate(claims, results, settings["scale"], published, missing, undefended, training)
    write_csv(table, out_dir / "claims.csv")
    text = markdown(table, settings["scale"])
    with atomic_path(out_dir / "claims.md") as tmp:
        tmp.write_text(text, encoding="utf-8")
    write_markdown_page(out_dir / "claims.html", title="The papers' claims", markdown_text=text)
    counts = table["verdict"].value_counts()
    summary = {verdict: int(counts.get(verdict, 0)) for verdict in VERDICTS}
    summary["decided"] = summary["holds"] + summary["fails"]
    write_text(out_dir / "claims_summary.json", json.dumps(summary, indent=1) + "\n")
