"""Small helpers the stages share: seeds, threads, provenance records."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gradinv.config import REPO_ROOT, project_root, run_root
from gradinv.io import sha256_json
from gradinv.protocol import ModelSpec

if TYPE_CHECKING:
    from gradinv.defenses import Defense


def setup(settings: dict[str, Any]) -> None:
    """Torch uses the job's threads (Snakemake sets OMP_NUM_THREADS from the rule's ``threads``)."""
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    deterministic_algorithms()
    full_float32()
    eager_optimizers()


def full_float32() -> None:
    """Float32 arithmetic on GPUs, not TF32: PyTorch lets cuDNN run float32 convolutions in TF32
    (10-bit mantissas) by default, and gradient matching is sensitive to it. Measured on an H200
    (docs/runs/2026-11-26-gpu-h200.md): with TF32, IG's batched and sequential restarts parted
    after 60 iterations (767 of 768 pixels apart, another best restart); in float32 they agreed
    as on the CPU, at no measurable cost at batch 1. No effect on the CPU."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def deterministic_algorithms() -> None:
    """Deterministic kernels, warning where an op has none.

    ``torch.use_deterministic_algorithms`` also imports ``torch._inductor`` to set the compiler's
    copy of the flag: 3.3 s in every job on CPU, more than the import of torch itself. No stage
    compiles, so the eager flag is set directly unless the compiler is already loaded.
    """
    if "torch._inductor" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=True)


def eager_optimizers() -> None:
    """torch.optim without the compiler's front end, which cost a job about 2 s here.

    torch.optim imports ``torch._dynamo`` (and with it sympy and torch.distributed) for
    ``torch.compile``, which no stage runs: an optimizer's constructor calls methods wrapped in
    ``torch._disable_dynamo``, which import it on their first call, and every ``step`` is wrapped in
    ``_use_grad_for_differentiable``, which imports it to mark graph breaks that do nothing outside
    a compiled graph (``benchmarks/optimizer_import.py`` measures the cost). Each such wrapper in
    torch.optim gets its eager meaning beforehand: a ``_disable_dynamo`` wrapper the function it
    caches after its first call (the function itself, as nothing compiles), a step wrapper a copy
    that sets autograd as it does, without the graph breaks. The arithmetic stays torch's own
    (tests/test_startup.py compares SGD, Adam and L-BFGS with torch's unchanged). A wrapper of
    another shape (another torch release) is left alone and imports the compiler as before, and
    nothing is changed once the compiler is loaded.
    """
    if "torch._dynamo" in sys.modules:
        return
    from torch._compile import _disable_dynamo
    from torch.optim.optimizer import _use_grad_for_differentiable

    disabled = _disable_dynamo(_nothing).__code__
    graph_breaks = _use_grad_for_differentiable(_nothing).__code__
    for name, module in list(sys.modules.items()):
        if name != "torch.optim" and not name.startswith("torch.optim."):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and issubclass(value, torch.optim.Optimizer):
                for attribute, member in list(vars(value).items()):
                    if getattr(member, "__code__", None) is graph_breaks:
                        setattr(value, attribute, _eager_step(member.__wrapped__))
                    _resolve(member, disabled, depth=3)
            else:
                _resolve(value, disabled, depth=3)


def _nothing() -> None:
    """A function to wrap, to learn the code object of torch's wrappers."""


def _resolve(function: object, disabled: types.CodeType, depth: int) -> None:
    """Give every ``_disable_dynamo`` wrapper in ``function`` (and what it wraps or closes over,
    ``depth`` levels down) its own function as the eager one it would cache on its first call."""
    if not isinstance(function, types.FunctionType) or depth == 0:
        return
    cells = dict(zip(function.__code__.co_freevars, function.__closure__ or (), strict=True))
    if function.__code__ is disabled:
        wrapped = cells["fn"].cell_contents
        if getattr(wrapped, "__dynamo_disable", None) is None:
            setattr(wrapped, "__dynamo_disable", wrapped)
    for cell in cells.values():
        try:
            _resolve(cell.cell_contents, disabled, depth - 1)
        except ValueError:  # a cell not filled yet
            continue
    _resolve(getattr(function, "__wrapped__", None), disabled, depth - 1)


def _eager_step(step: Callable[..., Any]) -> Callable[..., Any]:
    """An optimizer's ``step`` as torch's ``_use_grad_for_differentiable`` runs it, less the graph
    breaks: autograd on only for a differentiable optimizer, and as it was afterwards."""

    @functools.wraps(step)
    def eager_step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return step(self, *args, **kwargs)

    return eager_step


def derive_seed(seed: int, *parts: object) -> int:
    """A seed for one job from the global seed and the job's identity (stable across runs)."""
    text = json.dumps([seed, *map(str, parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def job_identity(out: str | Path) -> str:
    """A job's output path relative to the run's folder, as Snakemake writes it: what a job's
    seed derives from, so that ``results/x``, ``./results/x`` and ``/abs/run/results/x`` give one
    seed wherever the run writes (a path outside the run's folder stays as it was given)."""
    path = Path(out)
    try:
        return path.resolve().relative_to(run_root()).as_posix()
    except ValueError:
        return path.as_posix()


def public_split(settings: dict[str, Any], ds: Any, partition: Path, who: str) -> list[int]:
    """The indices of the public split of ``ds`` (no client holds them), from a partition made
    from this very version of the dataset; ``who`` names what trains on it, for the error."""
    from gradinv.data import read_partition, read_public
    from gradinv.settings import ConfigError

    _, meta = read_partition(partition, len(ds.train_labels))
    if meta.get("data_sha256") != ds.sha256:
        raise RuntimeError(
            f"{partition} was made from another version of {ds.name}; "
            "rerun snakemake to regenerate it"
        )
    public = read_public(partition, len(ds.train_labels))
    if not public:
        fraction = settings["partition"].get("public_fraction", 0)
        raise ConfigError(
            f"{who}: there is no public data of {ds.name} to train on (partition.public_fraction"
            f" is {fraction}); set partition.public_fraction above 0"
        )
    return public


def first_scored_pair(
    row: dict[str, Any], reconstruction: dict[str, Any], secret: dict[str, Any]
) -> tuple[Tensor, Tensor | None]:
    """The first private image the scoring stage scored and the reconstruction it was matched
    to (``None`` if the attack failed): the pair a figure shows for one run. The batch's first
    image is not it where the defense protects some samples only (DCS²: ``scored_samples``) or
    the Hungarian matching put another reconstruction against it (``matching``)."""
    original = first_scored_original(row, secret)
    if reconstruction["status"] != "ok" or row.get("status") != "ok":
        return original, None
    matching = row.get("matching") or list(range(len(row.get("scored_samples") or [0])))
    return original, reconstruction["images"][matching[0]]


def first_scored_original(row: dict[str, Any], secret: dict[str, Any]) -> Tensor:
    """The first private image the scoring stage scored (see :func:`first_scored_pair`)."""
    return secret["images"][(row.get("scored_samples") or [0])[0]]


def update_lr(fl: dict[str, Any]) -> float:
    """The learning rate of the step a client's update drives (FedSGD: the server's)."""
    return fl["lr"] if fl["protocol"] == "fedsgd" else fl["local_lr"]


def model_spec(model: dict[str, Any], num_classes: int, image_shape: tuple[int, ...]) -> ModelSpec:
    settings = {k: v for k, v in model.items() if k not in ("kind", "label")}
    return ModelSpec(
        name=model["kind"],
        num_classes=num_classes,
        in_channels=image_shape[0],
        image_size=image_shape[1],
        settings=settings,
    )


def record(settings: dict[str, Any], data_sha256: str) -> dict[str, Any]:
    """What produced a result: git commit, config hash, data hash, seed."""
    from gradinv.tracking import provenance

    prov = provenance(REPO_ROOT)  # the code that ran, wherever it ran
    return {
        "git_commit": prov.get("git_commit", "unknown"),
        "git_dirty": prov.get("git_dirty"),
        "config_hash": sha256_json(settings),
        "data_sha256": data_sha256,
        "seed": settings["seed"],
        "scale": settings["scale"],
    }


def project_path(path: str | Path) -> Path:
    """A file params.yaml names for the user to supply (a paper's reference numbers)."""
    path = Path(path)
    return path if path.is_absolute() else project_root() / path


def run_path(path: str | Path) -> Path:
    """A file of the run: one the pipeline wrote and recorded (a victim, a reconstruction)."""
    path = Path(path)
    return path if path.is_absolute() else run_root() / path


def victim_runs(files: list[Path], n: int) -> list[tuple[Path, int, dict[str, Any]]]:
    """Victims 0 to n - 1 from the capture or attack jobs' files, each of which holds a run of
    victims (``{"victims": [...], "runs": [...]}``, a capture file also the ``server`` message
    every run shares): (file, index in it, run) per victim, a capture's run with its server."""
    from gradinv.io import load_tensors

    found: list[tuple[Path, int, dict[str, Any]]] = []
    for path in files:
        data = load_tensors(path)
        shared = {"server": data["server"]} if data.get("server") is not None else {}
        for index, (victim, run) in enumerate(zip(data["victims"], data["runs"], strict=True)):
            if victim != len(found):
                raise ValueError(
                    f"{path} holds victim {victim} where victim {len(found)} was expected: pass "
                    "the jobs' files in the victims' order"
                )
            found.append((path, index, run if run.get("status") == "failed" else run | shared))
    if len(found) < n:
        raise ValueError(f"{n} victims asked for, {len(found)} found in {len(files)} files")
    return found[:n]


def load_reconstruction(row: dict[str, Any]) -> dict[str, Any]:
    """The attack result a score record was made from (its ``reconstruction`` file holds the
    runs of several victims; ``reconstruction_index`` says which)."""
    from gradinv.io import load_tensors

    return load_tensors(run_path(row["reconstruction"]))["runs"][row["reconstruction_index"]]


def client_defense(
    settings: dict[str, Any],
    mean: tuple[float, ...],
    std: tuple[float, ...],
    update_lr: float,
    public: Callable[[Any], tuple[Tensor, Tensor]],
) -> Defense:
    """The defense a client runs, built from a train or capture job's settings with what it
    needs: the dataset's normalization, the public pool (``public(settings)``, called only when
    the defense's settings use one) and Refiner's evaluation network (the job's file)."""
    from gradinv.config import method_settings
    from gradinv.defenses import DEFENSES, build_defense, defense_settings
    from gradinv.metrics.evaluation_network import load_evaluation_network

    block, where = settings["defense"], f"defenses.{settings['defense_name']}"
    kind = block["kind"]
    chosen = defense_settings(kind, method_settings(block), where)
    cls = DEFENSES.get(kind)
    network = None
    if cls.needs_evaluation_network:
        network = load_evaluation_network(run_path(settings["evaluation_network"]))
    return build_defense(
        kind,
        method_settings(block),
        where=where,
        update_lr=update_lr,
        public=public(chosen) if cls.uses_public(chosen) else None,
        normalization=(tuple(mean), tuple(std)),
        evaluation_network=network,
    )


def training_client(
    settings: dict[str, Any], ds: Any, update_lr: float
) -> tuple[Defense, ModelSpec]:
    """A training job's client defense, with the prepared dataset's public pool (CENSOR's and
    DCS²'s public images), and the model the server trains and distributes: the job's model,
    extended by an architectural defense (PRECODE, CVB)."""
    from dataclasses import replace

    from gradinv.config import method_settings
    from gradinv.data.prepared import public_pool
    from gradinv.protocol import normalize

    where = f"defenses.{settings['defense_name']}"

    def public(chosen: Any) -> tuple[Tensor, Tensor]:
        images, labels = public_pool(ds, chosen.public_class, chosen.public_images, where=where)
        return normalize(images, ds.mean, ds.std), labels

    defense = client_defense(settings, ds.mean, ds.std, update_lr, public)
    spec = model_spec(settings["model"], ds.num_classes, ds.image_shape)
    if defense.architectural:
        block = settings["defense"]
        spec = replace(spec, extension={"kind": block["kind"], "settings": method_settings(block)})
    return defense, spec
