"""Seeding and deterministic mode for reproducible runs.

Source: MosaicML Composer's ``composer/utils/reproducibility.py`` (``seed_all``,
``get_random_seed``, ``configure_deterministic_mode``, ``get_rng_state``,
``load_rng_state``, ``seed_context``, ``MAX_SEED``: same names and behaviour). The RNG
states a checkpoint holds are :mod:`cadence.utils.rng`'s.
"""

from __future__ import annotations

import contextlib
import os
import random
import warnings
from typing import Any, Iterator

import numpy as np
import torch

from cadence.utils import dist
from cadence.utils.rng import get_rng_state as local_state
from cadence.utils.rng import set_rng_state

__all__ = ["MAX_SEED", "configure_deterministic_mode", "get_random_seed", "get_rng_state",
           "load_rng_state", "seed_all", "seed_context"]

#: cuBLAS needs a fixed workspace for deterministic matmuls (CUDA >= 10.2); PyTorch's
#: "Reproducibility" notes name this value.
_CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def configure_deterministic_mode() -> None:
    """Make PyTorch use deterministic algorithms only (Composer's helper).

    Sets ``torch.use_deterministic_algorithms(True)`` (an op without a deterministic
    implementation then raises ``RuntimeError``), turns cuDNN autotuning off
    (``torch.backends.cudnn.benchmark = False``) and sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
    for deterministic cuBLAS. Call it before the model and the Trainer are built. Warns (a
    ``UserWarning``) that runs will be slower. Undo with
    ``torch.use_deterministic_algorithms(False)``.
    """
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = _CUBLAS_WORKSPACE_CONFIG
    # Composer's words (it logs them): its users' warning filters match this prefix
    warnings.warn("Deterministic mode is activated. This will negatively impact performance "
                  "(configure_deterministic_mode: deterministic kernels only).", UserWarning,
                  stacklevel=2)


def get_random_seed() -> int:
    """A fresh random seed in ``[0, 2**32)``, drawn from torch's global generator (so a
    seeded process draws the same one; Composer's helper). The Trainer uses one when it is
    given no ``seed``."""
    return int(torch.empty((), dtype=torch.int64).random_(to=2**32).item())


def seed_all(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (CPU and every CUDA device) with ``seed``.

    Raises:
        ValueError: ``seed`` is outside ``[0, 2**32)`` (NumPy's range).
    """
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}.")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


#: The largest seed :func:`seed_all` takes (NumPy's limit): ``2**32 - 1``.
MAX_SEED = 2**32 - 1


def get_rng_state() -> list[dict[str, Any]]:
    """Every rank's RNG states (Python, NumPy, torch CPU and CUDA), indexed by global rank
    (Composer's; a collective on several ranks). Each entry holds only tensors and plain
    values (:func:`cadence.utils.rng.get_rng_state`), so it saves with
    ``torch.save`` and loads with ``weights_only=True``."""
    return dist.all_gather_object(local_state())



def load_rng_state(rng_state_dicts: list[dict[str, Any]]) -> None:
    """Restore this rank's entry of :func:`get_rng_state`'s list. With more ranks than
    entries, the ranks past the end keep their state; with fewer, the extra entries are
    unused; either way a ``UserWarning`` says so.

    Raises:
        ValueError: ``rng_state_dicts`` is empty.
    """
    if not rng_state_dicts:
        raise ValueError("load_rng_state needs the list get_rng_state() returned; got none.")
    world, rank = dist.get_world_size(), dist.get_global_rank()
    if world != len(rng_state_dicts):
        warnings.warn(f"load_rng_state: {len(rng_state_dicts)} RNG state(s) for {world} "
                      f"rank(s); ranks without one keep their state, extra states are unused.",
                      UserWarning, stacklevel=2)
    if rank < len(rng_state_dicts):
        set_rng_state(rng_state_dicts[rank])


@contextlib.contextmanager
def seed_context(seed: int) -> Iterator[None]:
    """Run the block with every RNG seeded by ``seed`` (:func:`seed_all`), then put back the
    states from before it, so the code around it draws as if the block had not run."""
    saved = local_state()
    seed_all(seed)
    try:
        yield
    finally:
        set_rng_state(saved)
