"""Small utilities shared across cadence."""

from cadence.utils.reproducibility import seed_all

__all__ = ["seed_all"]
