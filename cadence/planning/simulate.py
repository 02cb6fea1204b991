"""One rank of a cluster, simulated: the real parallelize plan on a fake process group, one
training step on fake tensors, every tensor accounted by kind.

:func:`simulate_rank` makes this process rank ``r`` of ``N`` on torch's ``fake`` backend
(``torch.testing._internal.distributed.fake_pg.FakeStore``: collectives return at once and
move nothing), builds the run's ``DeviceMesh`` (:class:`~cadence.parallel.parallel_dims.
ParallelDims`, as the Trainer does), builds the model on the meta device and applies
:func:`cadence.parallel.plan.parallelize` to it: the same activation checkpointing, tensor
parallelism and FSDP2 as training, with the same checks and messages. The shards are then
allocated as fake tensors (``FakeTensorMode``: shapes and dtypes, no memory) and one
optimizer step on zero gradients creates the optimizer state; the step measured after it (forward, loss, backward over
the microbatches, optimizer step) runs under PyTorch's memory tracker
(``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` for an FSDP2 model,
``mem_tracker.MemTracker`` otherwise) and a :class:`~cadence.planning.collectives.
CollectiveCounter`.

What is not simulated: ``torch.compile`` (the step runs eager, an upper bound on the
activation memory compile's fusions save), CUDA-only kernels (the step runs the CPU's
kernels: attention saves what ``scaled_dot_product_attention`` saves on the CPU), the
caching allocator's fragmentation and the CUDA/NCCL context (see
:mod:`cadence.planning.planner`'s headroom). A microbatch after the second adds nothing to
the peak (gradients already exist from the second on), so at most two are run; the
collectives of the others are counted as the second's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as torch_dist
from torch import nn

from cadence.core.precision import get_precision_context
from cadence.parallel.config import ParallelismConfig
from cadence.parallel.memory import local_state_bytes
from cadence.parallel.param_init import retie_parameters, shared_parameters
from cadence.parallel.parallel_dims import ParallelDims
from cadence.parallel.plan import ParallelPlan, parallelize
from cadence.planning.collectives import Collective, CollectiveCounter, group_names
from cadence.planning.experts import balanced_routing

__all__ = ["StepSpec", "RankMemory", "fake_process_group", "simulate_rank", "train_step",
           "memory_breakdown", "create_optimizer_state"]


@dataclass
class StepSpec:
    """What one training step of the run is.

    Attributes:
        build_model: returns the model on the meta device (every call a new one).
        build_optimizer: the run's optimizer over a model's trainable parameters.
        build_batch: one microbatch of ``n`` samples (``[n, seq]`` tensors; called under
            ``FakeTensorMode``).
        microbatch_size: samples per microbatch (per rank).
        num_microbatches: microbatches per optimizer step (per rank).
        precision: the run's precision (``fp32``, ``amp_bf16``, ...).
    """

    build_model: Callable[[], nn.Module]
    build_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    build_batch: Callable[[int], Any]
    microbatch_size: int
    num_microbatches: int = 1
    precision: str = "fp32"


@dataclass
class RankMemory:
    """What one rank holds and sends in one steady-state training step.

    Attributes:
        rank: the rank.
        params_bytes / grads_bytes / optimizer_bytes: this rank's local shards of the
            parameters, of their gradients after backward, and of the optimizer state
            (:func:`cadence.parallel.memory.local_state_bytes`).
        activations_bytes: activations (and inputs) live at the peak.
        temporary_bytes: temporaries live at the peak: gradients of activations, FSDP2's
            all-gather and reduce-scatter buffers and unsharded parameters and gradients.
        peak_bytes: the most tensor memory live at once during the step.
        collectives: the step's collectives (count and bytes per mesh dimension and op).
    """

    rank: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    temporary_bytes: int
    peak_bytes: int
    collectives: list[Collective] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "params_bytes": self.params_bytes,
                "grads_bytes": self.grads_bytes, "optimizer_bytes": self.optimizer_bytes,
                "activations_bytes": self.activations_bytes,
                "temporary_bytes": self.temporary_bytes, "peak_bytes": self.peak_bytes,
                "collectives": [c.to_dict() for c in self.collectives]}


@contextlib.contextmanager
def fake_process_group(rank: int, world_size: int) -> Iterator[None]:
    """Make this process rank ``rank`` of ``world_size`` on the ``fake`` backend, then undo it.

    Raises:
        RuntimeError: a process group already exists (a real run: plan in a fresh process).
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if torch_dist.is_initialized():
        raise RuntimeError("cadence plan simulates ranks on a fake process group and needs a "
                           "process without one; run it outside a distributed job.")
    torch_dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        torch_dist.destroy_process_group()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, microbatches: list[Any],
               precision: str, device: Any = "cpu",
               last: Optional[contextlib.AbstractContextManager[Any]] = None) -> None:
    """One optimizer step as the Trainer takes it: gradients set to ``None``, then forward,
    loss (a microbatch's share of the batch) and backward per microbatch under the
    precision's autocast, then ``optimizer.step()``. ``model`` has Composer's
    ``forward(batch)`` / ``loss(outputs, batch)`` (possibly inside DDP). ``last``, when
    given, is entered for the last microbatch and the optimizer step (the memory tracker:
    ``FSDPMemTracker`` follows one forward and backward per module)."""
    module = getattr(model, "module", model)  # DDP's wrapped model has the loss
    context = get_precision_context(precision, device=device)
    optimizer.zero_grad(set_to_none=True)
    for index, batch in enumerate(microbatches):
        with (last if last is not None and index == len(microbatches) - 1
              else contextlib.nullcontext()):
            with context:
                outputs = model(batch)
                loss = module.loss(outputs, batch) / len(microbatches)
            del outputs
            loss.backward()
            del loss
            if index == len(microbatches) - 1:
                optimizer.step()


def create_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Give ``optimizer`` the state it has after its first step (Adam's moments, ...), as a
    warm-up step would, without the step's forward and backward: zero gradients, one
    ``optimizer.step()``, gradients set to ``None`` again (as the Trainer's next batch
    starts). On fake tensors only the shapes matter."""
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def memory_breakdown(tracker: Any) -> tuple[int, int, int]:
    """``(activations, temporaries, total)`` bytes at the tracker's peak (the one device a
    simulation uses)."""
    snapshot = tracker.get_tracker_snapshot("peak")
    if not snapshot:
        return 0, 0, 0
    kinds = {str(getattr(k, "value", k)): v for k, v in next(iter(snapshot.values())).items()}
    activations = kinds.get("Activation", 0) + kinds.get("Inputs", 0)
    temporaries = sum(kinds.get(k, 0) for k in (
        "Temp", "Other", "All Gather", "Reduce Scatter", "Unsharded Param", "Unsharded Grad"))
    return activations, temporaries, kinds.get("Total", 0)


def _peak_only(base: type) -> type:
    """``base`` (``MemTracker`` or ``FSDPMemTracker``) keeping the step's peak only, not
    each module's: ``MemTracker`` updates every tracked module's peak after every op (a
    loop over all modules per op: 80 % of planning a 70B model on 512 ranks); the totals by
    kind and the global peak, which the plan reads, are the same."""
    from copy import deepcopy

    class PeakOnly(base):  # type: ignore[misc, valid-type]
        def _update_peak_stats(self, peak_state: Any) -> None:
            del peak_state
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = deepcopy(snap)

    PeakOnly.__name__ = PeakOnly.__qualname__ = f"PeakOnly{base.__name__}"
    return PeakOnly


def _schedule_mem_tracker() -> Any:
    """``MemTracker`` that lets a root module run once per microbatch in one step (a
    pipeline schedule calls each stage's module ``m`` times before the backwards):
    ``MemTracker`` refuses a second forward of a root module ("multiple iterative calls");
    this one forgets the module's per-module statistics and tracks it afresh. The totals
    by kind and the peak, which the plan reads, are unchanged."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class ScheduleMemTracker(_peak_only(MemTracker)):  # type: ignore[misc]
        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                name = self._mod_tracker.get_known_fqn(module)
                if set(self._mod_tracker.parents) - {name} == {"Global"}:
                    del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    return ScheduleMemTracker()


def tracker_for(model: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """PyTorch's memory tracker for ``model``, keeping the step's peak (not each module's:
    :func:`_peak_only`): ``FSDPMemTracker`` for an FSDP2 root, else a ``MemTracker`` told
    about the model and the optimizer (one that accepts a module run once per microbatch,
    as under a pipeline schedule: :func:`_schedule_mem_tracker`)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return _peak_only(FSDPMemTracker)(model, optimizer)
    tracker = _schedule_mem_tracker()
    tracker.track_external(model, optimizer)
    return tracker


#: DDP's default gradient bucket (``DistributedDataParallel(bucket_cap_mb=25)``), MiB.
DDP_BUCKET_MIB = 25


def _ddp_rank(single: RankMemory, rank: int, world_size: int) -> RankMemory:
    """A DDP rank from one process's step: the same tensors, plus DDP's gradient buckets
    (a second copy of the gradients, ``gradient_as_bucket_view=False``) and one all-reduce
    per 25 MiB bucket over every rank. DDP is not run on the fake group itself: its
    constructor reads parameter values across ranks, which meta weights do not have."""
    buckets = max(1, -(-single.grads_bytes // (DDP_BUCKET_MIB * 2**20)))
    return RankMemory(
        rank=rank, params_bytes=single.params_bytes, grads_bytes=single.grads_bytes,
        optimizer_bytes=single.optimizer_bytes, activations_bytes=single.activations_bytes,
        temporary_bytes=single.temporary_bytes + single.grads_bytes,
        peak_bytes=single.peak_bytes + single.grads_bytes,
        collectives=[Collective("dp_replicate", "all_reduce", world_size, buckets,
                                single.grads_bytes)])


def simulate_rank(spec: StepSpec, parallelism: ParallelismConfig, world_size: int,
                  rank: int = 0, local_world_size: Optional[int] = None) -> RankMemory:
    """Rank ``rank`` of ``world_size`` running one steady-state training step of ``spec``.

    Args:
        spec: the model, optimizer, batch and microbatching.
        parallelism: the run's typed ``parallelism_config``.
        world_size: ranks in the job.
        rank: the rank simulated.
        local_world_size: ranks per node (default ``world_size``: one node).

    Returns:
        The rank's bytes by kind, its peak and its collectives.

    Raises:
        ValueError: the layout does not fit (the messages training gives:
            :meth:`ParallelDims.from_config`, the TP plan's checks in ``parallelize``).
        RuntimeError: a process group already exists in this process.
        ValueError: also for a pipelined layout (``pp > 1``): that is
            :func:`cadence.planning.stages.simulate_pipeline_rank`'s.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    local = world_size if local_world_size is None else local_world_size
    # the layout's own checks, before any process group or model: training's messages
    dims = ParallelDims.from_config(parallelism, world_size=world_size,
                                    local_world_size=local, global_rank=rank)
    if dims.pp_enabled:
        raise ValueError("simulate_rank does not run a pipeline's schedule; simulate a "
                         "pipelined rank (parallelism_config.pp) with cadence.planning.stages"
                         ".simulate_pipeline_rank.")
    if dims.uses_ddp:
        return _ddp_rank(simulate_rank(spec, parallelism, 1), rank, world_size)
    with fake_process_group(rank, world_size):
        mesh = dims.build_mesh("cpu") if dims.needs_mesh else None
        model = spec.build_model()
        plan = ParallelPlan(parallelism=parallelism, compile=None, device=torch.device("meta"),
                            precision=spec.precision, mesh=mesh, dims=dims, seed=0)
        model = parallelize(model, plan)  # sharded on meta: no memory yet
        with FakeTensorMode(allow_non_fake_inputs=True):
            ties = shared_parameters(model)
            model.to_empty(device="cpu")  # the shards, as fake tensors
            retie_parameters(ties)
            optimizer = spec.build_optimizer(model)
            micro = [spec.build_batch(spec.microbatch_size)
                     for _ in range(min(spec.num_microbatches, 2))]
            create_optimizer_state(model, optimizer)
            tracker = tracker_for(model, optimizer)
            names = group_names(mesh)
            if dims.ep_enabled:  # the experts' mesh: ep and the experts' data-parallel ranks
                names.update(group_names(dims.expert_mesh))
            counter = CollectiveCounter(names)
            with counter, (balanced_routing() if dims.ep_enabled else contextlib.nullcontext()):
                train_step(model, optimizer, micro, spec.precision, last=tracker)
            state = local_state_bytes(model, optimizer)
        activations, temporaries, peak = memory_breakdown(tracker)
    collectives = list(counter.collectives.values())
    scale = spec.num_microbatches / len(micro)
    for entry in collectives:  # microbatches after the second issue what the second did
        entry.count, entry.bytes = round(entry.count * scale), round(entry.bytes * scale)
    return RankMemory(rank=rank, params_bytes=state["params"], grads_bytes=state["grads"],
                      optimizer_bytes=state["optimizer"], activations_bytes=activations,
                      temporary_bytes=temporaries, peak_bytes=peak, collectives=collectives)
