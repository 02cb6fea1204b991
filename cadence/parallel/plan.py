"""``parallelize(model, plan)``: the one ordered plan, read top to bottom (torchtitan's
``parallelize_llama``). Single process, DDP, FSDP2 and FSDP2 x TP are all this function.

1. activation checkpointing (:mod:`.activation_checkpointing`; the fsdp keys, unless the
   algorithm already checkpointed blocks at ``INIT``);
2. ``torch.compile`` per block or whole (:mod:`.compile`; lazy, traced at the first call);
3. tensor parallelism on the mesh's ``tp`` dimension (:mod:`.tp`);
3b. expert parallelism: each MoE block's experts split over ``ep`` and FSDP2-sharded over
   the experts' mesh first (:mod:`.expert_parallel`);
4. FSDP2 on the data-parallel dimensions (:mod:`.fsdp`), or DDP when several ranks and
   no fsdp; nothing on one rank;
5. weights: a meta model's shards allocated and initialised by its init hook
   (:mod:`.param_init`), or filled from rank 0's CPU weights (fsdp's
   ``cpu_ram_efficient_loading``); an unsharded model moved to the device whole.

Nothing whole on the device: the model arrives on the CPU or meta, and TP and FSDP2 put
each rank's shards on the device one tensor at a time (see :func:`parallelize`).

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
from torch.distributed.tensor import DTensor

from cadence.utils import dist
from cadence.utils.dtensor import local_tensor
from cadence.parallel.activation_checkpointing import (
    ActivationCheckpointingConfig, apply_ac,
)
from cadence.parallel.compile import CompileConfig, apply_compile
from cadence.parallel.config import ParallelismConfig
from cadence.parallel.expert_parallel import (
    apply_ep, describe_experts, plan_expert_parallel, shard_experts,
)
from cadence.parallel.fsdp import apply_fsdp, fully_shard_kwargs
from cadence.parallel.mesh import data_parallel_mesh
from cadence.parallel.parallel_dims import ParallelDims
from cadence.parallel.param_init import (
    check_init_hook, has_meta_tensors, materialize_and_init, retie_parameters, shared_parameters,
)
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
        mesh: a prebuilt mesh; default: ``dims``'s, built when fsdp or tp is set.
        dims: the run's :class:`~cadence.parallel.parallel_dims.ParallelDims` (the Trainer's,
            which keeps the mesh for the rest of the run); default: new ones from
            ``parallelism``.
        seed: the seed of a meta model's initialisation after sharding, the same on every
            rank (the Trainer's ``rank_zero_seed``); None: rank 0 draws one and broadcasts it.
        materialize: False leaves a meta model's shards on meta, uninitialised, for the
            caller (a pipeline stage: :mod:`.pipeline` initialises the whole model once).
    """

    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    compile: Optional[CompileConfig] = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    precision: str = "fp32"
    mesh: Optional[DeviceMesh] = None
    seed: Optional[int] = None
    dims: Optional[ParallelDims] = None
    materialize: bool = True

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

    Nothing whole on the device: the model arrives on the CPU or the meta device and no
    unsharded module is moved to ``plan.device``. Tensor parallelism and ``fully_shard``
    place each rank's shards on the mesh's device as they go (one tensor at a time; FSDP2
    moves a unit's parameters to the device and shards them, torchtitan's and FSDP2's
    documented path); only when nothing shards the model (one process, DDP) is the whole
    model moved, and then it must fit. A model on the meta device is sharded on meta, then
    each rank's shards are allocated and initialised by the model's init hook
    (:func:`~cadence.parallel.param_init.materialize_and_init`), or, with fsdp's
    ``cpu_ram_efficient_loading``, filled from rank 0's weights, which rank 0 holds on the
    CPU only.

    Args:
        model: the user's (unwrapped) model, on the CPU (or already on ``plan.device``), or
            on ``meta``: on every rank (initialised after sharding by its ``init_weights()``
            or ``param_init_fn(module)``), or on ranks other than 0 when fsdp's
            ``cpu_ram_efficient_loading`` is set.
        plan: the typed settings.

    Returns:
        The model to train: changed in place (TP, FSDP2) and possibly wrapped in DDP.

    Raises:
        ValueError: a TP plan that does not fit the model, or degrees that do not fit the
            world size (raised before anything is sharded, on every rank alike); a
            meta-device model without an init hook; a model on the meta device on some
            ranks only without ``cpu_ram_efficient_loading``.
    """
    config = plan.parallelism
    fsdp, tp_degree = config.fsdp, config.tp_degree
    tp_plan = (plan_tensor_parallel(model, tp_degree, config.tp.layer_plan)
               if config.tp is not None and tp_degree > 1 else None)  # checked before sharding
    experts = (plan_expert_parallel(model, config.ep_degree)
               if config.ep_degree > 1 else None)  # checked before sharding
    mesh, dims = plan.mesh, plan.dims
    if experts is not None and dims is None:
        if mesh is not None:
            raise ValueError("Expert parallelism builds the experts' mesh from the run's "
                             "ParallelDims: pass ParallelPlan(dims=...) instead of a mesh.")
        dims = ParallelDims.from_config(config)  # refuses ep without fsdp, with tp, ...
    if mesh is None and (fsdp is not None or tp_plan is not None):
        _ensure_process_group(plan.device)
        dims = dims if dims is not None else ParallelDims.from_config(config)
        mesh = dims.build_mesh(plan.device.type)
    source = _weights_source(model, fsdp is not None and fsdp.cpu_ram_efficient_loading,
                             plan.materialize)
    if plan.verbose and mesh is not None and dist.get_global_rank() == 0:
        print(f"Parallelism: mesh {tuple(mesh.shape)} {mesh.mesh_dim_names} on "
              f"{dist.get_world_size()} ranks", flush=True)
    rank0_state = _to_meta_keeping_rank0_state(model) if source == "rank0" else None

    if fsdp is not None and fsdp.sync_module_states and source == "model":
        # before tensor parallelism slices the weights: each rank then keeps its own slice of
        # rank 0's weights (after it, rank 0's slice would overwrite every rank's)
        _broadcast_module_states(model, plan.device)
    apply_ac(model, plan.activation_checkpointing)
    apply_compile(model, plan.compile)
    if tp_plan is not None:
        assert mesh is not None
        if plan.verbose and dist.get_global_rank() == 0:
            print(describe_tp_plan(tp_plan), flush=True)
        apply_tp(model, tp_plan, mesh["tp"])
    if experts is not None:
        assert fsdp is not None and dims is not None and dims.ep_enabled  # ParallelDims checked
        if plan.verbose and dist.get_global_rank() == 0:
            print(describe_experts(experts, dims.ep), flush=True)
        apply_ep(experts, dims.expert_mesh["ep"])
        shard_experts(experts, dims.expert_data_parallel_mesh(), dims.gradient_divide_factor,
                      **fully_shard_kwargs(fsdp, plan.precision, plan.device))
    if fsdp is not None:
        assert mesh is not None
        apply_fsdp(model, fsdp, data_parallel_mesh(mesh), precision=plan.precision,
                   device=plan.device)
    if source == "rank0":
        _load_from_rank0(model, rank0_state, plan.device)
    elif source == "init":
        if plan.materialize:  # else the caller's (a pipeline stage: the whole model at once)
            materialize_and_init(model, plan.device, plan.seed)
    elif mesh is not None:
        _move_unsharded_tensors(model, plan.device)  # TP's buffers (FSDP2 moved its own)
    else:
        model.to(plan.device)  # nothing shards the model: it is whole on the device
    data_parallel = (plan.dims.dp_size if plan.dims is not None  # (a pipeline's stage: its
                     else dist.get_world_size() // tp_degree)     # data-parallel ranks only)
    if fsdp is None and data_parallel > 1:
        device_ids = [plan.device.index] if plan.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    return model


def _weights_source(model: nn.Module, rank0_loading: bool, check_hook: bool = True) -> str:
    """Where the weights come from, decided alike on every rank (before any sharding):
    ``"model"`` (every rank holds real weights), ``"init"`` (meta on every rank: the init
    hook after sharding) or ``"rank0"`` (rank 0's weights broadcast: fsdp's
    ``cpu_ram_efficient_loading`` with rank 0 not on meta).

    Raises:
        ValueError: a meta model without an init hook, or a model on the meta device on
            some ranks only without ``cpu_ram_efficient_loading`` (on every rank alike).
    """
    flags = [has_meta_tensors(model)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        flags = [bool(f) for f in dist.all_gather_object(flags[0])]
    if rank0_loading and not flags[0]:
        return "rank0"
    if not any(flags):
        return "model"
    if not all(flags):
        raise ValueError(
            f"The model has parameters on the meta device on ranks "
            f"{[r for r, f in enumerate(flags) if f]} only. Build it on the meta device on "
            f"every rank (it is initialised after sharding by its init_weights() or "
            f"param_init_fn), or set parallelism_config.fsdp.cpu_ram_efficient_loading: true "
            f"so rank 0's weights are broadcast into the other ranks' shards.")
    if check_hook:
        check_init_hook(model)
    return "init"


def _to_meta_keeping_rank0_state(
        model: nn.Module) -> Optional[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """Move ``model`` to the meta device (every rank), returning rank 0's weights: its
    state dict and every buffer (persistent or not), on the CPU (where rank 0 built them;
    nothing is copied when they are there), or None on the other ranks."""
    state = None
    if dist.get_global_rank() == 0:
        state = ({k: v.detach().cpu() for k, v in model.state_dict().items()},
                 {k: b.detach().cpu() for k, b in model.named_buffers()})
    ties = shared_parameters(model)
    model.to("meta")
    retie_parameters(ties)
    return state


def _move_unsharded_tensors(model: nn.Module, device: torch.device) -> None:
    """Move the parameters and buffers that no sharding placed (plain tensors; TP leaves
    buffers where they were) to ``device``, one tensor at a time."""
    with torch.no_grad():
        for module in model.modules():
            for name, buffer in module._buffers.items():
                if buffer is not None and not buffer.is_meta and buffer.device != device:
                    module._buffers[name] = buffer.to(device)
            for param in module._parameters.values():
                if param is not None and not isinstance(param, DTensor) \
                        and not param.is_meta and param.device != device:
                    param.data = param.data.to(device)


def _ensure_process_group(device: torch.device) -> None:
    """FSDP2 and DTensor need a process group even on one rank: a private single-rank one."""
    if not dist.is_initialized():
        torch_dist.init_process_group("gloo" if device.type == "cpu" else "nccl",
                                      store=torch_dist.HashStore(), rank=0, world_size=1)
        dist.destroy_process_group_at_exit()


def _broadcast_module_states(model: nn.Module, device: torch.device) -> None:
    """Copy rank 0's parameters and buffers to every rank (``sync_module_states``), one
    tensor at a time through ``device`` (a CPU model under NCCL is staged there)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            local = local_tensor(tensor.data)
            staged = local.to(device)
            dist.broadcast(staged, src=0)
            if staged is not local:
                local.copy_(staged)


def _load_from_rank0(
        model: nn.Module,
        rank0_state: Optional[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]],
        device: torch.device) -> None:
    """Allocate each rank's shards on ``device`` and fill them from rank 0's CPU state dict
    (broadcast one tensor at a time, each rank keeping its slice:
    ``set_model_state_dict(broadcast_from_rank0=True)``), then copy every buffer
    (persistent or not) from rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    ties = shared_parameters(model)
    model.to_empty(device=device)
    retie_parameters(ties)
    full_state, buffers = rank0_state if rank0_state is not None else ({}, {})
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in buffers:
                buffer.copy_(buffers[name])
    set_model_state_dict(
        model, full_state,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True),
    )
    with torch.no_grad():
        for buffer in model.buffers():
            dist.broadcast(buffer.data, src=0)
