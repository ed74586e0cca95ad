"""docs/extending.md's walk-through, followed as printed: its defense file, its `gradinv schema
--write`, its params.yaml and notes.yaml blocks give a configuration that validates and a defense
that does what its code says. A step the page leaves out, or a block that no longer fits the
schema, fails here."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml

from gradinv import config as config_module
from gradinv import methods
from gradinv.config import validate
from gradinv.config_files import read_config_file, safe_yaml
from gradinv.defenses import DEFENSES, build_defense
from gradinv.io import write_text
from gradinv.settings import ConfigError
from gradinv.table_inputs import ACROSS, report_category

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "extending.md"


def _blocks(language: str) -> list[str]:
    """The page's fenced blocks in ``language``, their indentation (a list item's) removed."""
    found = re.findall(rf"^( *)```{language}\n(.*?)^\1```", PAGE.read_text(), re.M | re.S)
    return ["\n".join(line[len(indent) :] for line in body.splitlines()) for indent, body in found]


def _register_the_pages_defense(tmp_path, monkeypatch) -> types.ModuleType:
    """Step 1: the page's defense file, imported as a module of gradinv.defenses (the import the
    page adds to its ``__init__.py``), which registers it."""
    (code,) = _blocks("python")
    path = tmp_path / "my_defense.py"
    write_text(path, code)
    name = "gradinv.defenses.my_defense"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def unregister():
    yield
    DEFENSES._entries.pop("my_defense", None)


def _with_the_pages_blocks(tmp_path, monkeypatch) -> dict:
    """Steps 4 and 5: params.yaml with the page's blocks added, notes.yaml with its notes."""
    params_block, notes_block = (safe_yaml(b) for b in _blocks("yaml"))
    config = read_config_file(ROOT / "params.yaml")
    for section in ("defenses", "tables"):
        config[section] |= params_block[section]
    notes = read_config_file(config_module.NOTES_PATH)
    notes["tables"] |= notes_block["tables"]
    notes_path = tmp_path / "notes.yaml"
    write_text(notes_path, yaml.safe_dump(notes))
    monkeypatch.setattr(config_module, "NOTES_PATH", notes_path)
    return config


def test_the_walk_through_gives_a_valid_configuration_and_a_working_defense(
    tmp_path, monkeypatch, unregister
):
    _register_the_pages_defense(tmp_path, monkeypatch)
    # Step 3, `gradinv schema --write`, in memory: the stored schemas are the registries' own.
    monkeypatch.setattr(methods, "stored", methods.generate)
    config = validate(_with_the_pages_blocks(tmp_path, monkeypatch), source="the walk-through")
    table = config["tables"]["mine_vs_ig"]
    assert table["defenses"] == ["none", "mine"] and table["no_reference"]
    assert report_category("mine_vs_ig") == ACROSS

    block = {k: v for k, v in config["defenses"]["mine"].items() if k not in ("kind", "label")}
    defense = build_defense("my_defense", block, where="defenses.mine")
    grads = {"w": torch.ones(3, 2), "b": torch.full((2,), 2.0)}
    shared = defense.transform(grads, torch.Generator().manual_seed(0))
    assert torch.allclose(shared["w"], torch.full((3, 2), 0.8))
    assert torch.allclose(shared["b"], torch.full((2,), 1.6))


def test_without_the_schema_step_the_configuration_is_refused_naming_it(
    tmp_path, monkeypatch, unregister
):
    """Skip step 3 (the stored schemas lack the new kind): validation refuses the block."""
    _register_the_pages_defense(tmp_path, monkeypatch)
    config = _with_the_pages_blocks(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match=r"'my_defense' is not one of .*gradinv schema --write"):
        validate(config, source="the walk-through")
