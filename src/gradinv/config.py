"""Loading and validating ``params.yaml``: the schema and variants (the checks across sections are
:mod:`gradinv.cross_checks`, sweeps :mod:`gradinv.sweeps`).

``params.yaml`` is Snakemake's configfile and DVC's params file. Its static structure is
``workflow/schemas/params.schema.yaml``; the settings of each dataset, model, defense and attack
are added to that schema from the frozen dataclasses beside their code (one declaration gives the
default, the bounds and the check). Validation runs before any job starts; an error names the key
and the fix. What each job reads of the validated config is :mod:`gradinv.jobs`.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from gradinv.config_files import read_config_file, safe_yaml
from gradinv.settings import ConfigError, settings_schema
from gradinv.sweeps import expand_sweeps

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout (the package is installed editable)
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "params.schema.yaml"


def project_root() -> Path:
    """The project: the Snakefile's folder (set by the Snakefile), else the CWD.

    The files params.yaml names for the user to supply and the MLflow store resolve against it,
    so a copy of the workflow in another folder (a test's tmp_path) keeps its runs to itself.
    """
    return Path(os.environ.get("GRADINV_PROJECT_ROOT") or Path.cwd()).resolve()


def run_root() -> Path:
    """Where a run writes: its ``results/``, ``data/`` and Snakemake's state (the config's
    ``run_dir``, set by the Snakefile, which also makes it the jobs' working directory), else the
    project root. Paths the pipeline records (a victim's file, a reconstruction) and the files of
    its own rules are relative to it; the files params.yaml names for the user to supply (raw
    datasets, published weights, the papers' reference numbers) are the project's."""
    return Path(os.environ.get("GRADINV_RUN_ROOT") or project_root()).resolve()


_NAMED = {"label": {"type": "string", "minLength": 1}}

# Every name a configuration gives (a table, model, defense, attack, generator, sweep, recipe, and
# the file names they become) matches NAME: it becomes a folder or file name under results/ and a
# word of the rules' command lines, so it can hold no path separator, no "..", no space and no
# shell character. A sweep's points are named <defense>-<setting><value> and may also hold "."
# (noise-std0.001): RUN_NAME. The Snakefile's wildcard constraints are the same two patterns.
NAME = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
RUN_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
NAME_HELP = (
    "a name is 1-64 letters, digits, '_' or '-', starting with a letter or digit "
    "(it becomes a file name under results/)"
)
# the sections whose keys are names
NAMED_SECTIONS = ("models", "defenses", "attacks", "generators", "sweeps", "tables", "recipes")
INT64_MAX = 2**63 - 1


def registries() -> dict[str, Any]:
    # Imported here: the registries pull in torch, which the schema alone does not need.
    from gradinv.attacks import ATTACKS
    from gradinv.data import DATASETS
    from gradinv.defenses import DEFENSES
    from gradinv.generators import GENERATORS
    from gradinv.models import MODELS

    return {
        "datasets": DATASETS,
        "models": MODELS,
        "defenses": DEFENSES,
        "attacks": ATTACKS,
        "generators": GENERATORS,
    }


# What a model's or a generator's block may say of the attacks on it: per attack kind, settings
# that replace the attack's own (more IG iterations on LeNet; GIFD's radii for StyleGAN2).
_ATTACK_SETTINGS = {
    "description": "per attack kind, settings that replace the attack's own for this block",
    "type": "object",
    "additionalProperties": {"type": "object"},
}

# What a defense's block may say of a malicious server's attack: per attack kind, settings the
# defense takes in that attack's captures (:func:`defense_block`).
_AGAINST = {
    "description": (
        "per malicious attack kind, settings merged over the defense's in that attack's captures"
        " only (DCS² against Imprint: {imprint: {alpha: 30, beta: 100, iterations: 100}})"
    ),
    "type": "object",
    "additionalProperties": {"type": "object"},
}

# The keys every generators.<name> block may have besides its kind's settings
# (gradinv.generators.files explains them).
_GENERATOR_KEYS = {
    **_NAMED,
    "datasets": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "label_map": {
        "type": "object",
        "additionalProperties": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    },
    "url": {"type": "string"},
    "local_path": {"type": "string"},
    "sha256": {"type": "string", "pattern": "^([0-9a-f]{64})?$"},
    "source": {"type": "string"},
    "attack_settings": _ATTACK_SETTINGS,
}


def methods_schema() -> dict[str, Any]:
    """Each registered method's settings as JSON schemas, built from the registries (which
    import torch). Stored with each method's facts by :mod:`gradinv.methods` (``gradinv schema
    --write``), so that validating a configuration, every Snakemake call's first step, does not
    load torch; ``tests/test_config.py`` fails when the stored copy is stale."""
    from gradinv.metrics.base import MetricSettings
    from gradinv.metrics.evaluation_network import EvaluationNetworkSettings

    regs = registries()
    kinds: dict[str, dict[str, Any]] = {}
    for section in ("models", "defenses", "attacks", "generators"):
        common = {
            "generators": _GENERATOR_KEYS,
            "models": {**_NAMED, "attack_settings": _ATTACK_SETTINGS},
            "defenses": {**_NAMED, "against": _AGAINST},
        }.get(section, _NAMED)
        kinds[section] = {
            kind: settings_schema(
                regs[section].get(kind).Settings, {"kind": {"const": kind}, **common}
            )
            for kind in regs[section].available()
        }
    methods = {
        "sources": {
            name: settings_schema(regs["datasets"].get(name).Settings, _NAMED)
            for name in regs["datasets"]
        },
        "evaluation_network": settings_schema(EvaluationNetworkSettings, _NAMED),
        "metrics": settings_schema(MetricSettings)["properties"],
        "kinds": kinds,
    }
    return json.loads(json.dumps(methods))  # as the stored copy reads: lists, not tuples


def full_schema() -> dict[str, Any]:
    """The static schema plus one sub-schema per registered method, from their stored copy
    (:mod:`gradinv.methods`: no torch)."""
    from gradinv.methods import stored

    schema = safe_yaml(SCHEMA_PATH.read_text())
    _no_repeats(schema)
    methods = stored()["schemas"]
    schema["properties"]["data"]["properties"]["sources"] |= {
        "properties": methods["sources"],
        "additionalProperties": False,
    }
    schema["properties"]["evaluation_network"] |= methods["evaluation_network"]
    # metrics: `names` is the static schema's; every other key is a MetricSettings field
    metrics = schema["properties"]["metrics"]
    metrics["properties"] = methods["metrics"] | metrics["properties"]
    for section, kinds in methods["kinds"].items():
        instance = schema["properties"][section]["additionalProperties"]
        instance["properties"]["kind"] = {"enum": list(kinds)}
        instance["allOf"] = [
            {"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]}, "then": then}
            for kind, then in kinds.items()
        ]
    return schema


def _no_repeats(schema: Any) -> None:
    """Every list of the static schema lists distinct things (a table's defenses, the metric
    names, the seeds...): a repeated entry is refused, not computed twice or dropped. (The
    methods' own settings may repeat values, GIFD's radii; their schema is not walked.)"""
    if isinstance(schema, dict):
        if schema.get("type") == "array":
            schema.setdefault("uniqueItems", True)
        for value in schema.values():
            _no_repeats(value)
    elif isinstance(schema, list):
        for item in schema:
            _no_repeats(item)


def check_values(config: Any, source: str, where: str = "") -> None:
    """Refuse what the schema's bounds cannot: NaN passes every comparison and an infinity
    every lower bound; an integer beyond 64 bits fits no tensor or seed. Also the names of
    sweep points, made from the values of the sweeps."""
    if isinstance(config, dict):
        for key, value in config.items():
            check_values(value, source, f"{where}.{key}" if where else str(key))
    elif isinstance(config, list):
        for i, value in enumerate(config):
            check_values(value, source, f"{where}[{i}]")
    elif isinstance(config, float) and not math.isfinite(config):
        raise ConfigError(
            f"{source}: {where}: {config!r} is not a number a setting can take; give a finite value"
        )
    elif isinstance(config, int) and not isinstance(config, bool) and abs(config) > INT64_MAX:
        raise ConfigError(
            f"{source}: {where}: {config} does not fit in 64 bits (seeds and sizes are 64-bit "
            f"integers); use a value between -{INT64_MAX} and {INT64_MAX}"
        )


def check_names(config: dict[str, Any], source: str) -> None:
    """The names the configuration gives match NAME (a defense's RUN_NAME: a validated
    configuration holds the sweeps' points among its defenses)."""
    for section in NAMED_SECTIONS:
        blocks = config.get(section)
        pattern = RUN_NAME if section == "defenses" else NAME
        for name in blocks if isinstance(blocks, dict) else ():
            if not (isinstance(name, str) and re.fullmatch(pattern, name)):
                raise ConfigError(
                    f"{source}: {section}.{name}: {name!r} is not a valid name: {NAME_HELP}; "
                    "rename it."
                )


def _describe(error: Any) -> str:  # a jsonschema.ValidationError
    where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    if error.validator == "uniqueItems":
        repeated = sorted({json.dumps(x) for x in error.instance if error.instance.count(x) > 1})
        return f"{where}: {', '.join(repeated)} appears more than once; list each once."
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        key = extra[0] if extra else "?"
        removed = error.schema.get("x-removed", {}).get(key)
        if removed is not None:
            prefix = "" if where == "(top level)" else f"{where}."
            return f"{prefix}{key}: this setting was removed ({removed}); delete the key."
        close = difflib.get_close_matches(key, allowed, n=1)
        fix = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(allowed)}."
        prefix = "" if where == "(top level)" else f"{where}."
        return f"{prefix}{key}: unknown key; {fix}"
    if error.validator == "enum":
        new = error.schema.get("x-renamed", {}).get(error.instance)
        if isinstance(error.instance, str) and new is not None:
            return f"{where}: {error.instance!r} was renamed; use {new!r}."
        close = difflib.get_close_matches(str(error.instance), map(str, error.validator_value))
        hint = f" Did you mean {close[0]!r}?" if close else ""
        if error.absolute_path and error.absolute_path[-1] == "kind" and not close:
            # the kinds are the stored copy's (gradinv.methods), not the registries'
            hint = (
                " A method added since workflow/schemas/methods.json was written? Register it "
                "and run `gradinv schema --write`."
            )
        return (
            f"{where}: {error.instance!r} is not one of "
            f"{', '.join(map(str, error.validator_value))}.{hint}"
        )
    if error.validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        word = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[
            error.validator
        ]
        return (
            f"{where}: {error.instance!r} is out of range; it must be {word} "
            f"{error.validator_value}."
        )
    if error.validator == "type":
        return f"{where}: {error.instance!r} has the wrong type; expected {error.validator_value}."
    return f"{where}: {error.message}"


def validate(
    config: dict[str, Any], source: str = "params.yaml", *, checked: Path | None = None
) -> dict[str, Any]:
    """Check ``config`` against the schema and the cross-references between its sections.

    Variants (``from:``) are resolved first, in place, so every consumer sees full blocks.
    The schema needs no torch (:func:`full_schema`); the cross-checks do (they ask the methods
    themselves: a model's layers, a dataset's labels). With ``checked`` (a folder) a
    configuration that passed the schema and the cross-checks is remembered there by its digest
    and the digest of gradinv's code and schemas, and is not checked again until either changes:
    Snakemake validates on every call (``-n``, ``--lint``, ``--report``), and only the first
    after a change loads torch.
    """
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: the configuration is not a mapping of params.yaml's keys")
    with_notes(config)
    check_values(config, source)
    for section in ("defenses", "attacks"):
        if isinstance(config.get(section), dict):
            resolve_variants(config[section], section, source)
    expand_sweeps(config, source)
    check_names(config, source)  # the sweeps' points among the defenses too
    # a configuration that passed every check below, with this very code and these schemas
    mark = None if checked is None else checked / _checks_digest(config)
    if mark is not None and mark.exists():
        return config
    import jsonschema  # here: a configuration checked before needs none of it

    validator = jsonschema.Draft202012Validator(full_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.path), list(e.path)))
    # An if/then failure also reports the bare "kind" mismatch; the specific one says more.
    errors = [e for e in errors if e.validator not in ("if", "allOf")]
    if errors:
        lines = "\n  ".join(_describe(e) for e in errors[:10])
        raise ConfigError(f"{source} is invalid:\n  {lines}\nFix these keys and rerun.")
    from gradinv.cross_checks import check_combinations, check_references  # they use this module

    check_references(config, source)
    check_combinations(config, source)
    if mark is not None:
        _remember(mark)
    return config


# The prose the results print (what a scaled-down run changed, why a table has no published
# numbers, where a paper's training recipe comes from), kept out of params.yaml, whose values
# are settings (`dvc params diff` lists them).
NOTES_PATH = REPO_ROOT / "workflow" / "notes.yaml"
NOTE_KEYS = ("scaled_down_note", "no_reference", "source")  # "source": a recipe's origin


def with_notes(config: dict[str, Any]) -> dict[str, Any]:
    """Fill, in place, each table's and study's notes from workflow/notes.yaml where the
    configuration does not give them (an overlay's own table may carry its own)."""
    notes = read_config_file(NOTES_PATH)
    named = ("tables", "recipes")  # sections of named blocks; the others are one block each
    blocks = [
        (config.get(section, {}).get(name), entry)
        for section in named
        for name, entry in notes.get(section, {}).items()
    ]
    blocks += [(config.get(study), notes[study]) for study in notes if study not in named]
    for block, entry in blocks:
        if isinstance(block, dict):
            for key in NOTE_KEYS:
                if key in entry:
                    block.setdefault(key, entry[key])
    return config


def _checks_digest(config: dict[str, Any]) -> str:
    """What the cross-checks' verdict depends on: the configuration and gradinv's own code
    (its Python files and the schemas)."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=repr).encode())
    package = Path(__file__).resolve().parent
    for path in sorted([*package.rglob("*.py"), *SCHEMA_PATH.parent.glob("*")]):
        digest.update(str(path.relative_to(REPO_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:32]


def _remember(mark: Path, keep: int = 32) -> None:
    """Mark a configuration as checked; keep the newest ``keep`` marks."""
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
        marks = sorted(mark.parent.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in marks[keep:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only project: check again next time


def resolve_variants(blocks: dict[str, Any], section: str, source: str) -> None:
    """Replace each block with ``from: base`` by the base's settings updated with its own keys.

    A variant of a variant is allowed; a cycle or an undefined base is an error. Resolution is
    in place, so a variant's jobs carry its full settings and rerun when its base changes.
    """

    def resolve(name: str, seen: tuple[str, ...]) -> dict[str, Any]:
        block = blocks[name]
        if not isinstance(block, dict) or "from" not in block:
            return block
        base = block["from"]
        if base in seen or base == name:
            raise ConfigError(
                f"{source}: {section}.{name}.from: the chain {' -> '.join((*seen, name, base))} "
                "is a cycle; point one of them at a block without `from`."
            )
        if base not in blocks:
            close = difflib.get_close_matches(str(base), blocks, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source}: {section}.{name}.from: {base!r} is not defined.{hint}")
        own = {k: v for k, v in block.items() if k != "from"}
        blocks[name] = merge(resolve(base, (*seen, name)), own)
        return blocks[name]

    for name in list(blocks):
        resolve(name, ())


#: The utility study's recipe (``utility.fl``), the same for every defense; a paper's recipe is
#: one of ``recipes``.
COMMON = "common"


def recipe_partition(config: dict[str, Any], recipe: str = COMMON) -> dict[str, Any]:
    """The clients of a recipe's runs: ``partition``, with the recipe's own merged over it where
    it has one (``recipes.<name>.partition``: CENSOR's non-IID clients)."""
    own = None if recipe == COMMON else config["recipes"][recipe].get("partition")
    return merge(config["partition"], own) if own else config["partition"]


def table_models(config: dict[str, Any], table: str) -> list[str]:
    """The models a table attacks: its ``model``, one name or a list (CVB's Table V)."""
    return models_of(config["tables"][table])


def models_of(spec: dict[str, Any]) -> list[str]:
    """A table block's ``model`` as a list of names."""
    return [spec["model"]] if isinstance(spec["model"], str) else list(spec["model"])


def table_rounds(config: dict[str, Any], table: str) -> list[int]:
    """The FL rounds a table attacks: its own ``rounds``, else ``capture.round``."""
    return list(config["tables"][table].get("rounds", [config["capture"]["round"]]))


def table_batch_size(config: dict[str, Any], table: str, attack: str | None = None) -> int:
    """The images in each victim's batch of ``table``, for ``attack`` where given: the table's
    ``batch_sizes`` for that attack (DCS²'s Imprint rows, batches of 4 beside DLG's and GS's 2),
    else its ``batch_size``, else ``capture.batch_size``."""
    spec = config["tables"][table]
    own = spec.get("batch_sizes", {}).get(attack) if attack is not None else None
    return int(own if own is not None else spec.get("batch_size", config["capture"]["batch_size"]))


def table_batch_sizes(config: dict[str, Any], table: str) -> list[int]:
    """Every batch size ``table`` attacks (one, unless its ``batch_sizes`` give an attack its
    own), smallest first."""
    attacks = config["tables"][table]["attacks"]
    return sorted({table_batch_size(config, table, a) for a in attacks})


def table_victims(config: dict[str, Any], table: str) -> int:
    """How many victims a table attacks: its own ``victims``, else ``capture.victims``."""
    return int(config["tables"][table].get("victims", config["capture"]["victims"]))


def load(path: str | Path = "params.yaml", overlays: tuple[str | Path, ...] = ()) -> dict[str, Any]:
    """Read ``path`` (and overlays, merged in order, as Snakemake's --configfile does); validate.

    Each file is read by :func:`gradinv.config_files.read_config_file`, the reader Snakemake
    uses too (:mod:`gradinv.config_guard`): data only, no repeated key, a mapping.
    """
    config: dict[str, Any] = {}
    for p in (path, *overlays):
        config = merge(config, read_config_file(p))
    return validate(config, source=" + ".join(str(p) for p in (path, *overlays)))


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict update (lists and scalars are replaced), like Snakemake's configfiles."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


#: The keys of an instance block that are not its method's settings: a model's
#: ``attack_settings`` are the attacks', a defense's ``against`` those it takes against a
#: malicious server's attack (:func:`defense_block`).
BOOKKEEPING = ("kind", "label", "attack_settings", "against")


def method_settings(instance: dict[str, Any]) -> dict[str, Any]:
    """An instance block without its bookkeeping keys: what the method's Settings receive."""
    return {k: v for k, v in instance.items() if k not in BOOKKEEPING}


def defense_block(
    config: dict[str, Any], defense: str, attack_kind: str | None = None
) -> dict[str, Any]:
    """Defense ``defense``'s block as a client runs it: without ``against``, and with
    ``against.<attack_kind>`` merged over it where the server is that malicious attack (DCS²
    tuned against Imprint: α 30, β 100, T 100, Appendix B.3). Every other job reads the block
    without ``against``, so that adding one reruns only that attack's captures and scores."""
    block = dict(config["defenses"][defense])
    against = block.pop("against", {})
    if attack_kind is not None and attack_kind in against:
        block |= against[attack_kind]
    return block
