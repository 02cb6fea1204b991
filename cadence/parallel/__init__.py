"""Parallelism, applied from outside the model: ``parallelize(model, plan)`` (in
:mod:`.plan`) runs activation checkpointing, compile, tensor parallelism, then FSDP2 or
DDP; single process, DDP, FSDP2 and FSDP2 x TP are one path. Pipeline parallelism
(:mod:`.pipeline`) splits the model into stages first and runs that path per stage.

Names are imported on first use (:mod:`cadence._lazy`), so the run-file check can read
:mod:`cadence.parallel.config` (the typed ``parallelism_config``),
:mod:`cadence.parallel.compile_config` and :mod:`cadence.parallel.tp_styles` without importing
torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    import torch
    from torch import nn

    from cadence.parallel.config import (
        EPConfig, FSDPConfig, ParallelismConfig, PPConfig, TPConfig, parse_parallelism_config,
    )
    from cadence.parallel.fsdp import plan_fsdp_units
    from cadence.parallel.mesh import mesh_shape
    from cadence.parallel.parallel_dims import ParallelDims, build_mesh
    from cadence.parallel.plan import ParallelPlan, parallelize
    from cadence.utils.dtensor import is_shard_placement
    from cadence.utils.misc import unwrap_model

__all__ = [
    "FSDPConfig", "TPConfig", "EPConfig", "PPConfig", "ParallelismConfig", "ParallelPlan",
    "parse_parallelism_config",
    "parallelize", "build_mesh", "mesh_shape", "ParallelDims",
    "plan_fsdp_units", "unwrap_model", "is_fsdp", "remap_optimizer_params", "is_shard_placement",
]

_config, _mesh = "cadence.parallel.config", "cadence.parallel.mesh"
__getattr__, __dir__ = lazy_exports(__name__, {
    "FSDPConfig": _config, "TPConfig": _config, "EPConfig": _config, "PPConfig": _config,
    "ParallelismConfig": _config,
    "parse_parallelism_config": _config, "plan_fsdp_units": "cadence.parallel.fsdp",
    "build_mesh": "cadence.parallel.parallel_dims", "mesh_shape": _mesh,
    "ParallelDims": "cadence.parallel.parallel_dims", "ParallelPlan": "cadence.parallel.plan",
    "parallelize": "cadence.parallel.plan",
    "is_shard_placement": "cadence.utils.dtensor", "unwrap_model": "cadence.utils.misc",
})


def is_fsdp(model: nn.Module) -> bool:
    """Whether ``model`` was sharded with FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def remap_optimizer_params(optimizer: torch.optim.Optimizer, old_names: dict[int, str],
                           model: nn.Module, drop_absent: bool = False) -> None:
    """Point ``optimizer`` at ``model``'s current parameters (FSDP2 replaces each parameter
    with a sharded DTensor one), matching by name. ``old_names`` maps ``id(old param)`` to
    its name, taken before sharding. ``drop_absent``: a parameter that is no longer in
    ``model`` is dropped from its group (a pipeline rank keeps its own stages' only) instead
    of refused.

    Raises:
        ValueError: the optimizer holds a parameter that was never in the model (or, without
            ``drop_absent``, is not in it now), or already has state (it must not have
            stepped before the Trainer shards the model).
    """
    if optimizer.state:
        raise ValueError("The optimizer has already stepped; create it before training starts.")
    current = dict(model.named_parameters())
    for group in optimizer.param_groups:
        remapped = []
        for param in group["params"]:
            name = old_names.get(id(param))
            if name is None or (name not in current and not drop_absent):
                raise ValueError(
                    "The optimizer holds a parameter that is not in the model; build it from "
                    "model.parameters() (or leave optimizers unset for AdamW)."
                )
            if name in current:
                remapped.append(current[name])
        group["params"] = remapped
