"""Pipeline parallelism: the model split into stages, each stage parallelized by the usual
plan, and a ``torch.distributed.pipelining`` schedule over them.

:func:`parallelize_pipeline` is the plan under ``parallelism_config.pp`` (torchtitan's
``pipeline_llm`` then ``parallelize_llama`` per stage), read top to bottom:

1. split the model into ``pipeline_parallel_degree * stages_per_rank`` stages
   (:mod:`.pipeline_split`; a split that does not fit is refused before anything is built);
2. keep this rank's stages (:func:`stage_ids`: looped, or V-shaped for ``ZBVZeroBubble`` /
   ``DualPipeV``) and drop the other stages' modules from the model, which keeps its
   parameter names (a checkpoint's keys are the single-process model's);
3. per stage, the ordered plan of :func:`cadence.parallel.plan.parallelize` (activation
   checkpointing, compile, TP, FSDP2) on the mesh without its ``pp`` dimension;
4. one ``PipelineStage`` per local stage over the ``pp`` process group.

A model built on the meta device (``init_device: meta``) stays there through steps 1-3:
each stage is sharded on meta, then only this rank's stages are allocated
(``to_empty``: its own shards) and the model's init hook runs once on the whole model
(:func:`init_local_stages`), as :func:`~cadence.parallel.param_init.materialize_and_init`
runs it without a pipeline; the other stages' modules stay on meta, never allocated, and are
dropped after. Their random fills draw into a scratch tensor (one at a time, freed at once)
so the random stream, and so every weight, is the single-process init's with the same seed.

The schedule is built at the first batch (:func:`build_schedule`), when the number of
microbatches is known; losses are summed (``scale_grads=False``): each microbatch's loss
arrives weighted by its share of the batch (:mod:`cadence.trainer.pipeline_step`).

Not supported under a pipeline (refused with the reason): tied input/output embeddings,
DDP without fsdp over several data-parallel ranks, pretrained weights streamed into a meta
model (``hf_pretrained(init_device="meta")``).

Sources: ``torch.distributed.pipelining`` (``PipelineStage``, ``get_schedule_class``);
torchtitan's ``torchtitan/distributed/pipeline_parallel.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from cadence.parallel.param_init import (
    check_init_hook, has_meta_tensors, retie_parameters, run_init_hook, shared_parameters,
)
from cadence.parallel.pipeline_config import PPConfig, SINGLE_STAGE_SCHEDULES, V_SCHEDULES
from cadence.parallel.pipeline_split import PipelineSplit, split_model
from cadence.parallel.plan import ParallelPlan, parallelize

__all__ = ["Pipeline", "parallelize_pipeline", "stage_ids", "keep_local_modules",
           "build_schedule", "init_local_stages", "DrawForMeta"]


def stage_ids(pp_rank: int, pp: int, stages_per_rank: int, schedule: str) -> list[int]:
    """The stages pipeline rank ``pp_rank`` of ``pp`` runs, in order: ``pp_rank + k * pp``
    (looped), or ``pp_rank`` and ``2 pp - 1 - pp_rank`` for the V schedules."""
    if schedule in V_SCHEDULES:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(stages_per_rank)]


def keep_local_modules(model: nn.Module, stages: list[nn.Module]) -> None:
    """Drop from ``model`` every submodule with parameters or buffers that none of
    ``stages`` holds (in place; a ``ModuleList`` keeps its other entries' indices, so the
    names of what remains are unchanged)."""
    kept = {id(m) for stage in stages for m in stage.modules()}
    names = {n: m for n, m in model.named_modules()}
    ancestors = {""}
    for name, module in names.items():
        if id(module) in kept:
            parts = name.split(".")
            ancestors.update(".".join(parts[:i]) for i in range(len(parts)))

    def visit(prefix: str, module: nn.Module) -> None:
        for child_name, child in list(module._modules.items()):
            if child is None:
                continue
            full = f"{prefix}{child_name}"
            if id(child) in kept:
                continue
            if full in ancestors:
                visit(f"{full}.", child)
            elif any(True for _ in child.parameters()) or any(True for _ in child.buffers()):
                del module._modules[child_name]

    visit("", model)


class DrawForMeta(TorchDispatchMode):
    """An in-place random fill of a meta tensor (``normal_``, ``uniform_``, ... : the ops
    tagged ``torch.Tag.nondeterministic_seeded``) draws into a scratch tensor of its shape on
    ``device``, discarded at once, and leaves the meta tensor as it was: the random stream
    advances as if the tensor were real. Everything else runs unchanged.

    What a pipeline rank's init of the whole model needs: the other stages' parameters
    stay on meta, but consume the draws they would in a single-process init, so this
    rank's weights are that init's. Cost: one scratch tensor at a time (the largest
    parameter bounds it) and the whole model's draws on every rank.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.draws = 0  # scratch draws made (meta tensors the stream went past)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: Optional[dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else None
        if (isinstance(target, torch.Tensor) and target.is_meta
                and torch.Tag.nondeterministic_seeded in func.tags
                and func._schema.is_mutable):
            scratch = torch.empty(target.shape, dtype=target.dtype, device=self.device)
            func(scratch, *args[1:], **kwargs)
            del scratch
            self.draws += 1
            return target
        return func(*args, **kwargs)


def init_local_stages(model: nn.Module, modules: list[nn.Module], device: torch.device,
                      seed: Optional[int]) -> int:
    """Allocate this rank's (sharded) stage ``modules`` on ``device`` and initialise them
    with ``model``'s init hook run on the whole model, the other stages left on meta
    (:class:`DrawForMeta` keeps the random stream the single-process init's).

    Args:
        model: the whole model, every stage's modules still in it (the others on meta).
        modules: this rank's stages, sharded on meta by the per-stage plan.
        device: where this rank's shards go.
        seed: the init seed, the same on every rank (None: agreed by a broadcast).

    Returns:
        The number of scratch draws made for other stages' tensors.

    Raises:
        ValueError: the model has no init hook (refused before the split, too).
    """
    for module in modules:
        ties = shared_parameters(module)
        module.to_empty(device=device)
        retie_parameters(ties)
    mode = DrawForMeta(device)
    with mode:
        run_init_hook(model, device, seed)
    return mode.draws


@dataclass
class Pipeline:
    """This rank's part of a pipeline.

    Attributes:
        model: the model with only this rank's stages' modules (what the optimizer steps and
            checkpoints hold).
        split: the whole split (its ``inputs`` / ``outputs`` adapters).
        config: the ``pp`` settings.
        stages: this rank's ``PipelineStage`` s, in pipeline order.
        modules: their (parallelized) modules.
        group: the pipeline's process group.
        device: the run's device.
    """

    model: nn.Module
    split: PipelineSplit
    config: PPConfig
    stages: list[Any]
    modules: list[nn.Module]
    group: Any
    device: torch.device
    schedule: Any = field(default=None)

    @property
    def has_first_stage(self) -> bool:
        """Whether this rank runs stage 0 (it feeds the batch's inputs)."""
        return any(stage.is_first for stage in self.stages)

    @property
    def has_last_stage(self) -> bool:
        """Whether this rank runs the last stage (it computes the loss)."""
        return any(stage.is_last for stage in self.stages)


def parallelize_pipeline(model: nn.Module, plan: ParallelPlan) -> Pipeline:
    """Split ``model`` into stages and parallelize this rank's (see the module docstring).

    Args:
        model: the unwrapped ``ComposerModel``, on the CPU (changed in place: the other
            ranks' modules are dropped).
        plan: the typed settings; ``plan.dims`` the run's degrees (``pp > 1``).

    Returns:
        This rank's :class:`Pipeline` (its schedule is built at the first batch).

    Raises:
        ValueError: a meta-device model without an init hook or streaming pretrained
            weights, a split that does not fit
            the model (:func:`~cadence.parallel.pipeline_split.split_model`), or what the
            per-stage plan refuses; all before anything is sharded.
    """
    from torch.distributed.pipelining import PipelineStage

    config = plan.parallelism.pp
    dims = plan.dims
    assert config is not None and dims is not None and dims.pp_enabled
    meta = has_meta_tensors(model)
    if meta:
        check_init_hook(model)  # before the split
        if getattr(model, "pretrained_path", None) is not None:
            raise ValueError(
                "parallelism_config.pp: streaming pretrained weights into a meta model "
                "(hf_pretrained(..., init_device='meta')) is not supported under pipeline "
                "parallelism yet (the loader needs every stage's parameters); build it with "
                "init_device: cpu, or load a cadence checkpoint with load_path.")
    split = split_model(model, config.num_stages, config.split_points)
    mesh = dims.build_mesh(plan.device.type)
    names = tuple(n for n in mesh.mesh_dim_names or () if n != "pp")
    stage_mesh = mesh[names] if len(names) > 1 else mesh[names[0]]
    ids = stage_ids(dims.pp_rank, dims.pp, int(config.stages_per_rank or 1), config.schedule)
    local = [split.stages[i] for i in ids]
    if not meta:
        keep_local_modules(model, local)
    stage_plan = dataclasses.replace(plan, mesh=stage_mesh, materialize=not meta)
    modules = [parallelize(stage, stage_plan) for stage in local]
    if meta:  # this rank's stages allocated, the whole model's init run, the rest dropped
        init_local_stages(model, modules, plan.device, plan.seed)
        keep_local_modules(model, local)
        if has_meta_tensors(model):
            raise RuntimeError("parallelism_config.pp: a meta tensor is left on this rank's "
                               "stages after their init (a module outside every stage?).")
    group = dims.pipeline_group()
    stages = [PipelineStage(module, index, config.num_stages, plan.device, group=group)
              for module, index in zip(modules, ids)]
    return Pipeline(model, split, config, stages, modules, group, plan.device)


def build_schedule(pipeline: Pipeline, num_microbatches: int,
                   loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]) -> Any:
    """The schedule ``pipeline.config.schedule`` over the pipeline's stages, summing the
    microbatch losses ``loss_fn`` returns (``scale_grads=False``).

    Raises:
        ValueError: a number of microbatches the schedule cannot run (fewer than the
            pipeline ranks, or not a multiple of them for the interleaved schedules).
    """
    from torch.distributed.pipelining.schedules import get_schedule_class

    config = pipeline.config
    config.check_num_microbatches(num_microbatches)
    cls = get_schedule_class(config.schedule)
    stages = pipeline.stages[0] if config.schedule in SINGLE_STAGE_SCHEDULES else pipeline.stages
    return cls(stages, n_microbatches=num_microbatches, loss_fn=loss_fn, scale_grads=False)
