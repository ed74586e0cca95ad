"""LPIPS, the learned perceptual distance (Zhang, Isola, Efros, Shechtman & Wang, CVPR 2018,
arXiv:1801.03924), via the ``lpips`` package (v0.1 linear layers).

CENSOR reports LPIPS with the VGG backbone ("LPIPS↑"; its code also computes AlexNet, the
``lpips`` default), so VGG is the default here and ``MetricSettings.lpips_net="alex"`` selects
AlexNet. Inputs are scaled to ``[-1, 1]`` as the package expects; with ``space="normalized"`` the
mean/std-normalized tensors are fed instead, as CENSOR's code does. One-channel images are
repeated to three channels.

Offline by construction. The linear layers ship inside the ``lpips`` wheel, but the backbone is
torchvision's ImageNet model, which ``lpips`` would download on first use. Here it never does:
the network is built with a random backbone (``pnet_rand=True``, which downloads nothing), and
the backbone is then overwritten from a local file that is verified first, so a value is never
computed with random weights. The file is torchvision's own checkpoint (its URL is pinned below, as
torchvision's weight enum gives it: a test checks the two agree, and importing torchvision only
to read a name would cost every scoring job 4 s), looked up at ``metrics.lpips_weights_path`` or, if
that is empty, in the torch hub cache ``$TORCH_HOME/hub/checkpoints/``. Its sha256 must start with
the hash in torchvision's file name (``vgg16-397923af.pth``), the check torchvision itself makes
on download. When the file is missing or fails the check, the metric is *unavailable*: it returns
``None`` with the reason and warns loudly (``logging`` and ``warnings``), and no value is made up.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import Tensor, nn

from gradinv.io import sha256_file
from gradinv.metrics import METRICS
from gradinv.metrics.base import ImageMetric, MetricSettings, MetricValues, Stats, to_space

log = logging.getLogger(__name__)

# Pairs per forward pass: bounds memory when Hungarian matching asks for all N^2 pairs.
CHUNK = 32

# Each backbone's torchvision weight enum, and the URL its IMAGENET1K_V1 weights carry.
_TORCHVISION_WEIGHTS = {
    "vgg": ("VGG16_Weights", "https://download.pytorch.org/models/vgg16-397923af.pth"),
    "alex": ("AlexNet_Weights", "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth"),
}


class LPIPSUnavailableWarning(UserWarning):
    """LPIPS cannot be computed here: its backbone weights are missing or fail verification."""


@dataclass(frozen=True)
class BackboneSpec:
    """torchvision's checkpoint of one LPIPS backbone: file name, source and hash prefix."""

    net: str
    filename: str
    url: str
    hash_prefix: str


def backbone_spec(net: str) -> BackboneSpec:
    """The checkpoint torchvision downloads for ``net``'s ImageNet weights."""
    _, url = _TORCHVISION_WEIGHTS[net]
    filename = os.path.basename(urlparse(url).path)  # the name torch.hub caches it under
    match = torch.hub.HASH_REGEX.search(filename)
    if match is None or not match.group(1):
        raise RuntimeError(f"torchvision's {net} checkpoint {filename!r} carries no hash.")
    return BackboneSpec(net=net, filename=filename, url=url, hash_prefix=match.group(1))


def hub_checkpoint_path(spec: BackboneSpec) -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / spec.filename


# sha256 of a (path, size, mtime) already read: hashing VGG16's 528 MB once per process is enough.
_DIGESTS: dict[tuple[str, int, int], str] = {}
# Ready networks, one per (backbone, file, device): building and loading one takes seconds.
_NETWORKS: dict[tuple[str, str, int, int, str], nn.Module] = {}


def _file_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def locate_backbone(net: str, weights_path: str = "") -> tuple[Path | None, str]:
    """The verified backbone file, or ``None`` and why not (a sentence naming the fix)."""
    spec = backbone_spec(net)
    configured = bool(weights_path)
    path = Path(weights_path).expanduser() if configured else hub_checkpoint_path(spec)
    where = "metrics.lpips_weights_path" if configured else "the torch hub cache"
    fix = (
        f"Put torchvision's {spec.filename} (from {spec.url}) at {hub_checkpoint_path(spec)}, "
        f"or set metrics.lpips_weights_path to that file."
    )
    if not path.is_file():
        return None, f"backbone weights {spec.filename} not found at {path} ({where}). {fix}"
    key = _file_key(path)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    digest = _DIGESTS[key]
    if not digest.startswith(spec.hash_prefix):
        return None, (
            f"backbone weights at {path} have sha256 {digest[:12]}..., which does not "
            f"start with {spec.hash_prefix} as torchvision's {spec.filename} does "
            f"(truncated or a different file). {fix}"
        )
    return path, "ok"


def _package_linear_layers(net: str) -> Path:
    import lpips

    return Path(lpips.__file__).parent / "weights" / "v0.1" / f"{net}.pth"


def build_network(net: str, path: Path) -> nn.Module:
    """``lpips.LPIPS`` with the backbone loaded from the verified file ``path``.

    Every backbone tensor is taken from the file (a strict load), so none keeps its random
    initialization; the linear layers are checked against the wheel's file, because ``lpips``
    loads them with ``strict=False`` and would silently keep random ones on a key mismatch.
    """
    import lpips

    lin_path = _package_linear_layers(net)
    if not lin_path.is_file():
        raise FileNotFoundError(
            f"the lpips package lacks its linear-layer weights {lin_path}; reinstall lpips."
        )
    with warnings.catch_warnings():
        # lpips 0.1.4 still passes torchvision's deprecated ``pretrained=False``; harmless here.
        warnings.filterwarnings(
            "ignore", message=".*(pretrained|weight enum).*", category=UserWarning
        )
        model = lpips.LPIPS(net=net, pretrained=True, pnet_rand=True, verbose=False)
    own = model.state_dict()
    for key, value in torch.load(lin_path, map_location="cpu", weights_only=True).items():
        if key not in own or not torch.equal(own[key], value):
            raise RuntimeError(f"lpips did not load its linear layer {key!r} from {lin_path}.")

    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    backbone = {}
    for key in model.net.state_dict():  # "slice1.0.weight": slice, torchvision index, tensor
        _, index, param = key.split(".")
        source = f"features.{index}.{param}"
        if source not in checkpoint:
            raise RuntimeError(f"{path} has no {source!r}: not a torchvision {net} checkpoint.")
        backbone[key] = checkpoint[source]
    model.net.load_state_dict(backbone, strict=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def get_network(net: str, path: Path, device: torch.device) -> nn.Module:
    """The cached network for ``(net, file, device)``, built on first use in this process."""
    key = (net, *_file_key(path), str(device))
    if key not in _NETWORKS:
        _NETWORKS[key] = build_network(net, path).to(device)
    return _NETWORKS[key]


def _as_lpips_input(
    x: Tensor, settings: MetricSettings, mean: Stats | None, std: Stats | None
) -> Tensor:
    x = to_space(x.detach().float(), settings, mean, std)
    if settings.space == "unit":
        x = 2 * x - 1  # lpips expects [-1, 1] (what its normalize=True would do)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)  # the backbones take RGB; grey is R = G = B
    return x


@METRICS.register("lpips")
class LPIPS(ImageMetric):
    name = "lpips"
    label = "LPIPS"
    defender_direction = "up"
    best = 0.0
    reports_status = True

    def per_image(
        self,
        recon: Tensor,
        orig: Tensor,
        settings: MetricSettings,
        mean: Stats | None = None,
        std: Stats | None = None,
    ) -> MetricValues:
        path, reason = locate_backbone(settings.lpips_net, settings.lpips_weights_path)
        if path is None:
            message = (
                f"LPIPS ({settings.lpips_net}) is unavailable and is recorded as None: {reason}"
            )
            log.warning(message)
            warnings.warn(message, LPIPSUnavailableWarning, stacklevel=2)
            return MetricValues(None, f"unavailable: {reason}")
        model = get_network(settings.lpips_net, path, recon.device)
        x = _as_lpips_input(recon, settings, mean, std)
        y = _as_lpips_input(orig, settings, mean, std)
        values: list[float] = []
        with torch.no_grad():
            for start in range(0, x.shape[0], CHUNK):
                d = model(x[start : start + CHUNK], y[start : start + CHUNK], normalize=False)
                values.extend(d.flatten().double().tolist())
        if not all(map(math.isfinite, values)):
            raise FloatingPointError(f"LPIPS produced non-finite values {values}.")
        return MetricValues(values)
