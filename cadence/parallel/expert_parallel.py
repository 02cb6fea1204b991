"""Expert parallelism: each mixture-of-experts block's experts split over the ``ep`` ranks
(dimension 0 of every expert weight), tokens sent to their experts' ranks and back with
all-to-all (:mod:`cadence.parallel.moe_dispatch`), the experts then sharded by FSDP2 over
the ranks that hold the same experts.

The ``ep`` ranks are borrowed from the data-parallel shard ranks (torchtitan's "dp2ep"): the
ranks of one expert-parallel group load different samples, and the router, attention,
norms and embeddings are sharded by FSDP2 over every data-parallel rank as without ``ep``.
Only the experts live on the experts' mesh ``(dp_replicate, dp_shard_in_ep, ep)``
(:attr:`cadence.parallel.parallel_dims.ParallelDims.expert_mesh`): a DTensor ``Shard(0)``
over ``ep``, FSDP2-sharded over ``dp_shard_in_ep`` (and replicated over ``dp_replicate``
under HYBRID strategies). An expert's gradient sums the tokens of the whole group, so
FSDP2 divides it by the data-parallel size, as it divides every other gradient.

The block is otherwise untouched: its router runs where it ran, so the router's logits (and
the load-balancing loss transformers computes from them, ``output_router_logits``) are
this rank's tokens', as under plain data parallelism; routing is dropless (no capacity
factor: every (token, expert) pair is computed, whatever the imbalance).

**Which modules are experts.** A module is an experts module when it holds the experts'
weights with the experts on dimension 0 and is called as transformers 5 calls its experts:

``experts(hidden_states [N, H], top_k_index [N, K], top_k_weights [N, K]) -> [N, H]``

- built in: transformers' fused experts (``gate_up_proj [E, 2I, H]``, ``down_proj
  [E, H, I]``, ``act_fn``, ``num_experts``: ``MixtralExperts``, ``Qwen2MoeExperts``,
  ``Qwen3MoeExperts``, ``OlmoeExperts`` and the other classes with that layout); their
  computation per expert is transformers' eager one (``act_fn(gate) * up``, then down).
- a user's block (the hook): give its experts module a method
  ``expert_forward(self, rows [R, H], tokens_per_expert: list[int]) -> [R, H]`` that runs
  its local experts on ``rows`` (expert by expert: the first ``tokens_per_expert[0]`` rows
  for its first local expert, ...), reading its weights with
  :func:`cadence.utils.dtensor.local_tensor` (the local slice ``[E / ep, ...]``, with
  autograd; the whole weight without expert parallelism), and an int attribute
  ``num_experts``. Every parameter of the module must hold the experts on dimension 0.
  Its ``forward`` must take the signature above (the MoE block routes, the experts module
  computes); under expert parallelism the plan replaces that ``forward`` with dispatch,
  ``expert_forward``, combine. A ``ComposerModel`` can also name its experts modules with
  ``expert_parallel_modules(self) -> list[nn.Module]``.

Each experts module keeps this rank's routed pairs per expert of its last forward,
``module.tokens_per_expert`` (``[E]`` int64), and the bytes its all-to-alls sent,
``module.all_to_all_bytes`` (forward; backward sends as many): :func:`expert_load` gathers
the counts over the data-parallel ranks (the load-balance metric).

Sources: torchtitan (``torchtitan/distributed/expert_parallel.py``, ``ExpertParallel``,
and ``apply_moe_ep_tp`` / ``apply_fsdp`` in ``torchtitan/models/llama4/infra/
parallelize.py``); transformers 5's ``MixtralExperts`` (``use_experts_implementation``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from cadence.parallel.moe_dispatch import all_to_all_bytes, combine, dispatch
from cadence.utils.dtensor import local_tensor

__all__ = ["ExpertsModule", "plan_expert_parallel", "apply_ep", "shard_experts",
           "expert_load", "is_fused_experts", "describe_experts"]

_KEY = "parallelism_config.ep.expert_parallel_degree"
_FUSED = ("gate_up_proj", "down_proj")


@dataclass
class ExpertsModule:
    """One experts module the plan splits: its qualified name, the module, its experts."""

    name: str
    module: nn.Module
    num_experts: int


def is_fused_experts(module: nn.Module) -> bool:
    """Whether ``module`` is transformers 5's fused experts layout this module computes:
    3-D ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``, ``act_fn``, ``num_experts``,
    and (where the class says) concatenated, untransposed, gated weights without bias."""
    params = module._parameters
    if not all(isinstance(params.get(n), torch.Tensor) and params[n].dim() == 3 for n in _FUSED):
        return False
    layout_ok = (getattr(module, "is_concatenated", True) and
                 not getattr(module, "is_transposed", False) and
                 getattr(module, "has_gate", True) and not getattr(module, "has_bias", False))
    return bool(layout_ok) and hasattr(module, "act_fn") and hasattr(module, "num_experts")


def _is_experts(module: nn.Module) -> bool:
    return is_fused_experts(module) or callable(getattr(module, "expert_forward", None))


def plan_expert_parallel(model: nn.Module, degree: int) -> list[ExpertsModule]:
    """The experts modules of ``model`` to split over ``degree`` ranks, checked before
    anything is sharded.

    Args:
        model: the user's model (a ``ComposerModel``, a ``HuggingFaceModel`` or a plain
            module); its ``expert_parallel_modules()`` when it has one, else every module
            in the built-in layout or with an ``expert_forward`` method.
        degree: ``expert_parallel_degree``.

    Returns:
        The modules, in ``named_modules`` order.

    Raises:
        ValueError: no experts module, ``degree`` not dividing a module's experts, or a
            parameter whose dimension 0 is not the number of experts (naming the module).
    """
    hook = getattr(model, "expert_parallel_modules", None)
    chosen = {id(m) for m in hook()} if callable(hook) else None
    found: list[ExpertsModule] = []
    for name, module in model.named_modules():
        if (id(module) in chosen) if chosen is not None else _is_experts(module):
            found.append(ExpertsModule(name, module, int(getattr(module, "num_experts", 0))))
    if not found:
        raise ValueError(
            f"{_KEY}={degree}: the model has no mixture-of-experts experts module (transformers' "
            f"fused experts, gate_up_proj [E, 2I, H] and down_proj [E, H, I], or a module with "
            f"expert_forward(rows, tokens_per_expert) and num_experts; see "
            f"cadence.parallel.expert_parallel). Remove parallelism_config.ep.")
    for item in found:
        if not _is_experts(item.module):
            raise ValueError(
                f"{item.name} ({type(item.module).__name__}), named by expert_parallel_modules(), "
                f"is neither transformers' fused experts nor has an expert_forward(rows, "
                f"tokens_per_expert) method; give it one (see cadence.parallel.expert_parallel).")
        if any(True for child in item.module.children() for _ in child.parameters()):
            raise ValueError(
                f"{item.name} ({type(item.module).__name__}) has submodules with parameters; "
                f"an experts module must hold its expert weights itself (each [E, ...]), so "
                f"they can be split on dimension 0.")
        if item.num_experts < 1:
            raise ValueError(f"{item.name} ({type(item.module).__name__}) has no int "
                             f"num_experts attribute; expert parallelism needs it.")
        if item.num_experts % degree != 0:
            raise ValueError(
                f"{_KEY}={degree} does not divide the {item.num_experts} experts of "
                f"{item.name} ({type(item.module).__name__}); use a divisor of "
                f"{item.num_experts}.")
        for pname, param in item.module.named_parameters(recurse=False):
            if param.dim() == 0 or param.shape[0] != item.num_experts:
                raise ValueError(
                    f"{item.name}.{pname} has shape {tuple(param.shape)}: every parameter of "
                    f"an experts module must hold its {item.num_experts} experts on "
                    f"dimension 0.")
    return found


def _fused_expert_forward(module: nn.Module, rows: torch.Tensor,
                          tokens_per_expert: list[int]) -> torch.Tensor:
    """transformers' eager computation for each local expert: ``down(act(gate) * up)``.

    Every local expert runs, those with no row too (an empty matmul), so each rank's
    expert weights always get a gradient (zero for an expert no token reached), as in one
    process."""
    gate_up = local_tensor(module.gate_up_proj)  # [E / ep, 2I, H]
    down = local_tensor(module.down_proj)  # [E / ep, H, I]
    outs = []
    for e, chunk in enumerate(rows.split(tokens_per_expert)):
        gate, up = nn.functional.linear(chunk, gate_up[e]).chunk(2, dim=-1)
        outs.append(nn.functional.linear(module.act_fn(gate) * up, down[e]))
    return torch.cat(outs)


def _expert_parallel_forward(self: nn.Module, hidden_states: torch.Tensor,
                             top_k_index: torch.Tensor, top_k_weights: torch.Tensor
                             ) -> torch.Tensor:
    """The experts' forward under expert parallelism: dispatch, local experts, combine."""
    group = self._ep_group
    shape = hidden_states.shape  # [N, H] (or [..., H]: flattened here, restored at the end)
    hidden_states = hidden_states.reshape(-1, shape[-1])
    top_k_index = top_k_index.reshape(hidden_states.shape[0], -1)
    top_k_weights = top_k_weights.reshape(hidden_states.shape[0], -1)
    rows, plan = dispatch(hidden_states, top_k_index, self.num_experts, group)
    compute = getattr(self, "expert_forward", None)
    if callable(compute):
        out_rows = compute(rows, plan.tokens_per_local_expert)
    else:
        out_rows = _fused_expert_forward(self, rows, plan.tokens_per_local_expert)
    self.tokens_per_expert = plan.tokens_per_expert
    self.all_to_all_bytes = all_to_all_bytes(plan, hidden_states.element_size())
    out = combine(out_rows, plan, top_k_weights, hidden_states.shape[0], group,
                  dtype=hidden_states.dtype)
    return out if out.shape == shape else out.reshape(shape)  # (no view of [N, H] returned)


_EP_CLASSES: dict[type, type] = {}


def _expert_parallel_class(cls: type) -> type:
    """``cls`` with the expert-parallel forward (one subclass per class, so ``isinstance``
    and the state dict's keys are unchanged)."""
    if cls not in _EP_CLASSES:
        _EP_CLASSES[cls] = type(f"ExpertParallel{cls.__name__}", (cls,),
                                {"forward": _expert_parallel_forward,
                                 "__module__": cls.__module__})
    return _EP_CLASSES[cls]


def apply_ep(experts: list[ExpertsModule], ep_mesh: DeviceMesh) -> None:
    """Split each experts module's parameters on dimension 0 over ``ep_mesh`` (a DTensor
    ``Shard(0)``: rank ``r`` keeps experts ``r * E / ep ...``; each rank cuts its slice
    from the weights it holds, without communication, as tensor parallelism does) and give
    it the dispatching forward.

    Args:
        experts: what :func:`plan_expert_parallel` returned.
        ep_mesh: the 1-D ``ep`` mesh (``ParallelDims.expert_mesh["ep"]``).
    """
    for item in experts:
        module = item.module
        for pname, param in list(module.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.data, ep_mesh, [Shard(0)], src_data_rank=None)
            module.register_parameter(pname, nn.Parameter(sharded,
                                                          requires_grad=param.requires_grad))
        module._ep_group = ep_mesh.get_group()
        module.tokens_per_expert = torch.zeros(item.num_experts, dtype=torch.long)
        module.all_to_all_bytes = 0
        module.__class__ = _expert_parallel_class(type(module))


def shard_experts(experts: list[ExpertsModule], mesh: DeviceMesh, divide_factor: int,
                  **fully_shard_kwargs: Any) -> None:
    """FSDP2 on each experts module over ``mesh`` (the experts' data-parallel mesh, size 1
    allowed), before the blocks holding them are sharded; each module is then left out of
    the FSDP unit plan (``_fsdp_wrap = False``) and its parent does not shard its
    parameters again.

    Experts are sharded on dimension 0 when each rank still holds at least as many experts
    as ``mesh`` has ranks, else on dimension 1 (torchtitan's choice: no padding of whole
    experts).

    Args:
        experts: the modules :func:`apply_ep` split.
        mesh: ``ParallelDims.expert_data_parallel_mesh()``.
        divide_factor: the data-parallel size, what gradients are divided by
            (``ParallelDims.gradient_divide_factor``).
        fully_shard_kwargs: ``mp_policy``, ``reshard_after_forward``, ``offload_policy`` as
            for every other unit.
    """
    from torch.distributed.fsdp import fully_shard

    sum_only = mesh.size() > 1 and torch_dist.get_backend(mesh.get_group()) != "nccl"
    for item in experts:
        local = item.num_experts // max(1, _ep_size(item.module))
        dim = 0 if local >= mesh.size() else 1
        fully_shard(item.module, mesh=mesh, shard_placement_fn=lambda _p, d=dim: Shard(d),
                    **fully_shard_kwargs)
        item.module.set_gradient_divide_factor(float(divide_factor))
        if sum_only:  # gloo has no PREMUL_SUM: FSDP2 then scales before and after a SUM
            item.module.set_force_sum_reduction_for_comms(True)
        item.module._fsdp_wrap = False


def _ep_size(module: nn.Module) -> int:
    group = getattr(module, "_ep_group", None)
    return torch_dist.get_world_size(group) if group is not None else 1


def expert_load(model: nn.Module, group: Optional[Any] = None) -> dict[str, torch.Tensor]:
    """Routed (token, expert) pairs per expert of each experts module's last forward,
    summed over the data-parallel ranks (a collective: every rank calls it).

    Args:
        model: the parallelized model.
        group: the data-parallel process group (``state.parallel_dims
            .data_parallel_group()``); ``None``: the default group.

    Returns:
        ``{module name: [E] int64 counts}`` for every module that has run under expert
        parallelism.
    """
    out: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        counts = getattr(module, "tokens_per_expert", None)
        if isinstance(counts, torch.Tensor) and hasattr(module, "_ep_group"):
            total = counts.detach().clone()
            if torch_dist.is_initialized() and torch_dist.get_world_size(group) > 1:
                torch_dist.all_reduce(total, group=group)
            out[name] = total
    return out


def describe_experts(experts: list[ExpertsModule], degree: int) -> str:
    """One line per experts module: its class, experts, experts per rank (for verbose)."""
    lines = [f"Expert parallelism: expert_parallel_degree={degree}, {len(experts)} experts "
             f"modules:"]
    lines += [f"  {e.name:<40} {type(e.module).__name__:<24} {e.num_experts} experts, "
              f"{e.num_experts // degree} per rank" for e in experts]
    return "\n".join(lines)

