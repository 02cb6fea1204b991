"""The total gradient norm of a model, correct under DDP and FSDP2.

Under DDP every rank holds the full (all-reduced) gradients, so the local norm is the norm.
Under FSDP2 gradients are DTensor shards: ``torch.nn.utils.get_total_norm`` reduces the
shards' partial norms over the mesh, and ``full_tensor()`` makes the result a plain tensor,
the same on every rank. Source: PyTorch ``torch.nn.utils.get_total_norm``; torchtitan's
``clip_grad_norm_``.
"""

from __future__ import annotations

from typing import Iterable

import torch

from cadence.utils.dtensor import full_tensor

__all__ = ["get_grad_norm", "get_param_norm", "clip_grad_norm_over_pipeline"]


def _total_norm(tensors: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    if not tensors:
        return torch.zeros(())
    return full_tensor(torch.nn.utils.get_total_norm(tensors, norm_type=norm_type))


def get_grad_norm(parameters: Iterable[torch.nn.Parameter], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type``-norm of all gradients together (a 0-d tensor, same on every rank).

    Args:
        parameters: the model's parameters; those without ``.grad`` are skipped.
        norm_type: the p of the p-norm; ``inf`` for the max-norm. Default 2.
    """
    return _total_norm([p.grad for p in parameters if p.grad is not None], norm_type)


def clip_grad_norm_over_pipeline(parameters: Iterable[torch.nn.Parameter], max_norm: float,
                                 group: object, norm_type: float = 2.0) -> torch.Tensor:
    """Clip the gradients of this rank's pipeline stages by the norm of the whole model's:
    each stage's norm (reduced over its data-parallel mesh) combined over the pipeline's
    ranks ``group`` (one all-reduce), then every gradient scaled by
    ``min(1, max_norm / total)`` (``torch.nn.utils.clip_grads_with_norm_``).

    Returns:
        The whole model's gradient norm before clipping (a 0-d tensor, same on every rank).

    Source: torchtitan's ``clip_grad_norm_`` under pipeline parallelism.
    """
    import torch.distributed as torch_dist

    params = [p for p in parameters if p.grad is not None]
    total = get_grad_norm(params, norm_type).to(params[0].grad.device if params else "cpu")
    if norm_type == float("inf"):
        torch_dist.all_reduce(total, op=torch_dist.ReduceOp.MAX, group=group)
    else:
        total = total ** norm_type
        torch_dist.all_reduce(total, group=group)
        total = total ** (1.0 / norm_type)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def get_param_norm(parameters: Iterable[torch.nn.Parameter], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type``-norm of all parameters together (a 0-d tensor, same on every rank)."""
    return _total_norm([p.detach() for p in parameters], norm_type)
