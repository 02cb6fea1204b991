"""Child-tuning: update only a "child network", a subset of the parameters' entries, by
masking the gradients after backward.

Two modes (Xu et al., "Raise a Child in Large Language Model: Towards Effective and
Generalizable Fine-tuning", EMNLP 2021, arXiv 2109.05687):

- ``F`` (task-free): every step a fresh mask ``M ~ Bernoulli(reserve_p)`` per gradient entry;
  kept entries are scaled by ``1 / reserve_p`` so the expected gradient is unchanged:
  ``g <- g * M / reserve_p``.
- ``D`` (task-driven): once, before training, a diagonal Fisher estimate per entry, the mean
  over ``fisher_batches`` training batches of the squared batch gradient,
  ``F_i = mean_b (dL_b/dw_i)^2``; the child network is the ``reserve_p`` fraction of entries
  with the largest ``F_i`` (one threshold over all selected parameters); the mask is fixed
  for the whole run and kept entries are *not* rescaled: ``g <- g * M``.

Which parameters take part: names matching ``param_regex`` (``re.search`` on the names of
the unwrapped model's ``named_parameters()``, e.g.
``model.bert.encoder.layer.0.output.dense.weight``).
The default, :data:`DEFAULT_PARAM_REGEX`, leaves out every name containing ``embed``,
``classifier``, ``pooler``, ``lm_head``, ``score``, ``wte``, ``wpe`` or ``shared``: the
embeddings and the task head are always fully trained, as in the paper's code, whose D mode
selects names containing ``layer`` (BERT's encoder blocks). Differences from the reference
code, all deliberate: F there masks every parameter in the optimizer, here only the selected
ones; D there clips each parameter's gradient to ``max_grad_norm`` before squaring, here the
raw gradient is used; its threshold is ``numpy.percentile`` (interpolated), here the exact
``k``-th largest value with ``k = ceil(reserve_p * n)`` (ties at the threshold are kept).

Masks are applied at ``AFTER_TRAIN_BATCH``: after gradient accumulation, after the fp16
gradient scaler has unscaled the gradients, before the optimizer step. Gradient clipping also
runs there; algorithms run in reverse order on ``AFTER_*`` events, so list ``child_tuning``
*before* ``gradient_clipping`` to clip first and mask second, as the paper's code does.

Under FSDP2 the gradients are DTensor shards: masks are made and applied on each rank's
local shard. F draws its mask from a generator seeded by ``(seed, batch, shard index)``, so
replicas of the same shard (DDP, HYBRID_SHARD) draw the same mask and a resumed run draws
what an uninterrupted one would. D's threshold is found exactly over all ranks' shards by a
distributed bisection over the float bit patterns (32 scalar all-reduces, no gather), so the
mask equals the one a single process would compute for the same Fisher values.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import re
from typing import Any, Callable, ContextManager, Iterable, Iterator, Mapping, Optional

import numpy as np
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from cadence.utils import dist
from cadence.core import Algorithm, Event, State
from cadence.core.data_spec import batch_to_device, num_samples, split_batch
from cadence.core.precision import Precision, get_precision_context
from cadence.registry import algorithms
from cadence.utils.dtensor import (
    dtensor_like, local_tensor, replication_weight, shard_index, shard_like,
)
from cadence.utils.misc import unwrap_model

__all__ = [
    "ChildTuning", "DEFAULT_PARAM_REGEX", "MODES", "child_tuning_f_mask_", "child_tuning_d_mask_",
    "fisher_information", "fisher_mask", "top_fraction_threshold",
]

log = logging.getLogger(__name__)

MODES = ("F", "D")
"""``F``: task-free (a random mask each step); ``D``: task-driven (a fixed Fisher mask)."""

DEFAULT_PARAM_REGEX = r"^(?!.*(?:embed|classifier|pooler|lm_head|score|wte|wpe|shared))"
"""Every parameter name that contains none of ``embed``, ``classifier``, ``pooler``,
``lm_head``, ``score``, ``wte``, ``wpe``, ``shared`` (embeddings and task heads stay fully
trained)."""


# ---------------------------------------------------------------------------------- helpers
def _reduce(values: list[float], op: str, device: torch.device) -> list[float]:
    """All-reduce a few numbers (float64) over all ranks; ``device`` must suit the backend
    (the tensors' own device: CUDA under NCCL)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op)
    return tensor.tolist()


def _global_count(tensors: Iterable[torch.Tensor], count: Callable[[torch.Tensor], float],
                  device: torch.device) -> float:
    """``sum(count(local shard))`` over every global entry once (replicas counted once)."""
    local = sum(replication_weight(t) * count(local_tensor(t)) for t in tensors)
    return _reduce([local], "sum", device)[0]


# ---------------------------------------------------------------------------------- F mode
def child_tuning_f_mask_(grads: Iterable[torch.Tensor], reserve_p: float,
                         generator: torch.Generator) -> None:
    """ChildTuning-F: ``g <- g * Bernoulli(reserve_p) / reserve_p``, in place.

    Args:
        grads: gradients (plain tensors or DTensors; a DTensor's local shard is masked).
        reserve_p: probability of keeping each entry, in ``(0, 1]``.
        generator: draws the masks; on the gradients' device.

    Raises:
        ValueError: ``reserve_p`` outside ``(0, 1]``.
    """
    _check_reserve_p(reserve_p)
    with torch.no_grad():
        for grad in grads:
            local = local_tensor(grad)
            if local.numel() == 0:
                continue
            # uniform [0, 1) -> 1 where < reserve_p (kept), else 0 -> the kept entries' scale
            scale = torch.rand(local.shape, generator=generator, device=local.device)
            scale.lt_(reserve_p).mul_(1.0 / reserve_p)
            local.mul_(scale)


# ---------------------------------------------------------------------------------- D mode
def top_fraction_threshold(values: Iterable[torch.Tensor], fraction: float) -> float:
    """The ``k``-th largest entry over all ``values``, ``k = ceil(fraction * n)``, exactly.

    ``values`` are non-negative (Fisher estimates). DTensors count each global entry once,
    whatever their sharding: the search runs on the local shards with one scalar all-reduce
    per step of a bisection over the float32 bit patterns (which order like the values for
    non-negative floats), at most 32 steps. Call on every rank.

    Args:
        values: non-negative tensors or DTensors (shards).
        fraction: the share of entries at or above the threshold, in ``(0, 1]``.

    Returns:
        The threshold (a float); ``inf`` when there are no entries.

    Raises:
        ValueError: a negative or NaN value, or ``fraction`` outside ``(0, 1]``.
    """
    _check_reserve_p(fraction)
    groups: dict[float, list[torch.Tensor]] = {}
    device = torch.device("cpu")
    for value in values:
        local = local_tensor(value).detach()
        device = local.device
        groups.setdefault(replication_weight(value), []).append(local.reshape(-1).float())
    flat = {w: torch.cat(ts) for w, ts in groups.items()}
    local_bad = sum(float(((t < 0) | t.isnan()).sum()) for t in flat.values())
    if _reduce([local_bad], "sum", device)[0] > 0:
        raise ValueError("top_fraction_threshold needs non-negative values without NaN (did "
                         "the Fisher pass see NaN gradients? check the loss).")
    # abs() turns -0.0 into +0.0; for non-negative float32, value order = int32 bit order
    bits = {w: t.abs().view(torch.int32) for w, t in flat.items()}

    def count_at_least(threshold_bits: int) -> int:
        local = sum(w * float((b >= threshold_bits).sum()) for w, b in bits.items())
        return round(_reduce([local], "sum", device)[0])

    total = count_at_least(0)
    if total == 0:
        return math.inf
    k = max(1, math.ceil(fraction * total - 1e-9))
    local_max = max((float(b.max()) for b in bits.values() if b.numel()), default=0.0)
    lo, hi = 0, int(_reduce([local_max], "max", device)[0]) + 1  # count(lo) >= k > count(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count_at_least(mid) >= k:
            lo = mid
        else:
            hi = mid
    return float(torch.tensor([lo], dtype=torch.int32).view(torch.float32).item())


def fisher_mask(fisher: Mapping[str, torch.Tensor], reserve_p: float) -> dict[str, torch.Tensor]:
    """ChildTuning-D's child network: the top ``reserve_p`` fraction of all Fisher entries.

    One threshold over all parameters (and, for DTensors, all ranks' shards):
    :func:`top_fraction_threshold`. Call on every rank.

    Args:
        fisher: parameter name -> Fisher estimate (non-negative; plain or DTensor).
        reserve_p: the share of entries kept, in ``(0, 1]``.

    Returns:
        name -> bool mask (``fisher >= threshold``), laid out like the Fisher tensor.
    """
    threshold = top_fraction_threshold(fisher.values(), reserve_p)
    return {name: dtensor_like(f, local_tensor(f) >= threshold) for name, f in fisher.items()}


def child_tuning_d_mask_(grads: Iterable[Optional[torch.Tensor]],
                         masks: Iterable[torch.Tensor]) -> None:
    """ChildTuning-D: ``g <- g * M`` in place (no rescaling), gradient by gradient.

    Args:
        grads: gradients (``None`` entries are skipped), plain or DTensor.
        masks: bool masks laid out like the gradients.
    """
    with torch.no_grad():
        for grad, mask in zip(grads, masks):
            if grad is not None:
                local_tensor(grad).mul_(local_tensor(mask))


def fisher_information(
    model: nn.Module,
    batches: Iterable[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    params: Mapping[str, nn.Parameter],
    microbatch_size: Optional[int] = None,
    forward_context: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
) -> dict[str, torch.Tensor]:
    """The diagonal empirical Fisher estimate: the mean over ``batches`` of each batch
    gradient squared, ``F = mean_b (dL_b/dw)^2``, as in the paper's code.

    Gradients are cleared before and after (``.grad`` is left ``None``). Call on every rank
    with the same number of batches (FSDP's collectives run in forward and backward).

    Args:
        model: what to call on a batch (a DDP wrapper or an FSDP2 model is fine).
        batches: batches on the model's device.
        loss_fn: ``(outputs, batch) -> loss`` (a scalar mean over the batch).
        params: name -> parameter to estimate for (plain or DTensor).
        microbatch_size: split each batch into microbatches of this many samples, weighting
            each loss by its share of the batch (the gradient equals the full batch's).
        forward_context: a factory of the context forward and loss run in (autocast).

    Returns:
        name -> fp32 Fisher estimate, laid out like the parameter; zeros if no batches.
    """
    fisher = {name: torch.zeros_like(local_tensor(p), dtype=torch.float32)
              for name, p in params.items()}
    count = 0
    for p in params.values():
        p.grad = None
    for batch in batches:
        size = num_samples(batch)
        for microbatch in (split_batch(batch, microbatch_size) if microbatch_size else [batch]):
            with forward_context():
                outputs = model(microbatch)
                loss = loss_fn(outputs, microbatch) * (num_samples(microbatch) / size)
            loss.backward()
        with torch.no_grad():
            for name, p in params.items():
                if p.grad is not None:
                    fisher[name].add_(local_tensor(p.grad).float().square())
                    p.grad = None
        model.zero_grad(set_to_none=True)
        count += 1
    if count:
        for value in fisher.values():
            value.div_(count)
    return {name: dtensor_like(params[name], value) for name, value in fisher.items()}


# ---------------------------------------------------------------------------------- class
def _check_reserve_p(reserve_p: float) -> None:
    if isinstance(reserve_p, bool) or not isinstance(reserve_p, (int, float)) or not (
            0.0 < reserve_p <= 1.0):
        raise ValueError(f"reserve_p must be a number in (0, 1] (the paper uses 0.1-0.4), got "
                         f"{reserve_p!r}.")


@contextlib.contextmanager
def _rng_untouched(device: torch.device) -> Iterator[None]:
    """Leave Python's, NumPy's and torch's RNGs as they were (the Fisher pass draws dropout
    masks and data-loader seeds that the run itself must not see)."""
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        yield
    random.setstate(py_state)
    np.random.set_state(np_state)


@algorithms.register("child_tuning")
class ChildTuning(Algorithm):
    """Child-tuning (Xu et al., EMNLP 2021): mask the gradients of a subset of entries.

    See the module docstring for the two modes, the default parameter selection and where
    this differs from the reference code.

    Args:
        mode: ``"D"`` (default; task-driven, a fixed Fisher mask) or ``"F"`` (task-free, a
            fresh random mask each step).
        reserve_p: the share of entries updated, in ``(0, 1]``; the paper tunes it in
            0.1-0.4. Default 0.3.
        param_regex: which parameters (by name, ``re.search``) are masked; default
            :data:`DEFAULT_PARAM_REGEX` (all but embeddings and heads).
        fisher_batches: D: training batches in the Fisher estimate (from a separate pass over
            ``state.train_dataloader`` at ``FIT_START``: the run's data order and RNG are
            left untouched); ``None`` (default) uses one whole epoch, as the paper does. A
            number larger than the epoch uses the epoch.
        seed: F: seeds the masks (with the batch number and the shard index); default the
            run's ``rank_zero_seed``.

    State (checkpointed): D's mask (DTensors under FSDP: ``sharded`` checkpoints keep them
    sharded, ``full`` ones hold full tensors, re-sharded on load), F's seed. A resumed D run
    does not re-estimate the Fisher.

    Example (YAML)::

        algorithms:
          child_tuning: {mode: D, reserve_p: 0.3, fisher_batches: 64}

    Raises:
        ValueError: an unknown mode, ``reserve_p`` outside ``(0, 1]``, a bad regex or
            ``fisher_batches`` < 1; at ``BEFORE_LOAD``, a regex that selects no parameter;
            on load, a checkpoint of the other mode or without a mask for a parameter.
    """

    events = frozenset({Event.BEFORE_LOAD, Event.FIT_START, Event.AFTER_TRAIN_BATCH})

    def __init__(self, mode: str = "D", reserve_p: float = 0.3,
                 param_regex: str = DEFAULT_PARAM_REGEX, fisher_batches: Optional[int] = None,
                 seed: Optional[int] = None) -> None:
        mode_upper = str(mode).upper().replace("CHILDTUNING-", "")
        if mode_upper not in MODES:
            raise ValueError(f"mode {mode!r} is not one of: {', '.join(MODES)} (F: task-free, "
                             f"D: task-driven).")
        _check_reserve_p(reserve_p)
        try:
            self._regex = re.compile(param_regex)
        except re.error as exc:
            raise ValueError(f"param_regex {param_regex!r} is not a valid regular expression: "
                             f"{exc}") from None
        if fisher_batches is not None and (isinstance(fisher_batches, bool) or not isinstance(
                fisher_batches, int) or fisher_batches < 1):
            raise ValueError(f"fisher_batches must be a positive int or None (one epoch), got "
                             f"{fisher_batches!r}.")
        self.mode = mode_upper
        self.reserve_p = float(reserve_p)
        self.param_regex = param_regex
        self.fisher_batches = fisher_batches
        self.seed = seed
        self._params: dict[str, nn.Parameter] = {}
        self.masks: dict[str, torch.Tensor] = {}  # D: name -> bool mask, laid out like the param
        self._pending: Optional[dict[str, Any]] = None  # loaded before the params were known

    # ------------------------------------------------------------------ events
    def match(self, event: Event, state: State) -> bool:
        return event in self.events

    def apply(self, event: Event, state: State, logger: Any) -> None:
        if event == Event.BEFORE_LOAD or not self._params:
            self._bind(state)
        if event == Event.FIT_START:
            if self.mode == "D" and not self.masks:
                self._estimate_mask(state, logger)
        elif event == Event.AFTER_TRAIN_BATCH:
            self._mask_gradients(state)

    def _bind(self, state: State) -> None:
        """Find the selected parameters: after parallelize (``BEFORE_LOAD``), the sharded ones.

        FSDP2 registers a unit's gathered parameters while it is unsharded (a root unit stays
        so after an eval forward); ``reshard()`` first, so these are the sharded parameters,
        which receive the gradients.
        """
        model = unwrap_model(state.model)
        if getattr(model, "uses_peft", False):
            raise ValueError(
                "ChildTuning cannot train a peft model (HuggingFaceModel(peft_config=...), "
                "hf_pretrained's peft): it masks the gradients of the full weights by their "
                "Fisher information (Xu et al., 2021), but peft freezes those weights and only "
                "its adapters get gradients, which child tuning does not define masks for. "
                "Remove one: child_tuning from algorithms, or peft from the model.")
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        self._params = {n: p for n, p in model.named_parameters()
                        if p.requires_grad and self._regex.search(n)}
        if not self._params:
            names = [n for n, _ in model.named_parameters()][:10]
            raise ValueError(f"ChildTuning: param_regex {self.param_regex!r} selects no "
                             f"trainable parameter; names look like {names}.")
        if self.seed is None:
            self.seed = int(state.rank_zero_seed)
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.load_state_dict(pending)

    def _mask_gradients(self, state: State) -> None:
        if self.mode == "D":
            if not self.masks:  # fit() not called through FIT_START (should not happen)
                return
            names = list(self._params)
            child_tuning_d_mask_([self._params[n].grad for n in names],
                                 [self.masks[n] for n in names])
            return
        groups: dict[tuple[torch.device, int], list[torch.Tensor]] = {}
        for p in self._params.values():
            if p.grad is not None:
                key = (local_tensor(p.grad).device, shard_index(p.grad))
                groups.setdefault(key, []).append(p.grad)
        for (device, shard), grads in groups.items():
            generator = torch.Generator(device=device)
            generator.manual_seed(hash((self.seed, int(state.timestamp.batch), shard)) & (2**63 - 1))
            child_tuning_f_mask_(grads, self.reserve_p, generator)

    def _estimate_mask(self, state: State, logger: Any) -> None:
        if state.train_dataloader is None:
            raise ValueError("ChildTuning(mode='D') needs a train_dataloader for its Fisher "
                             "estimate.")
        limit = self.fisher_batches
        if limit is None:
            try:
                limit = len(state.train_dataloader)  # type: ignore[arg-type]
            except TypeError:
                raise ValueError("ChildTuning(mode='D') with an unsized train dataloader needs "
                                 "fisher_batches (a number of batches).") from None
        module = unwrap_model(state.model)
        was_training = module.training
        buffers = [b.detach().clone() for b in module.buffers()]
        device = state.device
        with _rng_untouched(device):
            module.train()
            fisher = fisher_information(
                state.model, _agreed_batches(state.train_dataloader, limit, device),
                module.loss, self._params, state.device_train_microbatch_size,
                lambda: get_precision_context(Precision(state.precision), device=device))
        with torch.no_grad():  # BatchNorm statistics: as if the pass had not run
            for buffer, saved in zip(module.buffers(), buffers):
                buffer.copy_(saved)
        module.train(was_training)
        self.masks = fisher_mask(fisher, self.reserve_p)
        masks = list(self.masks.values())
        kept = _global_count(masks, lambda m: float(m.sum()), device)
        total = _global_count(masks, lambda m: float(m.numel()), device)
        fraction = kept / max(total, 1.0)
        log.info("ChildTuning-D: child network of %.4f of %d entries in %d parameters",
                 fraction, round(total), len(masks))
        logger.log_metrics({"child_tuning/kept_fraction": fraction})

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """``mode``, ``reserve_p``, ``seed`` and, for D, ``mask_ready`` and ``mask`` (name ->
        bool tensor; all-False placeholders laid out like the parameters until the mask
        exists, so a sharded checkpoint can be loaded into them)."""
        sd: dict[str, Any] = {"mode": self.mode, "reserve_p": self.reserve_p,
                              "seed": -1 if self.seed is None else int(self.seed)}
        if self.mode == "D":
            sd["mask_ready"] = bool(self.masks)
            sd["mask"] = dict(self.masks) if self.masks else {
                n: dtensor_like(p, torch.zeros_like(local_tensor(p), dtype=torch.bool))
                for n, p in self._params.items()}
        return sd

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; full tensors are re-sharded like the parameters.

        Raises:
            ValueError: the checkpoint was written in the other mode, or lacks a mask for a
                selected parameter.
        """
        if not state:
            return
        saved_mode = state.get("mode", self.mode)
        if saved_mode != self.mode:
            raise ValueError(f"ChildTuning: the checkpoint was written with mode {saved_mode!r}, "
                             f"this run has mode {self.mode!r}; use the same mode, or load with "
                             f"load_ignore_keys=['algorithms/ChildTuning'].")
        seed = int(state.get("seed", -1))
        if seed >= 0:
            self.seed = seed
        if self.mode != "D" or not state.get("mask_ready", False):
            return
        if not self._params:  # loaded before the model was bound: finish at BEFORE_LOAD
            self._pending = dict(state)
            return
        saved = state.get("mask", {})
        missing = sorted(set(self._params) - set(saved))
        if missing:
            raise ValueError(f"ChildTuning: the checkpoint has no mask for {missing[:5]}; was it "
                             f"written with another param_regex?")
        masks = {}
        for name, param in self._params.items():
            try:
                masks[name] = shard_like(param, saved[name], dtype=torch.bool)
            except ValueError as exc:
                raise ValueError(f"ChildTuning: the mask of {name!r}: {exc}") from None
        self.masks = masks


def _agreed_batches(loader: Iterable[Any], limit: int, device: torch.device) -> Iterator[Any]:
    """Up to ``limit`` batches of a fresh iterator over ``loader``, on ``device``; with
    several ranks, only as many as every rank has (each step asks the others)."""
    iterator = iter(loader)
    for _ in range(limit):
        try:
            batch: Any = next(iterator)
            have = 1.0
        except StopIteration:
            batch, have = None, 0.0
        if _reduce([have], "min", device)[0] == 0.0:
            return
        yield batch_to_device(batch, device)
