"""``plan_run``: a run file on a cluster that does not exist yet: what each rank holds and
sends, how long a step takes, whether it fits, and what to change when it does not.

The run file is loaded and checked as ``cadence train`` loads it (:func:`~cadence.config.load.
load_config`, with the world size given), the layout is checked with training's own
messages (:meth:`~cadence.parallel.parallel_dims.ParallelDims.from_config`, the global
batch over the data-parallel ranks, the TP plan against the model), and the ranks that
differ (the first and the last: FSDP2's last shards may be shorter) are simulated
(:func:`~cadence.planning.simulate.simulate_rank`). A rank fits when its peak tensor memory
is at most ``headroom`` (default 0.9) of the device's memory: the rest is for the CUDA and
NCCL contexts and the caching allocator's fragmentation, which tensors do not show.

When the largest peak does not fit, the usual ways out are tried in order, each on top of
the ones before, as run-file overrides (:data:`REMEDIES`): activation checkpointing, a
smaller microbatch (halved down to 1), ``FULL_SHARD``, CPU offload, then a tensor-parallel
degree doubled up to the ranks of one node; the first layout that fits is reported with its
estimated throughput against the original's.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

from cadence.config.load import ConfigError, ConfigProblem, TrainConfig, load_config
from cadence.planning.devices import Device

__all__ = ["Plan", "Remedy", "plan_run", "plan_config", "REMEDIES"]


@dataclass
class Remedy:
    """A layout that fits, found after the run's did not.

    Attributes:
        overrides: the ``key=value`` run-file overrides that make it (in the order tried).
        peak_bytes: its largest per-rank peak.
        tokens_per_second_per_device: its estimated throughput.
        throughput_change: its throughput / the original's - 1 (``-0.25``: 25 % slower).
    """

    overrides: list[str]
    peak_bytes: int
    tokens_per_second_per_device: float
    throughput_change: float


@dataclass
class Plan:
    """What ``cadence plan`` found (see :meth:`to_dict` for the JSON form).

    Attributes:
        world_size / nnodes: the cluster.
        device: the accelerator.
        layout: the degrees (``ParallelDims.describe()``).
        ranks: one :class:`~cadence.planning.simulate.RankMemory` per simulated rank.
        estimate: the step estimate (:class:`~cadence.planning.estimate.StepEstimate`).
        memory_limit_bytes: the memory a rank may use (``headroom`` x device memory).
        fits: whether every simulated rank's peak is within the limit.
        remedy: the first layout that fits, when this one does not (``None``: it fits, or
            nothing tried fits).
        tried: every override list tried, in order, with its peak.
        notes: what the simulation did not model for this run.
    """

    world_size: int
    nnodes: int
    device: Device
    layout: str
    ranks: list[Any]
    estimate: Any
    memory_limit_bytes: int
    fits: bool
    remedy: Optional[Remedy] = None
    tried: list[tuple[list[str], int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        """The largest peak of the simulated ranks."""
        return max(r.peak_bytes for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data (``cadence plan --json``)."""
        from cadence.planning.estimate import to_dict

        first = self.ranks[0]
        return {
            "world_size": self.world_size, "nnodes": self.nnodes, "device": self.device.name,
            "layout": self.layout,
            "ranks": [r.to_dict() for r in self.ranks],
            "collectives": [c.to_dict() for c in first.collectives],
            "step_seconds": self.estimate.step_seconds,
            "tokens_per_second_per_device": self.estimate.tokens_per_second_per_device,
            "mfu": self.estimate.mfu,
            "fits": self.fits,
            "memory_limit_bytes": self.memory_limit_bytes,
            "estimate": to_dict(self.estimate),
            "remedy": None if self.remedy is None else {
                "overrides": self.remedy.overrides, "peak_bytes": self.remedy.peak_bytes,
                "tokens_per_second_per_device": self.remedy.tokens_per_second_per_device,
                "throughput_change": self.remedy.throughput_change},
            "tried": [{"overrides": o, "peak_bytes": p} for o, p in self.tried],
            "notes": self.notes,
        }


def plan_run(config: str, overrides: Sequence[str] = (), *, world_size: int, nnodes: int = 1,
             device: Device, ranks: Optional[Sequence[int]] = None,
             seq_len: Optional[int] = None, headroom: float = 0.9,
             remedies: bool = True) -> Plan:
    """Plan the run file ``config`` (with ``overrides``) on ``world_size`` ranks.

    Args:
        config: the run file.
        overrides: ``key=value`` overrides, as for ``cadence train``.
        world_size: ranks in the job (``nnodes`` x GPUs per node).
        nnodes: nodes; ``world_size`` must divide over them.
        device: the accelerator (:func:`~cadence.planning.devices.get_device`).
        ranks: the ranks to simulate (default: the first and the last).
        seq_len: tokens per sample (default: the train loader's ``seq_len`` /
            ``max_seq_len``, else the model's).
        headroom: share of the device memory tensors may use.
        remedies: look for a layout that fits when this one does not.

    Raises:
        ConfigError: the run file has problems, the layout does not fit the world size,
            the global batch does not divide over the data-parallel ranks, or the pipeline
            cannot run (each with the message training gives).
        ValueError: bad arguments (naming them).
    """
    _check_cluster(world_size, nnodes, headroom)
    cfg = load_config(config, overrides, world_size=world_size)
    return plan_config(cfg, world_size=world_size, nnodes=nnodes, device=device, ranks=ranks,
                       seq_len=seq_len, headroom=headroom,
                       replan=(lambda extra: load_config(config, [*overrides, *extra],
                                                         world_size=world_size))
                       if remedies else None)


def plan_config(cfg: TrainConfig, *, world_size: int, nnodes: int = 1, device: Device,
                ranks: Optional[Sequence[int]] = None, seq_len: Optional[int] = None,
                headroom: float = 0.9,
                replan: Optional[Callable[[list[str]], TrainConfig]] = None,
                build_model: Optional[Callable[[], Any]] = None) -> Plan:
    """Plan a loaded config (see :func:`plan_run`); ``replan(overrides)`` reloads it with
    more overrides (for the remedies); ``build_model`` replaces the run file's model (a
    model on the meta device, e.g. a Llama shape built in Python)."""
    _check_cluster(world_size, nnodes, headroom)
    first = _plan_once(cfg, world_size, nnodes, device, ranks, seq_len, headroom, build_model)
    if first.fits or replan is None:
        return first
    from cadence.parallel.config import ParallelismConfig
    from cadence.parallel.parallel_dims import ParallelDims

    base_tps = first.estimate.tokens_per_second_per_device
    dp_size = ParallelDims.from_config(cfg.parallelism_config or ParallelismConfig(),
                                       world_size=world_size,
                                       local_world_size=world_size // nnodes,
                                       global_rank=0).dp_size
    for overrides in _remedy_overrides(cfg, world_size // nnodes,
                                       _per_device_batch(cfg, dp_size)):
        try:
            candidate = _plan_once(replan(overrides), world_size, nnodes, device, ranks,
                                   seq_len, headroom, build_model)
        except (ConfigError, ValueError) as exc:  # a remedy this layout cannot take
            first.notes.append(f"{' '.join(overrides)}: not possible ({_first_line(exc)})")
            continue
        first.tried.append((overrides, candidate.peak_bytes))
        if candidate.fits:
            tps = candidate.estimate.tokens_per_second_per_device
            first.remedy = Remedy(overrides, candidate.peak_bytes, tps,
                                  tps / base_tps - 1 if base_tps else 0.0)
            break
    return first


# ----------------------------------------------------------------------------- remedies

#: The ways out, in the order tried (each on top of the ones before).
REMEDIES = ("activation checkpointing", "smaller microbatch", "FULL_SHARD", "CPU offload",
            "larger tensor-parallel degree")


def _remedy_overrides(cfg: TrainConfig, ranks_per_node: int,
                      per_device_batch: int) -> Iterator[list[str]]:
    """The override lists :data:`REMEDIES` make for ``cfg``, cumulative."""
    parallelism = cfg.parallelism_config
    fsdp = parallelism.fsdp if parallelism is not None else None
    key = "parallelism_config.fsdp"
    done: list[str] = []
    if fsdp is None or not fsdp.activation_checkpointing:
        done.append(f"{key}.activation_checkpointing=true")
        yield list(done)
    micro = getattr(cfg, "device_train_microbatch_size", None)
    size = min(micro, per_device_batch) if isinstance(micro, int) else per_device_batch
    while size > 1:
        size //= 2
        yield [*done, f"device_train_microbatch_size={size}"]
    done.append(f"device_train_microbatch_size={size}")
    if fsdp is None or fsdp.sharding_strategy != "FULL_SHARD":
        done.append(f"{key}.sharding_strategy=FULL_SHARD")
        yield list(done)
    if fsdp is None or not fsdp.cpu_offload:
        done.append(f"{key}.cpu_offload=true")
        yield list(done)
        done.pop()  # TP instead of offload: offload costs more than a node's TP group
    tp = parallelism.tp_degree if parallelism is not None else 1
    while tp * 2 <= ranks_per_node:
        tp *= 2
        yield [*done, f"parallelism_config.tp.tensor_parallel_degree={tp}"]


# ----------------------------------------------------------------------------- one plan

def _plan_once(cfg: TrainConfig, world_size: int, nnodes: int, device: Device,
               ranks: Optional[Sequence[int]], seq_len: Optional[int], headroom: float,
               build_model: Optional[Callable[[], Any]]) -> Plan:
    from cadence.parallel.config import ParallelismConfig
    from cadence.parallel.parallel_dims import ParallelDims
    from cadence.planning.estimate import estimate_step, mesh_strides
    from cadence.planning.simulate import StepSpec, simulate_rank
    from cadence.utils.flops import precision_key

    parallelism = cfg.parallelism_config or ParallelismConfig()
    per_node = world_size // nnodes
    try:
        dims = ParallelDims.from_config(parallelism, world_size=world_size,
                                        local_world_size=per_node, global_rank=0)
    except ValueError as exc:
        raise ConfigError([ConfigProblem("parallelism_config", str(exc))]) from None
    batch = _per_device_batch(cfg, dims.dp_size)
    micro = getattr(cfg, "device_train_microbatch_size", None)
    pp = parallelism.pp if dims.pp_enabled else None
    if pp is not None:  # the pipeline's microbatches, as its step counts them
        _check_pipeline_run(cfg)
        try:
            count = pp.microbatches_for(batch, micro if isinstance(micro, int) else None)
        except ValueError as exc:
            raise ConfigError([ConfigProblem("parallelism_config.pp", str(exc))]) from None
        micro = batch // count
    micro = micro if isinstance(micro, int) else batch
    micro = min(micro, batch)
    model_builder = build_model or (lambda: _meta_model(cfg))
    probe = model_builder()
    vocab = _vocab_size(probe)
    tokens = seq_len or _seq_len(cfg, probe)
    precision = str(getattr(cfg.precision, "value", cfg.precision))
    spec = StepSpec(build_model=model_builder,
                    build_optimizer=lambda model: _optimizer(cfg, model),
                    build_batch=lambda n: _lm_batch(n, tokens, vocab),
                    microbatch_size=micro, num_microbatches=-(-batch // micro),
                    precision=precision)
    chosen = sorted(set(ranks if ranks is not None else (0, world_size - 1)))
    for rank in chosen:
        if not 0 <= rank < world_size:
            raise ValueError(f"--ranks: rank {rank} is not in 0..{world_size - 1}.")
    if dims.pp_enabled:  # the stages each rank holds, their schedule's order
        from cadence.planning.stages import simulate_pipeline_rank as simulate
    else:
        simulate = simulate_rank
    simulated = [_in_child(lambda rank=rank: simulate(spec, parallelism, world_size, rank,
                                                      per_node))
                 for rank in chosen]
    fsdp = parallelism.fsdp
    flops = _flops_per_device(probe, batch, tokens, dims.tp * dims.pp)
    offload = 0
    if fsdp is not None and fsdp.cpu_offload:  # the sharded state lives on the host
        for r in simulated:
            r.peak_bytes = max(r.peak_bytes - r.params_bytes - r.grads_bytes
                               - r.optimizer_bytes, 0)
        offload = max(r.params_bytes for r in simulated)
    # every simulated rank's step; the slowest sets the pace (a pipeline's stages wait
    # for each other, data-parallel ranks at each collective)
    estimate = max((estimate_step(
        r.collectives, model_flops_per_device=flops,
        tokens_per_device=batch * tokens / (dims.tp * dims.pp), device=device,
        precision_key=precision_key(precision, allow_tf32=True),
        activation_checkpointing=bool(fsdp is not None and fsdp.activation_checkpointing),
        mesh=mesh_strides(dims.mesh_shape, dims.mesh_dim_names), world_size=world_size,
        ranks_per_node=per_node, offload_bytes=offload,
        pipeline_bubble=_bubble(pp, dims.pp, spec.num_microbatches)) for r in simulated),
        key=lambda e: e.step_seconds)
    limit = int(device.memory_bytes * headroom)
    notes = ["torch.compile is not simulated: the step runs eager"] if cfg.compile_config else []
    if pp is not None:
        notes.append(f"pipeline: {pp.schedule}, {spec.num_microbatches} microbatches of "
                     f"{micro} per step; the activations of the microbatches the schedule "
                     f"holds in flight on each rank (cadence.planning.stages)")
    elif not isinstance(getattr(cfg, "device_train_microbatch_size", None), int):
        notes.append(f"microbatch size {micro} (the per-device batch; 'auto' or unset)")
    if dims.ep_enabled:
        notes.append("expert parallelism: balanced routing assumed (each rank's experts get "
                     "an even share of the routed tokens; cadence.planning.experts)")
    return Plan(world_size=world_size, nnodes=nnodes, device=device, layout=dims.describe(),
                ranks=simulated, estimate=estimate, memory_limit_bytes=limit,
                fits=all(r.peak_bytes <= limit for r in simulated), notes=notes)


def _in_child(simulate: Callable[[], Any]) -> Any:
    """``simulate()`` in a forked child process, its result (or its error) sent back.

    Each rank is simulated in a process of its own: torch keeps state from one fake process
    group to the next (a ``DeviceMesh`` equal to the last one is handed the last one's
    destroyed groups), so a second rank in the same process fails to resolve them.

    Raises:
        ValueError / RuntimeError: what the simulation raised (its message kept).
    """
    import os
    import pickle

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: simulate, send, leave without cleanup handlers
        os.close(read)
        try:
            payload = pickle.dumps(("ok", simulate()))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
            kind = "ValueError" if isinstance(exc, ValueError) else "RuntimeError"
            payload = pickle.dumps((kind, f"{exc}"))
        with os.fdopen(write, "wb") as pipe:
            pipe.write(payload)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError("cadence plan: the simulation of a rank died without a result "
                           f"({_exit_reason(status)}).")
    kind, value = pickle.loads(data)
    if kind == "ok":
        return value
    raise (ValueError if kind == "ValueError" else RuntimeError)(value)


def _exit_reason(status: int) -> str:
    """How a child process ended, from ``os.waitpid``'s status: ``killed by SIGSEGV`` or
    ``exit code 1``."""
    import os
    import signal

    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:  # a real-time signal: no name
            return f"killed by signal {number}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def _check_cluster(world_size: int, nnodes: int, headroom: float) -> None:
    if world_size < 1 or nnodes < 1:
        raise ValueError(f"--world-size and --nnodes must be at least 1 (got {world_size} "
                         f"and {nnodes}).")
    if world_size % nnodes:
        raise ValueError(f"--world-size {world_size} does not divide over --nnodes {nnodes}; "
                         f"give the same number of GPUs on every node.")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}.")


def _bubble(pp: Any, degree: int, microbatches: int) -> float:
    from cadence.planning.stages import bubble_factor

    if pp is None:
        return 1.0
    return bubble_factor(pp.schedule, degree, microbatches, int(pp.stages_per_rank or 1))


def _check_pipeline_run(cfg: TrainConfig) -> None:
    """What the Trainer's :func:`~cadence.trainer.pipeline_step.check_pipeline_run` refuses
    under a pipeline and a run file shows, with its messages."""
    from cadence.trainer.pipeline_step import AMP_FP16_REASON, AUTO_MICROBATCH_REASON

    problems = []
    if getattr(cfg, "device_train_microbatch_size", None) == "auto":
        problems.append(AUTO_MICROBATCH_REASON)
    if str(getattr(cfg.precision, "value", cfg.precision)) == "amp_fp16":
        problems.append(AMP_FP16_REASON)
    if problems:
        raise ConfigError([ConfigProblem("parallelism_config.pp", p) for p in problems])


def _per_device_batch(cfg: TrainConfig, dp_size: int) -> int:
    from cadence.config.build import per_device_batch_size

    return per_device_batch_size(cfg.global_train_batch_size, dp_size)


def _meta_model(cfg: TrainConfig) -> Any:
    """The run file's model on the meta device, as ``build_trainer`` builds it (a builder
    taking ``init_device`` gets ``"meta"``; another is called under the meta device)."""
    import torch

    from cadence.registry import registry

    spec = dict(cfg.model)
    builder = registry.models.get(spec.pop("name"))
    if "init_device" in inspect.signature(builder).parameters:
        spec["init_device"] = "meta"
        return builder(**spec)
    with torch.device("meta"):
        return builder(**spec)


def _vocab_size(model: Any) -> int:
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int):
        raise ValueError(f"cadence plan builds language-model batches (input_ids, labels) and "
                         f"needs the model's config.vocab_size; {type(model).__name__} has "
                         f"none.")
    return vocab


def _seq_len(cfg: TrainConfig, model: Any) -> int:
    loader = cfg.train_loader or {}
    for key in ("seq_len", "max_seq_len"):
        if isinstance(loader.get(key), int):
            return int(loader[key])
    config = getattr(model, "config", None)
    for key in ("n_positions", "max_position_embeddings"):
        if isinstance(getattr(config, key, None), int):
            return int(getattr(config, key))
    raise ValueError("cadence plan: no sequence length in train_loader (seq_len / "
                     "max_seq_len) or the model's config; give --seq-len.")


def _lm_batch(samples: int, seq_len: int, vocab: int) -> dict[str, Any]:
    import torch

    ids = torch.randint(0, vocab, (samples, seq_len))
    return {"input_ids": ids, "labels": ids.clone()}


def _optimizer(cfg: TrainConfig, model: Any) -> Any:
    """The run's optimizer over the trainable parameters (``build_trainer``'s); none named:
    SGD without momentum (Composer's default ``DecoupledSGDW`` keeps no state either)."""
    import torch

    from cadence.optim.optimizers import trainable_parameters
    from cadence.registry import registry

    if cfg.optimizer is None:
        return torch.optim.SGD(trainable_parameters(model), lr=0.1)
    spec = dict(cfg.optimizer)
    return registry.optimizers.get(spec.pop("name"))(trainable_parameters(model), **spec)


def _flops_per_device(model: Any, batch: int, seq_len: int, tp: int) -> float:
    """The step's model FLOPs on one device: the model's ``flops_per_batch`` (the count
    ``SpeedMonitor`` reads) of this rank's batch, split over its tensor-parallel group."""
    import torch

    counter = getattr(model, "flops_per_batch", None)
    if not callable(counter):
        raise ValueError(f"cadence plan estimates the step from the model's FLOPs; "
                         f"{type(model).__name__} has no flops_per_batch(batch).")
    ids = torch.empty((batch, seq_len), dtype=torch.long, device="meta")
    return float(counter({"input_ids": ids, "labels": ids})) / tp


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
