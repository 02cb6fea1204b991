"""Distributed helpers with single-process defaults (re-exported as ``cadence.dist``).

Ranks are read from ``torch.distributed`` when a process group exists, else from the
environment variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``...), so
they work before the process group is created. Names follow Composer's ``composer.utils.dist``.
"""

from __future__ import annotations

import os

import torch.distributed as torch_dist

__all__ = ["get_global_rank", "get_world_size", "get_local_rank", "get_local_world_size",
           "get_node_rank", "is_available", "is_initialized"]


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"Environment variable {name}={value!r} must be an integer.") from None


def is_available() -> bool:
    """Whether ``torch.distributed`` is built in."""
    return torch_dist.is_available()


def is_initialized() -> bool:
    """Whether a default process group exists."""
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_global_rank() -> int:
    """This process's rank among all processes (0 without a process group or ``RANK``)."""
    if is_initialized():
        return torch_dist.get_rank()
    return _env_int("RANK", 0)


def get_world_size() -> int:
    """The number of processes (1 without a process group or ``WORLD_SIZE``)."""
    if is_initialized():
        return torch_dist.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def get_local_rank() -> int:
    """This process's rank on its node (``LOCAL_RANK``, default 0)."""
    return _env_int("LOCAL_RANK", 0)


def get_local_world_size() -> int:
    """The number of processes on this node (``LOCAL_WORLD_SIZE``, default 1)."""
    return _env_int("LOCAL_WORLD_SIZE", 1)


def get_node_rank() -> int:
    """This node's rank (``NODE_RANK``, else ``GROUP_RANK``, default 0)."""
    return _env_int("NODE_RANK", _env_int("GROUP_RANK", 0))
