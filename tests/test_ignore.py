"""The CVB paper's "Ignore" attack (Section III-B): ``ignore_layers: ["@stochastic"]`` leaves out
the gradients of a variational bottleneck's decoder and of every later layer, found by probing
the model, and so restores the reconstruction the bottleneck's noise prevented."""

import torch
import torch.nn.functional as F
from torch import nn

from gradinv.attacks import ThreatModel, build_attack
from gradinv.models import build_model, stochastic_parameters
from gradinv.protocol import ModelSpec, PublicMeta, ServerMessage, SharedUpdate, normalize
from test_attacks import MEAN, STD, photo_patch, psnr


class Bottleneck(nn.Module):
    """A PRECODE-style variational bottleneck: encoder -> z = mu + sigma * eps -> decoder."""

    def __init__(self, features: int, size: int) -> None:
        super().__init__()
        self.encoder = nn.Linear(features, 2 * size)
        self.decoder = nn.Linear(size, features)

    def forward(self, h):
        mu, s = self.encoder(h).chunk(2, -1)
        return self.decoder(mu + F.softplus(s) * torch.randn_like(mu))


def bottlenecked_cnn():
    """Two strided convolutions, the bottleneck, the classifier (PRECODE's placement)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 16, 5, padding=2, stride=2),
            nn.LeakyReLU(),
            nn.Conv2d(16, 32, 5, padding=2, stride=2),
            nn.LeakyReLU(),
            nn.Flatten(),
            Bottleneck(32 * 16, 64),
            nn.LeakyReLU(),
            nn.Linear(32 * 16, 10),
        ).eval()


def bottlenecked_case():
    """The model, one 16x16 photograph (label 2, known), the server's message and its gradient."""
    model, x, y = bottlenecked_cnn(), photo_patch(16)[None], torch.tensor([2])
    loss = F.cross_entropy(model(normalize(x, MEAN, STD)), y)
    named = list(model.named_parameters())
    grads = torch.autograd.grad(loss, [p for _, p in named])
    meta = PublicMeta("t", 1, (3, 16, 16), 10, MEAN, STD, "eval", "none", "none", {}, labels=(2,))
    update = SharedUpdate({n: g for (n, _), g in zip(named, grads, strict=True)}, "gradient", meta)
    server = ServerMessage(ModelSpec("bottlenecked", 10, 3, 16, {}), model.state_dict(), 0)
    return model, x, server, update


BEFORE = ["0.weight", "0.bias", "2.weight", "2.bias", "5.encoder.weight", "5.encoder.bias"]
AFTER = ["5.decoder.weight", "5.decoder.bias", "7.weight", "7.bias"]


def test_the_probe_finds_the_decoder_and_every_later_layer():
    model = bottlenecked_cnn()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    assert stochastic_parameters(model, (3, 16, 16)) == set(AFTER)
    assert torch.equal(torch.get_rng_state(), rng)  # the global random state is untouched
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_a_deterministic_model_has_no_stochastic_layers():
    for name, settings in [("cnn3", {}), ("resnet18", {"width": 8})]:
        model = build_model(ModelSpec(name, 10, 3, 16, settings), seed=0)
        assert stochastic_parameters(model.eval(), (3, 16, 16)) == set()
        assert stochastic_parameters(model.train(), (3, 16, 16)) == set()  # batch norm: not random


def test_ignore_and_layers_resolve_the_pattern():
    model = bottlenecked_cnn()
    threat = ThreatModel(labels="known")
    ignoring = build_attack("inverting_gradients", {"ignore_layers": ["@stochastic"]}, threat, "a")
    assert [n for n, _ in ignoring.matched_parameters(model, (3, 16, 16))] == BEFORE
    only = build_attack("dlg", {"layers": ["@stochastic"]}, threat, "a")
    assert [n for n, _ in only.matched_parameters(model, (3, 16, 16))] == AFTER


def test_ignoring_the_stochastic_layers_restores_the_reconstruction():
    """Measured (seeds 0-2, 500 iterations): 15.7-16.4 dB ignoring them, 5.8-6.1 dB matching all."""
    model, x, server, update = bottlenecked_case()
    quality = {}
    for ignore in ([], ["@stochastic"]):
        settings = {"iterations": 500, "restarts": 1, "ignore_layers": ignore}
        attack = build_attack("inverting_gradients", settings, ThreatModel(labels="known"), "a")
        attack.server_model = lambda _server, _device=None: model  # the wrapped architecture
        result = attack.reconstruct(server, update, torch.Generator().manual_seed(0))
        quality[tuple(ignore)] = psnr(result.images, x)
    assert attack.matched_names == BEFORE
    assert quality[("@stochastic",)] > quality[()] + 5


def test_restarts_of_a_model_that_draws_in_its_forward_run_in_both_layouts():
    """vmap draws anew for each restart (randomness "different"), as the loop does."""
    model, _x, server, update = bottlenecked_case()
    for layout in ("batched", "sequential"):
        settings = {"iterations": 3, "restarts": 2, "restarts_layout": layout}
        settings["ignore_layers"] = ["@stochastic"]
        attack = build_attack("inverting_gradients", settings, ThreatModel(labels="known"), "a")
        attack.server_model = lambda _server, _device=None: model
        result = attack.reconstruct(server, update, torch.Generator().manual_seed(0))
        assert result.summary["restarts_layout"] == layout
        assert torch.isfinite(result.images).all()


def precode_case():
    """The 3-layer CNN extended by the registered PRECODE defense, as the pipeline builds it: the
    server's message carries the extension, the victim's gradient includes the KL term."""
    from gradinv.defenses import build_defense

    settings = {"size": 64}
    spec = ModelSpec("cnn3", 10, 3, 16, {}, extension={"kind": "precode", "settings": settings})
    model = build_model(spec, seed=0).eval()
    x, y = photo_patch(16)[None], torch.tensor([2])
    defense = build_defense("precode", settings, "d")
    grads = defense.shared_update(
        model, normalize(x, MEAN, STD), y, F.cross_entropy, torch.Generator().manual_seed(0)
    )
    meta = PublicMeta(
        "t", 1, (3, 16, 16), 10, MEAN, STD, "eval", "precode", "precode", settings, labels=(2,)
    )
    return x, ServerMessage(spec, model.state_dict(), 0), SharedUpdate(grads, "gradient", meta)


def test_the_probe_finds_the_registered_bottlenecks_decoders_and_every_later_layer():
    later = {"2.weight", "2.bias", "4.weight", "4.bias", "7.weight", "7.bias"}
    after = {
        # PRECODE before the classifier (7): its decoder and the classifier
        ("precode", ()): {"7.0.decoder.weight", "7.0.decoder.bias", "7.1.weight", "7.1.bias"},
        # PRECODE after the first convolution block (CVB's Table IV): every later layer too
        ("precode", (("position", "1"),)): {"1.1.decoder.weight", "1.1.decoder.bias"} | later,
        # CVB after the first convolution block (0, 1): its decoder (no bias) and every later layer
        ("cvb", ()): {"1.1.decoder.weight"} | later,
    }
    for (kind, settings), expected in after.items():
        extension = {"kind": kind, "settings": dict(settings)}
        spec = ModelSpec("cnn3", 10, 3, 16, {}, extension=extension)
        assert stochastic_parameters(build_model(spec, seed=0).eval(), (3, 16, 16)) == expected


def test_the_ignore_attack_restores_the_reconstruction_through_precode():
    """The attacker rebuilds the extended model from the server's message (no override) and adds
    the bottleneck's KL to its dummy loss, as the client did. Measured (seeds 0-1, 500
    iterations): 17.1-17.9 dB ignoring the stochastic layers, 5.7-5.8 dB matching all."""
    x, server, update = precode_case()
    quality = {}
    for ignore in ([], ["@stochastic"]):
        settings = {"iterations": 500, "restarts": 1, "ignore_layers": ignore}
        attack = build_attack("inverting_gradients", settings, ThreatModel(labels="known"), "a")
        result = attack.reconstruct(server, update, torch.Generator().manual_seed(0))
        quality[tuple(ignore)] = psnr(result.images, x)
    assert quality[("@stochastic",)] > quality[()] + 5, quality
