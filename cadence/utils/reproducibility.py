"""Seeding for reproducible runs."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["seed_all"]


def seed_all(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (CPU and every CUDA device) with ``seed``.

    Raises:
        ValueError: ``seed`` is outside ``[0, 2**32)`` (NumPy's range).
    """
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}.")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
