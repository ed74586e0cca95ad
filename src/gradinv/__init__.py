"""gradinv: gradient inversion attacks and defenses in federated learning, reproducibly."""

__version__ = "0.1.0"
