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


@pytest.mark.parametrize(
    "registry", [DATASETS, MODELS, DEFENSES, ATTACKS, METRICS], ids=lambda r: r.kind
)
def test_every_registry_is_filled_on_import(registry):
    assert len(registry) >= 1
    for name in registry:
        assert registry.get(name) is not None
