"""The total gradient norm of a model, correct under DDP, FSDP2, expert and pipeline
parallelism.

Under DDP every rank holds the full (all-reduced) gradients, so the local norm is the norm.
Under FSDP2 gradients are DTensor shards: ``torch.nn.utils.get_total_norm`` reduces the
shards' partial norms over the mesh, and ``full_tensor()`` makes the result a plain tensor,
the same on every rank; gradients on several meshes (the experts' under expert parallelism)
are reduced mesh by mesh, then combined. Under pipeline parallelism each rank holds some
stages only: the stages' norms are combined over the pipeline's ranks. Source: PyTorch
``torch.nn.utils.get_total_norm``; torchtitan's ``clip_grad_norm_``.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
from torch.distributed.tensor import DTensor

from cadence.utils.dtensor import full_tensor

__all__ = ["get_grad_norm", "get_param_norm", "clip_grad_norm_"]


def _by_mesh(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` grouped by DTensor mesh (plain tensors together): DTensor ops take one
    mesh, and under expert parallelism the experts live on a mesh of their own."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.device_mesh if isinstance(t, DTensor) else None, []).append(t)
    return list(groups.values())


def _total_norm(tensors: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    if not tensors:
        return torch.zeros(())
    norms = [full_tensor(torch.nn.utils.get_total_norm(group, norm_type=norm_type))
             for group in _by_mesh(tensors)]
    if len(norms) == 1:
        return norms[0]
    return torch.nn.utils.get_total_norm(norms, norm_type=norm_type)  # the norm of the norms


def _over_pipeline(total: torch.Tensor, norm_type: float, group: Any) -> torch.Tensor:
    """This rank's stages' norm combined with the other stages' (one all-reduce)."""
    import torch.distributed as torch_dist

    if norm_type == float("inf"):
        torch_dist.all_reduce(total, op=torch_dist.ReduceOp.MAX, group=group)
        return total
    total = total ** norm_type
    torch_dist.all_reduce(total, group=group)
    return total ** (1.0 / norm_type)


def clip_grad_norm_(parameters: Iterable[torch.nn.Parameter], max_norm: float,
                    norm_type: float = 2.0, pipeline_group: Optional[Any] = None) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` whatever the meshes of the gradients (FSDP2's,
    TP's and expert parallelism's together): scale every gradient by
    ``max_norm / (total + 1e-6)`` when the total norm exceeds ``max_norm``.

    Args:
        parameters: this rank's parameters; those without ``.grad`` are skipped.
        max_norm: the largest total norm kept.
        norm_type: the p of the p-norm; ``inf`` for the max-norm. Default 2.
        pipeline_group: under pipeline parallelism, the process group of this rank's
            pipeline peers (``ParallelDims.pipeline_group()``): the total is the whole
            model's, over every stage. ``None``: this rank holds the whole model.

    Returns:
        The total norm before clipping (a 0-d tensor, the same on every rank).
    """
    params = [p for p in parameters if p.grad is not None]
    total = get_grad_norm(params, norm_type)
    if pipeline_group is not None:
        total = _over_pipeline(total.to(params[0].grad.device if params else "cpu"),
                               norm_type, pipeline_group)
    for group in _by_mesh(params):
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def get_grad_norm(parameters: Iterable[torch.nn.Parameter], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type``-norm of all gradients together (a 0-d tensor, same on every rank).

    Args:
        parameters: the model's parameters; those without ``.grad`` are skipped.
        norm_type: the p of the p-norm; ``inf`` for the max-norm. Default 2.
    """
    return _total_norm([p.grad for p in parameters if p.grad is not None], norm_type)


def get_param_norm(parameters: Iterable[torch.nn.Parameter], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type``-norm of all parameters together (a 0-d tensor, same on every rank)."""
    return _total_norm([p.detach() for p in parameters], norm_type)
