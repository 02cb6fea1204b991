"""Expert parallelism on fake tensors: the routing a plan assumes.

Under expert parallelism each MoE block sends its routed (token, expert) pairs to the ranks
holding the experts (:func:`cadence.parallel.moe_dispatch.dispatch`), with splits that
depend on the router's choices: values, which fake tensors do not have. While
:func:`balanced_routing` is active, the experts' forward
(:mod:`cadence.parallel.expert_parallel`) dispatches with :func:`balanced_dispatch`
instead: the same all-to-all (``all_to_all_single_autograd``, the same bytes per call
path), with **balanced routing assumed**: the ``N K`` pairs of a rank split evenly over the
``P`` ranks of its group and over each rank's ``L`` experts (no pair dropped), so each rank
receives ``N K`` rows. A real router is not balanced: a rank whose experts are chosen more
receives more rows (its activations and its all-to-all grow with the imbalance; the
load-balancing loss keeps it near 1). :func:`cadence.parallel.moe_dispatch.combine` runs
unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.distributed as torch_dist
from torch.distributed import ProcessGroup

__all__ = ["balanced_dispatch", "balanced_routing", "even_splits"]


def even_splits(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` counts differing by at most one (the first larger)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def balanced_dispatch(hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                      num_experts: int, group: Optional[ProcessGroup]) -> tuple[torch.Tensor,
                                                                                 object]:
    """:func:`~cadence.parallel.moe_dispatch.dispatch`'s contract with balanced routing
    (see the module docstring): ``hidden_states [N, H]``, ``top_k_index [N, K]``; returns
    the ``[N K, H]`` rows for this rank's experts and the plan for ``combine``.

    Raises:
        ValueError: ``num_experts`` is not a multiple of the group's size (dispatch's).
    """
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    from cadence.parallel.moe_dispatch import Dispatch

    ranks = torch_dist.get_world_size(group) if group is not None else 1
    if num_experts % ranks != 0:
        raise ValueError(f"{num_experts} experts cannot be split over {ranks} "
                         f"expert-parallel ranks; use a degree that divides {num_experts}.")
    local = num_experts // ranks
    k = top_k_index.shape[-1]
    pairs = hidden_states.shape[0] * k
    order = torch.argsort(top_k_index.reshape(-1), stable=True)  # [N K]: none dropped
    token_index = order // k
    rows = hidden_states[token_index]
    splits = even_splits(pairs, ranks)
    if ranks > 1:
        received = all_to_all_single_autograd(rows, splits, splits, group)
    else:
        received = rows
    me = torch_dist.get_rank(group) if ranks > 1 else 0
    rows_here = sum(splits)
    plan = Dispatch(token_index=token_index, pair_order=order, send_splits=splits,
                    recv_splits=splits, local_order=torch.arange(rows_here),
                    tokens_per_local_expert=even_splits(rows_here, local),
                    tokens_per_expert=torch.tensor(even_splits(pairs, num_experts)),
                    hidden_size=hidden_states.shape[-1], group_rank=me)
    return received, plan


@contextlib.contextmanager
def balanced_routing() -> Iterator[None]:
    """Make the experts' forward dispatch with :func:`balanced_dispatch` while active."""
    from cadence.parallel import expert_parallel

    real = expert_parallel.dispatch
    expert_parallel.dispatch = balanced_dispatch  # type: ignore[assignment]
    try:
        yield
    finally:
        expert_parallel.dispatch = real
