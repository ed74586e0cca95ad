import subprocess
import sys

import pytest

from gradinv.attacks import ATTACKS
from gradinv.data import DATASETS
from gradinv.defenses import DEFENSES
from gradinv.metrics import METRICS
from gradinv.models import MODELS
from gradinv.registry import Registry, RegistryError


def test_duplicate_name_is_an_error():
    reg: Registry[object] = Registry("widget")
    reg.register("a")(object)
    with pytest.raises(RegistryError, match="registered twice"):
        reg.register("a")(int)


def test_unknown_name_suggests_close_matches():
    reg: Registry[object] = Registry("widget")
    reg.register("gaussian_noise")(object)
    with pytest.raises(RegistryError, match="Did you mean 'gaussian_noise'"):
        reg.get("gausian_noise")


# What importing each package alone must register (more is welcome: a new method adds itself).
EXPECTED = {
    ("gradinv.attacks", "ATTACKS"): {
        "cpl", "dlg", "ggl", "gias", "gifd", "gradinversion", "idlg", "imprint",
        "inverting_gradients",
    },
    ("gradinv.defenses", "DEFENSES"): {
        "censor", "clipping", "cvb", "dcs2", "dp_sgd", "gaussian_noise", "laplace_noise", "none",
        "precode", "quantization", "refiner", "soteria", "sparsification",
    },
    ("gradinv.data", "DATASETS"): {
        "cifar10", "cifar100", "digits", "ffhq", "imagenet", "mnist", "patches", "svhn",
    },
    ("gradinv.models", "MODELS"): {"cnn3", "convnet", "lenet", "resnet18", "vit"},
    ("gradinv.metrics", "METRICS"): {"lpips", "mse", "noise_ratio", "psnr", "ssim"},
}  # fmt: skip


@pytest.mark.parametrize(("package", "name"), EXPECTED, ids=[n for _, n in EXPECTED])
def test_every_registry_is_filled_on_import(package, name):
    """In a fresh interpreter, importing the package alone registers each of its methods: none
    depends on another test module having imported its file first."""
    code = f"import {package} as p; print(' '.join(sorted(p.{name}.available())))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(out.stdout.split()) >= EXPECTED[(package, name)]
    registry = {"ATTACKS": ATTACKS, "DEFENSES": DEFENSES, "DATASETS": DATASETS}.get(name)
    registry = registry or {"MODELS": MODELS, "METRICS": METRICS}[name]
    assert set(registry.available()) == set(out.stdout.split())  # and the same in this process
