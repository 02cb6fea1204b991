"""``parallelize(model, plan)``: the one ordered plan, read top to bottom (torchtitan's
``parallelize_llama``). Single process, DDP, FSDP2 and FSDP2 x TP are all this function.

1. activation checkpointing (:mod:`.activation_checkpointing`; the fsdp keys, unless the
   algorithm already checkpointed blocks at ``INIT``);
2. ``torch.compile`` per block or whole (:mod:`.compile`; lazy, traced at the first call);
3. tensor parallelism on the mesh's ``tp`` dimension (:mod:`.tp`);
4. FSDP2 on the data-parallel dimensions (:mod:`.fsdp`), or DDP when several ranks and
   no fsdp; nothing on one rank.

The settings arrive typed (:class:`ParallelPlan`), parsed once where the run entered (the
run file in :func:`~cadence.config.load.load_config`, or the Trainer's arguments).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from cadence.utils import dist
from cadence.parallel.activation_checkpointing import (
    ActivationCheckpointingConfig, apply_ac,
)
from cadence.parallel.compile import CompileConfig, apply_compile
from cadence.config.parallelism import ParallelismConfig
from cadence.parallel.fsdp import apply_fsdp
from cadence.parallel.mesh import build_mesh, data_parallel_mesh
from cadence.parallel.tp import apply_tp, describe_tp_plan, plan_tensor_parallel

__all__ = ["ParallelPlan", "parallelize"]

log = logging.getLogger(__name__)


@dataclass
class ParallelPlan:
    """Everything :func:`parallelize` needs, typed.

    Attributes:
        parallelism: the parsed ``parallelism_config`` (fsdp, tp).
        compile: the parsed ``compile_config``; None: no compile.
        device: the run's device.
        precision: the run's precision (FSDP2's mixed precision follows it).
        mesh: a prebuilt mesh; default built from ``parallelism`` when fsdp or tp is set.
    """

    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    compile: Optional[CompileConfig] = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    precision: str = "fp32"
    mesh: Optional[DeviceMesh] = None

    @property
    def activation_checkpointing(self) -> Optional[ActivationCheckpointingConfig]:
        """The fsdp keys ``activation_checkpointing`` / ``activation_cpu_offload`` as the
        plan's first step (None when neither is set)."""
        fsdp = self.parallelism.fsdp
        if fsdp is None or not (fsdp.activation_checkpointing or fsdp.activation_cpu_offload):
            return None
        return ActivationCheckpointingConfig(every_n=1 if fsdp.activation_checkpointing else 0,
                                             offload_to_cpu=fsdp.activation_cpu_offload)

    @property
    def verbose(self) -> bool:
        """Print the mesh, the TP plan and the FSDP units (``fsdp.verbose`` or ``tp.verbose``)."""
        p = self.parallelism
        return bool((p.fsdp is not None and p.fsdp.verbose) or (p.tp is not None and p.tp.verbose))


def parallelize(model: nn.Module, plan: ParallelPlan) -> nn.Module:
    """Apply ``plan`` to ``model``: activation checkpointing, compile, TP, then FSDP2 or DDP.

    Args:
        model: the user's (unwrapped) model; on ``plan.device``, or on ``meta`` on ranks
            other than 0 when fsdp's ``cpu_ram_efficient_loading`` is set.
        plan: the typed settings.

    Returns:
        The model to train: changed in place (TP, FSDP2) and possibly wrapped in DDP.

    Raises:
        ValueError: a TP plan that does not fit the model, or degrees that do not fit the
            world size (raised before anything is sharded, on every rank alike); a
            meta-device model without ``cpu_ram_efficient_loading``.
    """
    config = plan.parallelism
    fsdp, tp_degree = config.fsdp, config.tp_degree
    tp_plan = (plan_tensor_parallel(model, tp_degree, config.tp.layer_plan)
               if config.tp is not None and tp_degree > 1 else None)  # checked before sharding
    _check_meta(model, fsdp is not None and fsdp.cpu_ram_efficient_loading)
    mesh = plan.mesh
    if mesh is None and (fsdp is not None or tp_plan is not None):
        _ensure_process_group(plan.device)
        mesh = build_mesh(config, plan.device.type)
    if plan.verbose and mesh is not None and dist.get_global_rank() == 0:
        print(f"Parallelism: mesh {tuple(mesh.shape)} {mesh.mesh_dim_names} on "
              f"{dist.get_world_size()} ranks", flush=True)

    apply_ac(model, plan.activation_checkpointing)
    apply_compile(model, plan.compile)
    if tp_plan is not None:
        assert mesh is not None
        if plan.verbose and dist.get_global_rank() == 0:
            print(describe_tp_plan(tp_plan), flush=True)
        apply_tp(model, tp_plan, mesh["tp"])
    if fsdp is not None:
        assert mesh is not None
        _shard(model, plan, data_parallel_mesh(mesh))
    elif dist.get_world_size() > tp_degree:
        device_ids = [plan.device.index] if plan.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    return model


def _shard(model: nn.Module, plan: ParallelPlan, dp_mesh: DeviceMesh) -> None:
    """FSDP2 over ``dp_mesh``, with fsdp's rank-0 loading options."""
    fsdp = plan.parallelism.fsdp
    assert fsdp is not None
    if fsdp.sync_module_states and not fsdp.cpu_ram_efficient_loading:
        _broadcast_module_states(model)
    full_state = None
    if fsdp.cpu_ram_efficient_loading and dist.get_global_rank() == 0:
        full_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    apply_fsdp(model, fsdp, dp_mesh, precision=plan.precision, device=plan.device)
    if fsdp.cpu_ram_efficient_loading:
        _load_from_rank0(model, full_state, plan.device)


def _ensure_process_group(device: torch.device) -> None:
    """FSDP2 and DTensor need a process group even on one rank: a private single-rank one."""
    if not dist.is_initialized():
        torch_dist.init_process_group("gloo" if device.type == "cpu" else "nccl",
                                      store=torch_dist.HashStore(), rank=0, world_size=1)
        dist.destroy_process_group_at_exit()


def _has_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def _check_meta(model: nn.Module, rank0_loading: bool) -> None:
    if _has_meta(model) and not rank0_loading:
        raise ValueError("The model has parameters on the meta device; set "
                         "parallelism_config.fsdp.cpu_ram_efficient_loading: true so rank 0's "
                         "weights are broadcast into it.")


def _broadcast_module_states(model: nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (``sync_module_states``)."""
    from cadence.utils.dtensor import local_tensor

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            local = local_tensor(tensor.data)
            dist.broadcast(local, src=0)


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
