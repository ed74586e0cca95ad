"""Image generators for the generative-prior attacks, registered by kind (see base.py).

``dcgan``: a class-conditional DCGAN the pipeline trains on the attacker's public split
(rule ``train_generator``). ``biggan``: BigGAN-deep through pytorch-pretrained-biggan.
``stylegan2``: StyleGAN2 in plain PyTorch, loading rosinality-format ``g_ema`` checkpoints.
"""

from __future__ import annotations

from gradinv.generators.base import Context, Generator, WeightsError, verified_weights
from gradinv.registry import Registry

GENERATORS: Registry[type[Generator]] = Registry("generator")

from gradinv.generators import biggan, dcgan, stylegan2  # noqa: E402, F401

__all__ = ["GENERATORS", "Context", "Generator", "WeightsError", "verified_weights"]
