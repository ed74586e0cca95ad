"""How a FedAvg client trains (gradinv.fl.client): the papers' codes' local optimizers, passes
over the shard, and the optimizer state a client keeps between its rounds; which clients apply
the defense (gradinv.fl.server, ``fl.defended_clients``)."""

import copy
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from gradinv.defenses import Defense, build_defense, gradients_of
from gradinv.fl.client import client_update
from gradinv.fl.server import FLSettings, train
from gradinv.models import build_model
from gradinv.protocol import ModelSpec
from gradinv.settings import ConfigError

SPEC = ModelSpec("cnn3", num_classes=4, in_channels=3, image_size=16, settings={})


def case(n=20):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def fedavg(model, batches, state=None, **kw):
    x, y = batches[0]
    return client_update(
        model,
        x,
        y,
        build_defense("none", {}, where="test"),
        protocol="fedavg",
        local_steps=1,
        local_lr=kw.pop("local_lr", 1e-3),
        generator=torch.Generator().manual_seed(0),
        batches=batches,
        optimizer_state=state,
        **kw,
    )


def test_an_adam_client_takes_adams_steps_over_its_batches_and_keeps_its_state():
    model = build_model(SPEC, seed=0)
    x, y = case()
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 20, 8)]  # 8, 8 and 4 images
    delta, local, state = fedavg(model, batches, client_optimizer="adam")
    # by hand: torch's Adam, one step per batch, on the client's copy
    manual = copy.deepcopy(model)
    adam = torch.optim.Adam(manual.parameters(), lr=1e-3)
    for bx, by in batches:
        grads = gradients_of(manual, bx, by, F.cross_entropy)
        for n, p in manual.named_parameters():
            p.grad = grads[n]
        adam.step()
    for (n, p), q in zip(model.named_parameters(), manual.parameters(), strict=True):
        torch.testing.assert_close(delta[n], q.detach() - p.detach(), rtol=1e-6, atol=1e-9)
    assert state["state"][0]["step"] == 3  # three steps, remembered for the client's next round
    # the next round starts from that state: it differs from a fresh optimizer's step
    fresh, _, _ = fedavg(local, batches[:1], client_optimizer="adam")
    kept, _, _ = fedavg(local, batches[:1], state=state, client_optimizer="adam")
    assert not all(torch.equal(fresh[n], kept[n]) for n in fresh)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in model.state_dict().items())


def test_momentum_is_kept_and_plain_sgd_has_no_state():
    model = build_model(SPEC, seed=0)
    x, y = case(8)
    _, _, state = fedavg(model, [(x, y)], momentum=0.9, local_lr=0.01)
    assert "momentum_buffer" in state["state"][0]
    delta, _, none = fedavg(model, [(x, y)], local_lr=0.01)
    assert none is None
    grads = gradients_of(copy.deepcopy(model), x, y, F.cross_entropy)
    for n, g in grads.items():  # plain SGD: the step written out, - lr x gradient
        torch.testing.assert_close(delta[n], -0.01 * g, rtol=1e-4, atol=1e-7)  # (p - lr g) - p


class _Recorded(Defense):
    """No defense, recording the batches it was asked to defend."""

    @dataclass(frozen=True)
    class Settings:
        pass

    def __init__(self) -> None:
        super().__init__(self.Settings())
        self.batches: list[torch.Tensor] = []

    def shared_update(self, model, inputs, labels, loss_fn, generator):
        self.batches.append(inputs)
        return gradients_of(model, inputs, labels, loss_fn)


def _fedsgd(defense, defended_clients=None):
    """Three FedSGD rounds of three clients of 12 images, every client every round."""
    x, y = case(36)
    parts = [list(range(0, 12)), list(range(12, 24)), list(range(24, 36))]
    fl = FLSettings(
        protocol="fedsgd",
        rounds=3,
        clients_per_round=3,
        batch_size=4,
        lr=0.1,
        local_steps=1,
        local_lr=0.0,
        eval_every=1,
        checkpoint_rounds=(0,),
        eval_samples=0,
        defended_clients=defended_clients,
    )
    model = build_model(SPEC, seed=0)
    train(model, x, y, parts, x, y, defense, fl, 0, lambda r, m: None)
    return model, x, parts


def test_only_the_defended_clients_apply_the_defense():
    """DCS²'s code defends one client of ten (fl/main.py: DevNum == Pro_dev); the others share
    undefended updates. Every client listed is the same as all of them."""
    recorded = _Recorded()
    _, x, parts = _fedsgd(recorded, defended_clients=(1,))
    assert len(recorded.batches) == 3  # client 1, once a round
    for batch in recorded.batches:
        rows = [i for i in range(len(x)) if any(torch.equal(x[i], b) for b in batch)]
        assert len(rows) == 4 and set(rows) <= set(parts[1])
    noise = {"std": 0.5}
    every, _, _ = _fedsgd(build_defense("gaussian_noise", noise, where="test"))
    listed, _, _ = _fedsgd(
        build_defense("gaussian_noise", noise, where="test"), defended_clients=(0, 1, 2)
    )
    one, _, _ = _fedsgd(build_defense("gaussian_noise", noise, where="test"), defended_clients=(1,))
    state = every.state_dict()
    assert all(torch.equal(state[k], v) for k, v in listed.state_dict().items())
    assert not all(torch.equal(state[k], v) for k, v in one.state_dict().items())


def test_defended_clients_outside_the_partition_or_with_a_model_defense_are_refused():
    with pytest.raises(ConfigError, match=r"client 3 is not one of the partition's 3 clients"):
        _fedsgd(_Recorded(), defended_clients=(1, 3))
    precode = build_defense("precode", {}, where="test")
    with pytest.raises(ConfigError, match=r"Precode changes the model every client trains"):
        _fedsgd(precode, defended_clients=(1,))
