"""``parallelize(model, parallelism_config, ...)``: single process, DDP and FSDP2 in one path.

The plan, applied from outside the model in this order (as torchtitan does): algorithms'
model surgery at ``INIT`` (activation checkpointing, ...) has already run; then FSDP2
``fully_shard`` per unit and the root when ``parallelism_config.fsdp`` is set; otherwise
``DistributedDataParallel`` when the world size is above 1; otherwise the model as is.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from cadence.trainer import dist
from cadence.trainer.parallel.config import (
    FSDPConfig, ParallelismConfig, parse_parallelism_config,
)
from cadence.trainer.parallel.fsdp import apply_fsdp, plan_fsdp_units
from cadence.trainer.parallel.mesh import build_mesh, mesh_shape

__all__ = [
    "FSDPConfig", "ParallelismConfig", "parse_parallelism_config", "parallelize", "build_mesh",
    "mesh_shape", "plan_fsdp_units", "unwrap_model", "is_fsdp", "remap_optimizer_params",
]

log = logging.getLogger(__name__)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's model inside a DDP wrapper (FSDP2 shards in place, so it is the model)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def is_fsdp(model: nn.Module) -> bool:
    """Whether ``model`` was sharded with FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _broadcast_module_states(model: nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (``sync_module_states``)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def _has_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def parallelize(
    model: nn.Module,
    parallelism_config: Any,
    device: torch.device,
    precision: str = "fp32",
    mesh: Optional[DeviceMesh] = None,
) -> nn.Module:
    """Shard or replicate ``model`` for the current world size.

    Args:
        model: the user's model; on ``device``, or on ``meta`` on ranks other than 0 when
            ``cpu_ram_efficient_loading`` is set.
        parallelism_config: a dict as written in YAML, a :class:`ParallelismConfig`, or None.
        device: the run's device.
        precision: the run's precision (FSDP's mixed precision follows it).
        mesh: a prebuilt mesh; default: built from the fsdp config.

    Returns:
        The model to train: FSDP2-sharded in place, wrapped in DDP, or unchanged.

    Raises:
        ValueError: a bad parallelism_config (every problem listed), or a meta-device model
            without ``cpu_ram_efficient_loading``.
    """
    config = parse_parallelism_config(parallelism_config)
    world_size = dist.get_world_size()
    fsdp = config.fsdp
    if fsdp is None:
        if _has_meta(model):
            raise ValueError("The model has parameters on the meta device; only an FSDP run with "
                             "cpu_ram_efficient_loading: true materialises them.")
        if world_size > 1:
            device_ids = [device.index] if device.type == "cuda" else None
            return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        return model

    if not dist.is_initialized():
        # FSDP2 needs a process group even on one rank: a private single-rank group.
        torch_dist.init_process_group("gloo" if device.type == "cpu" else "nccl",
                                      store=torch_dist.HashStore(), rank=0, world_size=1)
    if _has_meta(model) and not fsdp.cpu_ram_efficient_loading:
        raise ValueError("The model has parameters on the meta device; set "
                         "parallelism_config.fsdp.cpu_ram_efficient_loading: true so rank 0's "
                         "weights are broadcast into it.")
    if fsdp.sync_module_states and not fsdp.cpu_ram_efficient_loading:
        _broadcast_module_states(model)
    full_state = None
    if fsdp.cpu_ram_efficient_loading and dist.get_global_rank() == 0:
        full_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    mesh = mesh if mesh is not None else build_mesh(fsdp, device.type)
    apply_fsdp(model, fsdp, mesh, precision=precision, device=device)
    if fsdp.cpu_ram_efficient_loading:
        _load_from_rank0(model, full_state, device)
    return model


def _load_from_rank0(model: nn.Module, full_state: Optional[dict[str, torch.Tensor]],
                     device: torch.device) -> None:
    """Materialise meta shards and fill them from rank 0's full state dict (broadcast), then
    copy every buffer (persistent or not) from rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if _has_meta(model):
        model.to_empty(device=device)
    set_model_state_dict(
        model, full_state if full_state is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True),
    )
    with torch.no_grad():
        for buffer in model.buffers():
            dist.broadcast(buffer.data, src=0)


def remap_optimizer_params(optimizer: torch.optim.Optimizer, old_names: dict[int, str],
                           model: nn.Module) -> None:
    """Point ``optimizer`` at ``model``'s current parameters (FSDP2 replaces each parameter
    with a sharded DTensor one), matching by name. ``old_names`` maps ``id(old param)`` to
    its name, taken before sharding.

    Raises:
        ValueError: the optimizer holds a parameter that is not in the model, or already has
            state (it must not have stepped before the Trainer shards the model).
    """
    if optimizer.state:
        raise ValueError("The optimizer has already stepped; create it before training starts.")
    current = dict(model.named_parameters())
    for group in optimizer.param_groups:
        remapped = []
        for param in group["params"]:
            name = old_names.get(id(param))
            if name is None or name not in current:
                raise ValueError(
                    "The optimizer holds a parameter that is not in the model; build it from "
                    "model.parameters() (or leave optimizers unset for AdamW)."
                )
            remapped.append(current[name])
        group["params"] = remapped
