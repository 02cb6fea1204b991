"""A pipeline rank, simulated: the real split and per-stage parallelize plan for the stages
the rank holds, and the step its schedule runs, on fake tensors.

:func:`simulate_pipeline_rank` makes this process rank ``r`` of ``N`` on the ``fake``
process group and builds what :func:`cadence.parallel.pipeline.parallelize_pipeline`
builds on that rank, from the same public functions: the model split
(:func:`~cadence.parallel.pipeline_split.split_model`), this rank's stages
(:func:`~cadence.parallel.pipeline.stage_ids`), the other stages' modules dropped
(:func:`~cadence.parallel.pipeline.keep_local_modules`), and each stage parallelized by
:func:`cadence.parallel.plan.parallelize` on the mesh without its ``pp`` dimension. Two
differences from training, neither of which changes a byte: the model is on the meta
device (training builds a pipelined model on the CPU), so each stage gets a no-op init hook
(on meta nothing is read); and no ``PipelineStage`` is built: the schedule's order of
forwards and backwards is run directly (:func:`schedule_order`), the tensors a stage
receives made as fake tensors of the shape the previous stage sends.

**The schedule's microbatches in flight** (the activation memory), ``p`` pipeline ranks,
``m`` microbatches, ``v`` stages per rank, rank ``r``:

- ``GPipe``: every forward, then every backward: ``m`` microbatches' activations at once.
- ``1F1B``: ``min(m, p - r - 1)`` warm-up forwards, then one forward and one backward in
  turn: at most ``min(m, p - r)`` in flight (``p`` on the first stage, 1 on the last).
- ``LoopedBFS``: every forward of each local stage in turn, then the backwards: ``m v``.
- ``Interleaved1F1B``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``, ``DualPipeV``: the
  interleaved 1F1B order of Narayanan et al. 2021 (Megatron-LM, "Efficient Large-Scale
  Language Model Training on GPU Clusters", sec. 2.2): ``min(m v, 2 (p - r - 1) + (v - 1) p)``
  warm-up forwards of (stage, microbatch) units, then one forward and one backward in turn.
  The zero-bubble schedules' split of the weight gradient (which frees activations a little
  later) is not modelled: their peak is the interleaved schedule's.

The steady state repeats itself, so under ``1F1B`` at most two microbatches past the
warm-up are run (the peak is reached by then, every gradient already allocated); the
others' sends are counted as those.

**What a ``PipelineStage`` holds** besides the activations: one receive buffer per
microbatch for its input (a stage that is not the first) and for its output's gradient
(one that is not the last), allocated once and kept; the last stage also keeps every
microbatch's output until the step ends (the schedule returns them merged).

**Point-to-point bytes** per step: a stage that is not the last sends each microbatch's
output forward and receives its gradient back; one that is not the first receives its
input and sends the input's gradient back: ``[microbatch, seq, hidden]`` at the activation
dtype (FSDP2's ``param_dtype`` under mixed precision, else float32), per microbatch.

Sources: ``torch.distributed.pipelining.schedules`` (the schedules' orders); Narayanan et
al. 2021 (the interleaved warm-up count).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cadence.core.precision import get_precision_context
from cadence.parallel.config import ParallelismConfig
from cadence.parallel.parallel_dims import ParallelDims
from cadence.planning.collectives import Collective

__all__ = ["schedule_order", "simulate_pipeline_rank", "bubble_factor"]


def schedule_order(schedule: str, pp: int, pp_rank: int, m: int,
                   v: int = 1) -> list[tuple[str, int, int]]:
    """The forwards and backwards pipeline rank ``pp_rank`` runs in one step, in order:
    ``("F" | "B", local stage index, microbatch)`` (see the module docstring).

    Args:
        schedule: ``pp.schedule``.
        pp: pipeline ranks.
        pp_rank: this rank's place in the pipeline.
        m: microbatches per step.
        v: stages per rank.
    """
    if schedule == "GPipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    if schedule == "1F1B":
        warm = min(m, pp - pp_rank - 1)
        order = [("F", 0, i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", 0, warm + i), ("B", 0, i)]
        return order + [("B", 0, i) for i in range(m - warm, m)]
    if schedule == "LoopedBFS":
        forward = [("F", s, i) for s in range(v) for i in range(m)]
        return forward + [("B", s, i) for s in reversed(range(v)) for i in range(m)]
    units = m * v

    def unit(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // pp) % v
        return (v - 1 - chunk if backward else chunk), (k // (pp * v)) * pp + k % pp

    if m % pp:  # the V schedules take any m >= p: the units in plain order
        def unit(k: int, backward: bool) -> tuple[int, int]:  # noqa: F811
            chunk = k // m
            return (v - 1 - chunk if backward else chunk), k % m
    warm = min(units, 2 * (pp - pp_rank - 1) + (v - 1) * pp)
    order = [("F", *unit(k, False)) for k in range(warm)]
    for k in range(units - warm):
        order += [("F", *unit(warm + k, False)), ("B", *unit(k, True))]
    return order + [("B", *unit(k, True)) for k in range(units - warm, units)]


def bubble_factor(schedule: str, pp: int, m: int, v: int = 1) -> float:
    """The step's time over its compute without the pipeline's fill and drain: ``(m + p -
    1) / m`` for ``GPipe`` / ``1F1B``, ``(m + (p - 1) / v) / m`` for the interleaved and V
    schedules (Narayanan et al. 2021, sec. 2.2); 1 without a pipeline."""
    if pp <= 1:
        return 1.0
    if schedule in ("GPipe", "1F1B"):
        return (m + pp - 1) / m
    return (m + (pp - 1) / max(v, 1)) / m


def _simulated_order(order: list[tuple[str, int, int]], schedule: str,
                     m: int) -> tuple[list[tuple[str, int, int]], int]:
    """The part of ``order`` run and the microbatches it covers: under ``1F1B`` the
    microbatches up to one past those in flight before the first backward (its forward
    runs with every gradient allocated: the steady state's peak), else all."""
    if schedule != "1F1B":
        return order, m
    in_flight = next((j for j, (kind, _, _) in enumerate(order) if kind == "B"), len(order))
    run = min(m, in_flight + 1)
    return [a for a in order if a[2] < run], run


def _activation_dtype(parallelism: ParallelismConfig, precision: str) -> torch.dtype:
    if parallelism.fsdp is not None:
        from cadence.parallel.fsdp import mixed_precision_policy

        policy = mixed_precision_policy(parallelism.fsdp, precision)
        if getattr(policy, "param_dtype", None) is not None:
            return policy.param_dtype
    return torch.float32


def _hidden_size(model: nn.Module) -> int:
    config = getattr(getattr(model, "model", model), "config", None) or getattr(
        model, "config", None)
    for key in ("hidden_size", "n_embd", "d_model"):
        if isinstance(getattr(config, key, None), int):
            return int(getattr(config, key))
    raise ValueError(f"cadence plan sends [batch, seq, hidden] between pipeline stages and "
                     f"needs the model's config.hidden_size; {type(model).__name__} has none.")


def simulate_pipeline_rank(spec: Any, parallelism: ParallelismConfig, world_size: int,
                           rank: int, local_world_size: int) -> Any:
    """Rank ``rank`` of a pipelined run, one steady-state step of ``spec`` (a
    :class:`~cadence.planning.simulate.StepSpec`; ``spec.num_microbatches`` the pipeline's
    microbatches). Returns a :class:`~cadence.planning.simulate.RankMemory` whose
    collectives include the ``pp`` sends and receives.

    Raises:
        ValueError: what training raises for the split or the per-stage plan.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cadence.parallel.memory import local_state_bytes
    from cadence.parallel.param_init import retie_parameters, shared_parameters
    from cadence.parallel.pipeline import keep_local_modules, stage_ids
    from cadence.parallel.pipeline_split import split_model
    from cadence.parallel.plan import ParallelPlan, parallelize
    from cadence.planning.collectives import CollectiveCounter, group_names
    from cadence.planning.simulate import (
        RankMemory, create_optimizer_state, fake_process_group, memory_breakdown, tracker_for,
    )

    config = parallelism.pp
    assert config is not None
    dims = ParallelDims.from_config(parallelism, world_size=world_size,
                                    local_world_size=local_world_size, global_rank=rank)
    p, v, m = dims.pp, int(config.stages_per_rank or 1), spec.num_microbatches
    with fake_process_group(rank, world_size):
        mesh = dims.build_mesh("cpu")
        model = spec.build_model()
        hidden = _hidden_size(model)
        split = split_model(model, config.num_stages, config.split_points)
        names = tuple(n for n in mesh.mesh_dim_names or () if n != "pp")
        stage_mesh = mesh[names] if len(names) > 1 else mesh[names[0]]
        ids = stage_ids(dims.pp_rank, p, v, config.schedule)
        local = [split.stages[i] for i in ids]
        keep_local_modules(model, local)
        plan = ParallelPlan(parallelism=parallelism, compile=None,
                            device=torch.device("meta"), precision=spec.precision,
                            mesh=stage_mesh, dims=dims, seed=0)
        modules = []
        for stage in local:  # meta weights: nothing to initialise, nothing is read
            stage.param_init_fn = lambda module: None
            modules.append(parallelize(stage, plan))
        first = [i == 0 for i in ids]
        last = [i == config.num_stages - 1 for i in ids]
        order, run = _simulated_order(schedule_order(config.schedule, p, dims.pp_rank, m, v),
                                      config.schedule, m)
        dtype = _activation_dtype(parallelism, spec.precision)
        with FakeTensorMode(allow_non_fake_inputs=True):
            ties = shared_parameters(model)
            model.to_empty(device="cpu")
            retie_parameters(ties)
            optimizer = spec.build_optimizer(model)
            batches = [spec.build_batch(spec.microbatch_size) for _ in range(run)]
            create_optimizer_state(model, optimizer)
            tracker = tracker_for(model, optimizer)  # the model is no FSDP root: MemTracker
            counter = CollectiveCounter(group_names(mesh))
            sent: dict[str, list[int]] = {"send": [0, 0], "recv": [0, 0]}  # [count, bytes]
            with counter, tracker:
                kept = _run_order(order, modules, split, model, batches, first, last, m,
                                  hidden, dtype, spec.precision, sent, skipped=m - run)
                optimizer.step()  # the receive buffers and outputs still held
                del kept
            state = local_state_bytes(model, optimizer)
        activations, temporaries, peak = memory_breakdown(tracker)
    collectives = list(counter.collectives.values())
    scale = m / run
    for entry in collectives:
        entry.count, entry.bytes = round(entry.count * scale), round(entry.bytes * scale)
    for op, (count, nbytes) in sent.items():
        if count:
            collectives.append(Collective("pp", op, p, round(count * scale),
                                          round(nbytes * scale)))
    return RankMemory(rank=rank, params_bytes=state["params"], grads_bytes=state["grads"],
                      optimizer_bytes=state["optimizer"], activations_bytes=activations,
                      temporary_bytes=temporaries, peak_bytes=peak, collectives=collectives)


def _run_order(order: list[tuple[str, int, int]], modules: list[nn.Module], split: Any,
               model: nn.Module, batches: list[Any], first: list[bool], last: list[bool],
               m: int, hidden: int, dtype: torch.dtype, precision: str,
               sent: dict[str, list[int]], skipped: int = 0) -> list[torch.Tensor]:
    """Run the schedule's forwards and backwards (fake tensors) holding what a
    ``PipelineStage`` holds: a stage's input is the batch's (first stage) or a receive
    buffer ``[mb, seq, hidden]``, one per microbatch, kept for the step (as are the
    gradient receive buffers of a stage that is not the last); the last stage keeps each
    microbatch's output for the step (the schedule merges them) and takes the model's loss
    of it (a microbatch's share of the batch). The ``skipped`` microbatches not run (the
    steady state repeats) still leave their kept tensors: allocated, like microbatch 0's,
    before the last backward (when the real schedule holds every microbatch's). Returns the kept tensors (held through the
    optimizer step, as the stage holds them)."""
    context = get_precision_context(precision, device="cpu")
    live: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    kept: list[torch.Tensor] = []  # receive buffers and the last stage's outputs
    of_microbatch: dict[int, list[torch.Tensor]] = {}  # what each microbatch leaves
    final = max(j for j, (kind, _, _) in enumerate(order) if kind == "B")

    def keep(i: int, tensor: torch.Tensor) -> None:
        kept.append(tensor)
        of_microbatch.setdefault(i, []).append(tensor)

    for j, (kind, s, i) in enumerate(order):
        batch = batches[i]
        if kind == "F":
            if first[s]:
                x = split.inputs(batch)
            else:
                ids = split.inputs(batch)
                buffer = torch.empty((*ids.shape[:2], hidden), dtype=dtype)
                keep(i, buffer)
                x = buffer.detach().requires_grad_(True)
                _count(sent, "recv", x)
            with context:
                out = modules[s](x)
                if last[s]:
                    keep(i, out)
                    out = model.loss(split.outputs(out, batch), batch) / m
            if not last[s]:
                _count(sent, "send", out)
            live[(s, i)] = (x, out)
        else:
            if j == final:  # by the last backward every microbatch has left its tensors
                kept.extend(torch.empty_like(t) for _ in range(skipped)
                            for t in of_microbatch.get(0, []))
            x, out = live.pop((s, i))
            if last[s]:
                out.backward()
            else:
                grad = torch.empty_like(out)  # the output's gradient, from the next stage
                keep(i, grad)
                _count(sent, "recv", grad)
                out.backward(grad)
            if not first[s]:
                _count(sent, "send", x)  # the input's gradient, to the previous stage
            del x, out
    return kept


def _count(sent: dict[str, list[int]], op: str, tensor: torch.Tensor) -> None:
    sent[op][0] += 1
    sent[op][1] += tensor.numel() * tensor.element_size()
