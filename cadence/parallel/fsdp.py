"""Apply FSDP2 (``torch.distributed.fsdp.fully_shard``) to a model, unit by unit, root last.

Which submodules become FSDP units, for each module (first rule that answers wins):

1. the module's ``_fsdp_wrap`` attribute (``True``/``False``);
2. ``transformer_layer_cls`` from the run's fsdp config (class names), when given;
3. the model's ``fsdp_wrap_fn(module)`` (``bool``, or a dict of ``fully_shard`` keyword
   arguments for that unit); a ``HuggingFaceModel`` answers with its ``_no_split_modules``;
4. ``min_num_params`` (size-based): a module holding at least that many parameters not
   already in a unit.

Explicit run-config choices (2, 4) beat the model's built-in default (3) only where they are
set; the model's own per-module attribute (1) beats everything. Units are sharded
bottom-up, then the root, as torchtitan's ``parallelize`` does.

Norm layers stay fp32 under mixed precision: when the policy all-gathers parameters in
bf16/fp16, every norm module with parameters (:func:`is_norm_module`: ``LayerNorm``,
``RMSNorm``, ``GroupNorm``, batch/instance norms, and classes named ``*Norm`` such as
``LlamaRMSNorm``) becomes its own small unit first, with
``MixedPrecisionPolicy(param_dtype=fp32, reduce_dtype=fp32, output_dtype=<low>,
cast_forward_inputs=True)``: its input is cast to fp32, it computes with fp32 weights, and
its output is cast back to the low precision for the next layer. These units keep their
(tiny) parameters gathered from forward to backward (``reshard_after_forward=False``), so
they add one all-gather per norm per step.

Source: PyTorch FSDP2 (``fully_shard``, ``MixedPrecisionPolicy``, ``CPUOffloadPolicy``,
``FSDPModule.set_modules_to_forward_prefetch``); torchtitan ``apply_fsdp``.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from cadence.utils import dist
from cadence.parallel.config import FSDPConfig
from cadence.parallel.param_init import shared_parameters

__all__ = ["FSDPUnit", "apply_fsdp", "fully_shard_kwargs", "plan_fsdp_units",
           "mixed_precision_policy", "reshard_after_forward_for", "is_norm_module", "norm_mixed_precision_policy"]

log = logging.getLogger(__name__)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, None: None}
_FULLY_SHARD_KWARGS = set(inspect.signature(fully_shard).parameters) - {"module"}


@dataclass
class FSDPUnit:
    """One planned FSDP unit: its qualified name, the module, extra ``fully_shard`` kwargs."""

    name: str
    module: nn.Module
    kwargs: dict[str, Any]

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())


def reshard_after_forward_for(config: FSDPConfig) -> bool | int:
    """``reshard_after_forward`` for the strategy (or the config's explicit override)."""
    if config.reshard_after_forward is not None:
        return config.reshard_after_forward
    return config.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")


def mixed_precision_policy(config: FSDPConfig, precision: str) -> MixedPrecisionPolicy:
    """The ``MixedPrecisionPolicy`` for ``config.mixed_precision`` and the run's precision.

    ``low`` is bf16 for ``amp_bf16``, fp16 for ``amp_fp16``, and none (fp32) for ``fp32``.
    """
    low = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(precision)
    setting = config.mixed_precision
    if isinstance(setting, dict):
        return MixedPrecisionPolicy(
            param_dtype=_DTYPES[setting.get("param_dtype")],
            reduce_dtype=_DTYPES[setting.get("reduce_dtype")],
            output_dtype=_DTYPES[setting.get("output_dtype")],
            cast_forward_inputs=bool(setting.get("cast_forward_inputs", True)),
        )
    if setting == "FULL" or low is None:
        return MixedPrecisionPolicy()
    if setting == "PURE":
        return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low)
    return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)  # DEFAULT


_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase, nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)


def is_norm_module(module: nn.Module) -> bool:
    """Whether ``module`` is a normalisation layer: a torch norm class, or a class whose
    name ends in ``Norm`` (``LlamaRMSNorm``, ``T5LayerNorm``, ...)."""
    return isinstance(module, _NORM_TYPES) or type(module).__name__.endswith("Norm")


def norm_mixed_precision_policy(policy: MixedPrecisionPolicy) -> Optional[MixedPrecisionPolicy]:
    """The policy for norm layers inside units sharded with ``policy``: fp32 parameters,
    inputs and gradient reduction, output cast to ``policy.param_dtype``; ``None`` when
    ``policy`` keeps parameters in fp32 already (nothing to do)."""
    low = policy.param_dtype
    if low is None or low == torch.float32:
        return None
    return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                output_dtype=low, cast_forward_inputs=True)


def _norm_modules(model: nn.Module, units: list[FSDPUnit]) -> list[nn.Module]:
    """Norm modules with their own parameters that are not the root, a planned unit, or
    marked ``_fsdp_wrap = False``."""
    planned = {id(u.module) for u in units}
    return [m for m in model.modules()
            if m is not model and id(m) not in planned and is_norm_module(m)
            and getattr(m, "_fsdp_wrap", None) is not False
            and any(True for _ in m.parameters(recurse=False))]


def _wrap_decision(model: nn.Module, module: nn.Module, config: FSDPConfig) -> Any:
    """True / False / a kwargs dict, or None when no rule answers for ``module``."""
    attr = getattr(module, "_fsdp_wrap", None)
    if attr is not None:
        return attr
    if config.transformer_layer_cls:
        return type(module).__name__ in config.transformer_layer_cls or None
    wrap_fn = getattr(model, "fsdp_wrap_fn", None)
    if callable(wrap_fn):
        answer = wrap_fn(module)
        if answer:
            return answer
    return None


def plan_fsdp_units(model: nn.Module, config: FSDPConfig) -> list[FSDPUnit]:
    """The submodules (not the root) that become FSDP units, in post-order (children first).

    Raises:
        ValueError: ``transformer_layer_cls`` names a class the model does not contain, or a
            ``fsdp_wrap_fn`` dict has a key ``fully_shard`` does not take.
    """
    if not config.auto_wrap:
        return []
    if config.transformer_layer_cls:
        present = {type(m).__name__ for m in model.modules()}
        missing = sorted(set(config.transformer_layer_cls) - present)
        if missing:
            raise ValueError(
                f"parallelism_config.fsdp.transformer_layer_cls names {missing}, which the model "
                f"does not contain. Module classes in the model include: "
                f"{', '.join(sorted(present)[:30])}."
            )
    units: list[FSDPUnit] = []
    unit_param_ids: set[int] = set()
    tied = {id(module._parameters[attr]): [m for m, _ in group]
            for group in shared_parameters(model) for module, attr in group[:1]}

    def tied_outside(module: nn.Module) -> bool:
        """Whether a parameter of ``module`` is also held by a module outside it (a tied
        embedding and output layer): FSDP2 allows one group per parameter, so ``module``
        stays in its parent's group (the root's) with its other holder."""
        inside = {id(m) for m in module.modules()}
        return any(id(holder) not in inside for p in module.parameters()
                   for holder in tied.get(id(p), ()))

    def visit(name: str, module: nn.Module) -> None:
        for child_name, child in module.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child)
        if module is model:
            return
        decision = _wrap_decision(model, module, config)
        if decision is None and config.min_num_params is not None:
            free = sum(p.numel() for p in module.parameters() if id(p) not in unit_param_ids)
            decision = free >= config.min_num_params
        if not decision:
            return
        if tied_outside(module):
            log.info("FSDP2: %s (%s) is not a unit of its own: a parameter of it is tied to a "
                     "module outside it, so it is sharded with its parent.", name,
                     type(module).__name__)
            return
        kwargs = dict(decision) if isinstance(decision, dict) else {}
        unknown = set(kwargs) - _FULLY_SHARD_KWARGS
        if unknown:
            raise ValueError(
                f"fsdp_wrap_fn returned keys {sorted(unknown)} for module {name!r}; fully_shard "
                f"takes {sorted(_FULLY_SHARD_KWARGS)}."
            )
        units.append(FSDPUnit(name, module, kwargs))
        unit_param_ids.update(id(p) for p in module.parameters())

    visit("", model)
    return units


def _print_plan(units: list[FSDPUnit], model: nn.Module, config: FSDPConfig, mesh: DeviceMesh,
                reshard: bool | int) -> None:
    if dist.get_global_rank() != 0:
        return
    total = sum(p.numel() for p in model.parameters())
    in_units = sum(u.num_params for u in units)
    lines = [f"FSDP2 wrap plan: strategy {config.sharding_strategy}, mesh "
             f"{tuple(mesh.shape)} {mesh.mesh_dim_names}, reshard_after_forward={reshard}, "
             f"{len(units)} units + root"]
    for unit in units:
        extra = f" {unit.kwargs}" if unit.kwargs else ""
        lines.append(f"  {unit.name:<40} {type(unit.module).__name__:<24} "
                     f"{unit.num_params:>12,} params{extra}")
    lines.append(f"  {'(root)':<40} {type(model).__name__:<24} {total - in_units:>12,} params")
    print("\n".join(lines), flush=True)


def _offload_policy(device: Optional[torch.device]) -> CPUOffloadPolicy:
    return CPUOffloadPolicy(pin_memory=device is not None and device.type == "cuda")


def fully_shard_kwargs(config: FSDPConfig, precision: str = "fp32",
                       device: Optional[torch.device] = None) -> dict[str, Any]:
    """The ``fully_shard`` keywords of a block unit, besides its mesh: ``mp_policy``,
    ``reshard_after_forward`` and, with ``cpu_offload``, ``offload_policy`` (for modules
    sharded outside :func:`apply_fsdp` on another mesh: the experts)."""
    kwargs: dict[str, Any] = {"mp_policy": mixed_precision_policy(config, precision),
                              "reshard_after_forward": reshard_after_forward_for(config)}
    if config.cpu_offload:
        kwargs["offload_policy"] = _offload_policy(device)
    return kwargs


def apply_fsdp(model: nn.Module, config: FSDPConfig, mesh: DeviceMesh, precision: str = "fp32",
               device: Optional[torch.device] = None) -> nn.Module:
    """Shard ``model`` in place with ``fully_shard``: each planned unit, then the root.

    Args:
        model: the (unwrapped) model, on the CPU or ``meta`` (or already on the device):
            ``fully_shard`` moves each unit's parameters to the mesh's device as it shards
            them, and leaves meta parameters on meta for
            :func:`~cadence.parallel.param_init.materialize_and_init`.
        config: validated FSDP settings.
        mesh: 1-D ``(dp_shard,)`` or 2-D ``(dp_replicate, dp_shard)`` mesh.
        precision: the run's precision, for ``mixed_precision``.
        device: the run's device (for ``cpu_offload``'s pinned memory on CUDA).

    Returns:
        ``model`` itself, now an ``FSDPModule`` whose parameters are DTensor shards.
    """
    units = plan_fsdp_units(model, config)
    reshard = reshard_after_forward_for(config)
    policy = mixed_precision_policy(config, precision)
    common: dict[str, Any] = {"mesh": mesh, "mp_policy": policy}
    if config.cpu_offload:
        common["offload_policy"] = _offload_policy(device)
    norm_policy = norm_mixed_precision_policy(policy)
    norms = _norm_modules(model, units) if norm_policy is not None else []
    if config.verbose:
        _print_plan(units, model, config, mesh, reshard)
        if norms and dist.get_global_rank() == 0:
            print(f"  + {len(norms)} norm layers as fp32 units", flush=True)
    for norm in norms:  # innermost first: each norm keeps fp32 weights and arithmetic
        fully_shard(norm, **{**common, "mp_policy": norm_policy, "reshard_after_forward": False})
    for unit in units:
        fully_shard(unit.module, **{**common, "reshard_after_forward": reshard, **unit.kwargs})
    # The root's parameters are needed at once by backward: FSDP2 keeps them gathered when
    # reshard_after_forward is left to its default (None) on the root.
    fully_shard(model, **common, reshard_after_forward=None if reshard is True else reshard)
    _set_prefetching([u.module for u in units], config)
    return model


def _set_prefetching(modules: list[nn.Module], config: FSDPConfig) -> None:
    """Explicit prefetch lists (FSDP2's replacement for FSDP1's forward/backward_prefetch)."""
    fsdp_modules = [m for m in modules if isinstance(m, FSDPModule)]
    if config.forward_prefetch:
        for i, module in enumerate(fsdp_modules):
            ahead = fsdp_modules[i + 1:i + 1 + config.forward_prefetch_limit]
            if ahead:
                module.set_modules_to_forward_prefetch(ahead)
    if config.backward_prefetch_limit > 1:
        for i, module in enumerate(fsdp_modules):
            behind = fsdp_modules[max(0, i - config.backward_prefetch_limit):i][::-1]
            if behind:
                module.set_modules_to_backward_prefetch(behind)
