"""Tensor parallelism (Megatron-style) as a step of the parallelize plan, before FSDP2.

Each matched module is handed to ``torch.distributed.tensor.parallel.parallelize_module``
with a ``ParallelStyle`` on the ``tp`` dimension of the run's ``DeviceMesh``: attention
q/k/v and the MLP's up projections column-wise (each rank computes its heads / its slice
of the hidden features, no communication), the attention and MLP output projections
row-wise (their partial outputs all-reduced once per block in forward, and the inputs'
gradients once per block in backward). Every other parameter (embeddings, norms, the
output head) is replicated on the ``tp`` dimension as a ``Replicate`` DTensor
(:class:`ReplicateParallel`), so all parameters are DTensors on one mesh: FSDP2 then
shards every one of them over ``dp_shard``, and norms, clipping, child tuning and DCP see
one consistent layout.

Where the plan comes from (first that applies):

1. ``parallelism_config.tp.layer_plan``: ``{module-name pattern: style}``; a pattern's
   ``*`` matches one name segment (``model.transformer.h.*.mlp.c_fc``), as in
   ``parallelize_module``;
2. the model's ``tp_plan()`` hook (same form; like ``fsdp_wrap_fn``);
3. the built-in plans for the transformer block classes it contains (:data:`BLOCK_PLANS`):
   ``GPT2Block`` (the ``gpt2`` builder and Hugging Face GPT-2) and ``LlamaDecoderLayer``.

A style is a ``ParallelStyle`` instance, or a name: ``colwise`` / ``ColwiseParallel``,
``rowwise`` / ``RowwiseParallel``, ``sequence_parallel`` / ``SequenceParallel``,
``fused_qkv_colwise`` (GPT-2's fused ``c_attn``), ``replicate``, or a dotted path to a
``ParallelStyle`` class. ``colwise`` / ``rowwise`` on a Hugging Face ``Conv1D`` (GPT-2's
linear layers, weights stored ``[in, out]``) shard the transposed dimensions.

A plan is checked against the model before anything is sharded; every problem is raised
at once, naming the module: a pattern that matches nothing, a style on a module type it
cannot shard, a dimension or head count the degree does not divide.

GPT-2's ``c_attn`` holds q, k and v side by side (``[d, 3d]``), so a plain column split
would give rank 0 all of q and none of v. :class:`FusedQKVColwiseParallel` keeps the
parameter a standard ``Shard(1)`` DTensor (checkpoints keep Hugging Face's layout) and,
in forward, all-gathers the ``[d, 3d]`` weight over ``tp`` and multiplies by the columns of
this rank's heads (``q_r, k_r, v_r``); backward reduce-scatters the weight's gradient. The
weight all-gather (``d * 3d`` elements) is smaller than gathering activations whenever a
batch holds more than ``d`` tokens.

Sources: Shoeybi et al. 2019, "Megatron-LM" (column/row parallel MLP and attention);
PyTorch ``torch.distributed.tensor.parallel`` (``parallelize_module``, ``ColwiseParallel``,
``RowwiseParallel``, ``SequenceParallel``); torchtitan ``apply_tp``; Hugging Face's
``base_model_tp_plan`` for Llama.
"""

from __future__ import annotations

import fnmatch
import types
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Mapping, Optional, Union

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel, parallelize_module,
)

from cadence.parallel.tp_styles import TP_STYLE_NAMES, resolve_tp_style
from cadence.utils.dtensor import is_shard_placement

__all__ = [
    "TPPlan", "TPEntry", "BLOCK_PLANS", "STYLE_NAMES", "plan_tensor_parallel", "apply_tp",
    "ReplicateParallel", "FusedQKVColwiseParallel", "Conv1DColwiseParallel",
    "Conv1DRowwiseParallel", "describe_tp_plan", "is_shard_placement",
]

StyleSpec = Union[str, ParallelStyle]

BLOCK_PLANS: dict[str, dict[str, str]] = {
    "GPT2Block": {
        "attn.c_attn": "fused_qkv_colwise",
        "attn.c_proj": "rowwise",
        "mlp.c_fc": "colwise",
        "mlp.c_proj": "rowwise",
    },
    "LlamaDecoderLayer": {
        "self_attn.q_proj": "colwise",
        "self_attn.k_proj": "colwise",
        "self_attn.v_proj": "colwise",
        "self_attn.o_proj": "rowwise",
        "mlp.gate_proj": "colwise",
        "mlp.up_proj": "colwise",
        "mlp.down_proj": "rowwise",
    },
}
"""Built-in plans, relative to each block of that class: Megatron's split of attention and MLP."""

STYLE_NAMES = TP_STYLE_NAMES
"""The style names a plan may use (:data:`cadence.parallel.tp_styles.TP_STYLE_NAMES`)."""


def _is_conv1d(module: nn.Module) -> bool:
    """A Hugging Face ``Conv1D`` (a linear layer with ``weight [in, out]``)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _out_features(module: nn.Module) -> Optional[int]:
    """The dimension ``colwise`` splits: output features (an embedding's width); None for a
    module TP cannot split."""
    if isinstance(module, nn.Linear):
        return module.out_features
    if isinstance(module, nn.Embedding):
        return module.embedding_dim
    if _is_conv1d(module):
        return int(module.nf)
    return None


def _in_features(module: nn.Module) -> Optional[int]:
    """The dimension ``rowwise`` splits: input features (an embedding's rows)."""
    if isinstance(module, nn.Linear):
        return module.in_features
    if isinstance(module, nn.Embedding):
        return module.num_embeddings
    if _is_conv1d(module):
        return int(module.weight.shape[0])
    return None


def _replace_param(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    old = getattr(module, name)
    module.register_parameter(name, nn.Parameter(tensor, requires_grad=old.requires_grad))


class Conv1DColwiseParallel(ColwiseParallel):
    """``ColwiseParallel`` for a Hugging Face ``Conv1D``: ``weight [in, out]`` is sharded on
    ``out`` (``Shard(1)``), ``bias [out]`` on its only dim; input replicated, output the
    local slice ``[..., out / tp]``."""

    def _partition_conv1d_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh) -> None:
        _replace_param(module, "weight", distribute_tensor(module.weight, device_mesh, [Shard(1)]))
        if module.bias is not None:
            _replace_param(module, "bias", distribute_tensor(module.bias, device_mesh, [Shard(0)]))

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from torch.distributed.tensor import distribute_module

        return distribute_module(
            module, device_mesh, self._partition_conv1d_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class Conv1DRowwiseParallel(RowwiseParallel):
    """``RowwiseParallel`` for a Hugging Face ``Conv1D``: ``weight [in, out]`` is sharded on
    ``in`` (``Shard(0)``), ``bias`` replicated; input the local slice ``[..., in / tp]``,
    output all-reduced (replicated)."""

    def _partition_conv1d_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh) -> None:
        _replace_param(module, "weight", distribute_tensor(module.weight, device_mesh, [Shard(0)]))
        if module.bias is not None:
            _replace_param(module, "bias",
                           distribute_tensor(module.bias, device_mesh, [Replicate()]))

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from torch.distributed.tensor import distribute_module

        self.desired_input_layouts = (Shard(-1),)
        return distribute_module(
            module, device_mesh, self._partition_conv1d_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


def _tp_input(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """``x`` (the same on every tp rank) as a plain tensor whose gradient is all-reduced
    over ``tp`` in backward (Megatron's ``f``: each rank contributes its heads' share)."""
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(
        grad_placements=[Partial()])


def _fused_qkv_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Forward of a fused q/k/v ``Conv1D`` under :class:`FusedQKVColwiseParallel`:
    ``x [..., d]`` -> ``[..., 3 * d / tp]`` laid out ``(q_r, k_r, v_r)``."""
    weight: DTensor = self.weight
    mesh = weight.device_mesh
    # this rank's columns of each chunk: [c * chunk + r * part, c * chunk + (r + 1) * part)
    spans = [slice(start, start + self._tp_part) for start in self._tp_starts]
    full_w = weight.redistribute(placements=[Replicate()]).to_local(grad_placements=[Partial()])
    x = _tp_input(x, mesh)
    out = x.reshape(-1, x.size(-1)) @ torch.cat([full_w[:, span] for span in spans], dim=1)
    if self.bias is not None:
        full_b = self.bias.redistribute(placements=[Replicate()]).to_local(
            grad_placements=[Partial()])
        out = out + torch.cat([full_b[span] for span in spans])
    return out.view(*x.shape[:-1], out.size(-1))


class FusedQKVColwiseParallel(ParallelStyle):
    """Column parallelism for a projection whose output is ``num_chunks`` equal parts side
    by side (GPT-2's ``c_attn``: q, k, v), each split by heads over ``tp``.

    The parameters are standard ``Shard`` DTensors (``Shard(1)`` for a ``Conv1D`` weight
    ``[in, out]``, ``Shard(0)`` for bias), so state dicts keep the unsharded layout. Forward
    all-gathers the weight and uses the columns of this rank's slice of every chunk; the
    output is ``[..., out / tp]`` ordered chunk by chunk.

    Args:
        num_chunks: parts of the fused output (3 for q, k, v).
    """

    def __init__(self, num_chunks: int = 3) -> None:
        super().__init__()
        self.num_chunks = num_chunks

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not _is_conv1d(module):
            raise NotImplementedError("FusedQKVColwiseParallel supports Hugging Face Conv1D only.")
        out = int(module.nf)
        size, rank = device_mesh.size(), device_mesh.get_local_rank()
        chunk = out // self.num_chunks
        part = chunk // size
        _replace_param(module, "weight", distribute_tensor(module.weight, device_mesh, [Shard(1)]))
        if module.bias is not None:
            _replace_param(module, "bias", distribute_tensor(module.bias, device_mesh, [Shard(0)]))
        module._tp_starts = tuple(c * chunk + rank * part  # type: ignore[assignment]
                                  for c in range(self.num_chunks))
        module._tp_part = part  # type: ignore[assignment]
        module.forward = types.MethodType(_fused_qkv_forward, module)  # type: ignore[method-assign]
        return module

    def __repr__(self) -> str:
        return f"FusedQKVColwiseParallel(num_chunks={self.num_chunks})"


def _replicated_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Forward of a :class:`ReplicateParallel` module: the class's forward with each of its
    own ``Replicate`` DTensor parameters swapped for its local tensor (the full value) for
    the duration of the call, so inputs and outputs stay plain tensors. Gradients flow
    back through ``to_local`` into the DTensor parameters (replicated: every rank computes
    the same full gradient)."""
    params = self._parameters
    saved = {name: params[name] for name in self._tp_replicated}
    try:
        for name, param in saved.items():
            params[name] = param.to_local()  # type: ignore[assignment]
        return type(self).forward(self, *args, **kwargs)
    finally:
        params.update(saved)


class ReplicateParallel(ParallelStyle):
    """Keep a module whole on every tp rank, its own parameters as ``Replicate`` DTensors.

    The module computes on plain tensors as before (its parameters' local values are used
    during its forward), so every rank computes the same result and the same parameter
    gradients and nothing is communicated; the point is that every parameter of the model
    is a DTensor on the same mesh. Parameters shared with an already converted module
    (tied embeddings) are re-tied.

    Args:
        converted: ``id(old parameter) -> new parameter``, filled in as modules are
            converted, so a parameter shared by two modules stays one parameter.
    """

    def __init__(self, converted: Optional[dict[int, nn.Parameter]] = None) -> None:
        super().__init__()
        self.converted = converted if converted is not None else {}

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        replicated = []
        for name, param in list(module.named_parameters(recurse=False)):
            if isinstance(param, DTensor):
                continue
            new = self.converted.get(id(param))
            if new is None:
                new = nn.Parameter(DTensor.from_local(param.data, device_mesh, [Replicate()],
                                                      run_check=False),
                                   requires_grad=param.requires_grad)
                self.converted[id(param)] = new
            module.register_parameter(name, new)
            replicated.append(name)
        module._tp_replicated = tuple(replicated)  # type: ignore[assignment]
        module.forward = types.MethodType(_replicated_forward, module)  # type: ignore[method-assign]
        return module

    def __repr__(self) -> str:
        return "ReplicateParallel()"


@dataclass
class TPEntry:
    """One module of the plan: its qualified name, the module, the style, and where the
    rule came from (``pattern``)."""

    name: str
    module: nn.Module
    style: ParallelStyle
    pattern: str


@dataclass
class TPPlan:
    """A checked tensor-parallel plan: entries in module order, the attribute fixes (head
    counts, split sizes per rank) to make after sharding, and the source of the plan."""

    degree: int
    entries: list[TPEntry] = field(default_factory=list)
    fixes: list[tuple[nn.Module, str, int]] = field(default_factory=list)
    source: str = ""


def _matches(name: str, pattern: str) -> bool:
    parts, atoms = name.split("."), pattern.split(".")
    return len(parts) == len(atoms) and all(fnmatch.fnmatchcase(p, a)
                                            for p, a in zip(parts, atoms))


def _style_for(spec: StyleSpec, module: nn.Module, name: str, degree: int) -> ParallelStyle:
    """The ``ParallelStyle`` for ``spec`` on ``module``; raises ValueError naming ``name``."""
    if isinstance(spec, ParallelStyle):
        return spec
    kind = resolve_tp_style(spec) if isinstance(spec, str) else None
    if kind is None:
        raise ValueError(f"{spec!r} ({type(spec).__name__}) is not a style name or a "
                         f"ParallelStyle.")
    if isinstance(kind, type):
        return kind()
    module_kind = type(module).__name__
    if kind in ("colwise", "rowwise", "fused_qkv_colwise"):
        base = getattr(module, "base_layer", None)
        if isinstance(base, nn.Module) and type(module).__module__.startswith("peft."):
            raise ValueError(
                f"module {name!r} is a peft adapter layer ({type(module).__module__}."
                f"{module_kind}) around a {type(base).__name__}: tensor parallelism cannot "
                f"split an adapter layer (its base and its lora_A / lora_B would need matching "
                f"splits). Leave {name!r} out of the plan (parallelism_config.tp.layer_plan) or "
                f"out of peft's target_modules; FSDP2 alone shards adapter layers.")
        if _out_features(module) is None:
            raise ValueError(f"module {name!r} is a {module_kind}; {kind} shards nn.Linear, "
                             f"nn.Embedding or a Hugging Face Conv1D.")
        if kind == "fused_qkv_colwise" and not _is_conv1d(module):
            raise ValueError(f"module {name!r} is a {module_kind}; fused_qkv_colwise shards a "
                             f"Hugging Face Conv1D holding q, k, v side by side.")
        # rowwise splits the input (an embedding's rows), the others the output features
        sharded = _in_features(module) if kind == "rowwise" else _out_features(module)
        chunks = 3 if kind == "fused_qkv_colwise" else 1
        assert sharded is not None
        if sharded % (chunks * degree) != 0:
            what = "input" if kind == "rowwise" else "output"
            raise ValueError(f"module {name!r} ({module_kind}) has {sharded} {what} features, "
                             f"which tensor_parallel_degree {degree} does not divide"
                             f"{' into 3 equal q/k/v parts' if chunks == 3 else ''}.")
    if kind == "colwise":
        return Conv1DColwiseParallel() if _is_conv1d(module) else ColwiseParallel()
    if kind == "rowwise":
        return Conv1DRowwiseParallel() if _is_conv1d(module) else RowwiseParallel()
    if kind == "fused_qkv_colwise":
        return FusedQKVColwiseParallel()
    if kind == "sequence_parallel":
        return SequenceParallel()
    return ReplicateParallel()


def _head_fixes(model: nn.Module, entries: list[TPEntry], degree: int,
                problems: list[str]) -> list[tuple[nn.Module, str, int]]:
    """Per-rank head counts of the attention modules whose projections are sharded:
    GPT-2's ``num_heads`` and ``split_size``; Llama's heads come from ``-1`` reshapes, so
    only divisibility of its (key/value) head counts is checked."""
    sharded = {e.name for e in entries}
    fixes: list[tuple[nn.Module, str, int]] = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind == "GPT2Attention" and f"{name}.c_attn" in sharded:
            if module.num_heads % degree != 0:
                problems.append(f"module {name!r} ({kind}) has {module.num_heads} attention "
                                f"heads, which tensor_parallel_degree {degree} does not divide.")
                continue
            fixes += [(module, "num_heads", module.num_heads // degree),
                      (module, "split_size", module.split_size // degree)]
        elif kind.endswith("Attention") and f"{name}.q_proj" in sharded:
            config = getattr(module, "config", None)
            for attr in ("num_attention_heads", "num_key_value_heads"):
                heads = getattr(config, attr, None)
                if isinstance(heads, int) and heads % degree != 0:
                    problems.append(f"module {name!r} ({kind}) has {attr}={heads}, which "
                                    f"tensor_parallel_degree {degree} does not divide.")
    return fixes


def _raw_plan(model: nn.Module, layer_plan: Optional[Mapping[str, StyleSpec]]
              ) -> tuple[dict[str, StyleSpec], str]:
    """``{pattern: style}`` and where it came from: the config, the hook, or built in."""
    if layer_plan:
        return dict(layer_plan), "parallelism_config.tp.layer_plan"
    hook = getattr(model, "tp_plan", None)
    if callable(hook):
        plan = hook()
        if plan:
            return dict(plan), f"{type(model).__name__}.tp_plan()"
    built: dict[str, StyleSpec] = {}
    kinds = set()
    for name, module in model.named_modules():
        block = BLOCK_PLANS.get(type(module).__name__)
        if block is not None:
            kinds.add(type(module).__name__)
            built.update({f"{name}.{sub}": style for sub, style in block.items()})
    return built, f"built-in plan for {', '.join(sorted(kinds))}" if kinds else ""


def plan_tensor_parallel(model: nn.Module, degree: int,
                         layer_plan: Optional[Mapping[str, StyleSpec]] = None) -> TPPlan:
    """Resolve and check the tensor-parallel plan for ``model`` without changing it.

    Args:
        model: the unwrapped model (a ComposerModel); names are relative to it.
        degree: ``tensor_parallel_degree`` (ranks per tp group), > 1.
        layer_plan: ``{pattern: style}``; default the model's ``tp_plan()`` or the
            built-in block plans.

    Returns:
        The :class:`TPPlan` (entries in module order).

    Raises:
        ValueError: every problem at once, each naming the pattern or module: no plan for
            the model, a pattern matching no module, a bad style, a style on a module it
            cannot shard, a feature or head count the degree does not divide.
    """
    raw, source = _raw_plan(model, layer_plan)
    prefix = "parallelism_config.tp"
    if not raw:
        raise ValueError(
            f"{prefix}: no tensor-parallel plan for {type(model).__name__}: it has no "
            f"tp_plan() and none of the block classes with a built-in plan "
            f"({', '.join(BLOCK_PLANS)}). Give {prefix}.layer_plan as "
            f"{{'<module pattern>': colwise | rowwise | ...}}.")
    modules = dict(model.named_modules())
    problems: list[str] = []
    entries: dict[str, TPEntry] = {}
    for pattern, spec in raw.items():
        matched = [n for n in modules if n and _matches(n, pattern)]
        if not matched:
            sample = ", ".join(n for n in list(modules)[1:12])
            problems.append(f"pattern {pattern!r} ({source}) matches no module of "
                            f"{type(model).__name__}; module names look like: {sample}, ...")
            continue
        for name in matched:
            try:
                style = _style_for(spec, modules[name], name, degree)
            except ValueError as exc:
                problems.append(f"{pattern!r}: {exc}")
                continue
            entries[name] = TPEntry(name, modules[name], style, pattern)
    ordered = [entries[n] for n in modules if n in entries]
    fixes = _head_fixes(model, ordered, degree, problems)
    if problems:
        raise ValueError(f"{len(problems)} problem(s) in the tensor-parallel plan "
                         f"({prefix}.tensor_parallel_degree={degree}):\n"
                         + "\n".join(f"  - {p}" for p in problems))
    return TPPlan(degree=degree, entries=ordered, fixes=fixes, source=source)


def apply_tp(model: nn.Module, plan: TPPlan, tp_mesh: DeviceMesh) -> nn.Module:
    """Shard ``model`` in place as ``plan`` says, on the 1-D ``tp_mesh``; then replicate
    every parameter not yet a DTensor (:class:`ReplicateParallel`) and fix head counts.

    ``model`` may be on the CPU or ``meta``: each parameter is moved to the mesh's device
    one at a time as it is distributed (``distribute_tensor`` / ``DTensor.from_local``),
    so the whole model is never on the device; meta parameters stay meta. Buffers are left
    where they are (the plan moves them).

    Returns:
        ``model``, its parameters DTensors on ``tp_mesh``.
    """
    parallelize_module(model, tp_mesh, {e.name: e.style for e in plan.entries})
    converted: dict[int, nn.Parameter] = {}
    for module in model.modules():
        owns_plain = any(not isinstance(p, DTensor)
                         for p in module.parameters(recurse=False))
        if owns_plain:
            ReplicateParallel(converted)._apply(module, tp_mesh)
    for module, attr, value in plan.fixes:
        setattr(module, attr, value)
    return model


def describe_tp_plan(plan: TPPlan) -> str:
    """The plan as text, one line per sharded module (for ``verbose``)."""
    lines = [f"TP plan ({plan.source}), tensor_parallel_degree={plan.degree}, "
             f"{len(plan.entries)} modules:"]
    for entry in plan.entries:
        lines.append(f"  {entry.name:<44} {type(entry.module).__name__:<10} {entry.style!r}")
    lines.append("  (every other parameter: ReplicateParallel)")
    return "\n".join(lines)

