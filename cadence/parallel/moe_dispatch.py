"""Token dispatch for expert parallelism: each routed token sent to the rank holding its
expert, and the experts' outputs sent back and combined, with all-to-all (autograd).

Notation: ``N`` tokens on this rank, ``H`` hidden size, ``K`` experts per token (top-k),
``E`` experts in the block, ``P`` ranks in the expert-parallel group, ``L = E / P`` experts
per rank (rank ``r`` holds experts ``r * L ... (r + 1) * L - 1``), ``R`` routed rows this
rank receives (one per (token, expert) pair sent to one of its experts).

:func:`dispatch`:

1. the ``N * K`` (token, expert) pairs sorted by expert (stably: within an expert, token
   order); the pairs routed to the sentinel index ``E`` (transformers marks a dropped slot
   so) are left out;
2. the per-expert counts ``[E]`` exchanged with one all-to-all (``L`` counts to each rank):
   each rank learns how many rows it receives from each peer for each of its experts;
3. the token rows ``[N * K, H]`` (already grouped by destination rank, since experts are
   numbered rank by rank) sent with ``all_to_all_single`` of uneven splits: dropless, every
   pair arrives whatever the imbalance (a rank may receive no row, an expert no token);
4. the received rows ``[R, H]`` (grouped by source rank, then expert) reordered expert by
   expert, with the count of rows per local expert ``[L]``.

:func:`combine` runs the same steps backwards: rows back to source order, the reverse
all-to-all, each row weighted by its routing weight and summed into its token with
``index_add`` in expert order (the order transformers' eager experts loop adds them).
Both all-to-alls carry gradients (``torch.distributed._functional_collectives
.all_to_all_single_autograd``: its backward is the all-to-all with the splits reversed), so
the experts' weights on each rank receive the gradient of every rank's tokens.

Sources: GShard (Lepikhin et al., 2020) and Switch Transformer (Fedus et al., 2021) for
all-to-all expert dispatch; MegaBlocks (Gale et al., 2022) for dropless routing;
torchtitan's ``ExpertParallel`` (``torchtitan/distributed/expert_parallel.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as torch_dist
from torch.distributed import ProcessGroup
from torch.distributed._functional_collectives import all_to_all_single_autograd

__all__ = ["Dispatch", "dispatch", "combine", "all_to_all_bytes"]


@dataclass
class Dispatch:
    """What :func:`dispatch` did, for :func:`combine` and for logging.

    Attributes:
        token_index: ``[S]`` (``S <= N * K`` pairs sent), the token of each sent pair, in the
            sent (expert-sorted) order.
        pair_order: ``[S]``, each sent pair's index into the flattened ``[N * K]`` pairs.
        send_splits / recv_splits: rows sent to / received from each rank of the group
            (``[P]`` ints).
        local_order: ``[R]``, the received rows' permutation into expert order.
        tokens_per_local_expert: rows per local expert ``[L]`` (ints), in expert order.
        tokens_per_expert: this rank's routed pairs per expert ``[E]`` (int64, all
            ranks' experts): the load-balance figure.
        hidden_size: ``H``.
        group_rank: this rank's index in the expert-parallel group.
    """

    token_index: torch.Tensor
    pair_order: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    local_order: torch.Tensor
    tokens_per_local_expert: list[int]
    tokens_per_expert: torch.Tensor
    hidden_size: int
    group_rank: int = 0


def _group_size(group: Optional[ProcessGroup]) -> int:
    if group is None or not torch_dist.is_initialized():
        return 1
    return torch_dist.get_world_size(group)


def dispatch(hidden_states: torch.Tensor, top_k_index: torch.Tensor, num_experts: int,
             group: Optional[ProcessGroup]) -> tuple[torch.Tensor, Dispatch]:
    """Send each (token, expert) pair's hidden state to the rank holding the expert.

    Args:
        hidden_states: ``[N, H]`` this rank's tokens.
        top_k_index: ``[N, K]`` int, each token's experts (``0 <= e < E``; ``E`` marks a
            dropped slot, which is not sent).
        num_experts: ``E``, a multiple of the group's size.
        group: the expert-parallel process group (``P`` ranks); ``None``: one rank.

    Returns:
        ``(rows, plan)``: ``rows`` ``[R, H]``, the rows for this rank's ``L`` experts,
        expert by expert (``plan.tokens_per_local_expert`` rows each); ``plan`` for
        :func:`combine`.

    Raises:
        ValueError: ``num_experts`` is not a multiple of the group's size.
    """
    ranks = _group_size(group)
    if num_experts % ranks != 0:
        raise ValueError(f"{num_experts} experts cannot be split over {ranks} "
                         f"expert-parallel ranks; use a degree that divides {num_experts}.")
    local = num_experts // ranks
    k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    counts = torch.bincount(flat, minlength=num_experts + 1)[:num_experts]  # [E]
    order = torch.argsort(flat, stable=True)[:int(counts.sum())]  # sentinel pairs sort last
    token_index = order // k
    rows = hidden_states[token_index]  # [S, H], grouped by destination rank
    if ranks == 1:
        recv_counts = counts.view(1, local)
        received = rows
        send_splits = recv_splits = [rows.shape[0]]
    else:
        recv_counts = torch.empty_like(counts)
        torch_dist.all_to_all_single(recv_counts, counts, group=group)  # [P * L], by source
        recv_counts = recv_counts.view(ranks, local)
        send_splits = counts.view(ranks, local).sum(1).tolist()
        recv_splits = recv_counts.sum(1).tolist()
        received = all_to_all_single_autograd(rows, recv_splits, send_splits, group)
    expert_of_row = torch.arange(local, device=flat.device).repeat(ranks) \
        .repeat_interleave(recv_counts.reshape(-1))  # [R] local expert of each received row
    local_order = torch.argsort(expert_of_row, stable=True)
    plan = Dispatch(token_index=token_index, pair_order=order, send_splits=send_splits,
                    recv_splits=recv_splits, local_order=local_order,
                    tokens_per_local_expert=recv_counts.sum(0).tolist(),
                    tokens_per_expert=counts.detach(), hidden_size=hidden_states.shape[-1],
                    group_rank=torch_dist.get_rank(group) if ranks > 1 else 0)
    return received[local_order], plan


def combine(expert_rows: torch.Tensor, plan: Dispatch, top_k_weights: torch.Tensor,
            num_tokens: int, group: Optional[ProcessGroup],
            dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Send the experts' outputs back and sum each token's, weighted by its routing weights.

    Args:
        expert_rows: ``[R, H]`` the local experts' outputs, in :func:`dispatch`'s row order.
        plan: what :func:`dispatch` returned with the rows.
        top_k_weights: ``[N, K]`` each token's routing weights.
        num_tokens: ``N``.
        group: the expert-parallel group (the one given to :func:`dispatch`).
        dtype: the output's dtype; default ``expert_rows``'s.

    Returns:
        ``[N, H]``: ``sum_k weight[n, k] * expert_{index[n, k]}(x[n])`` per token.
    """
    inverse = torch.argsort(plan.local_order)
    back = expert_rows[inverse]  # [R, H] by source rank, as received
    if _group_size(group) > 1:
        back = all_to_all_single_autograd(back, plan.send_splits, plan.recv_splits, group)
    weights = top_k_weights.reshape(-1)[plan.pair_order]  # [S]
    dtype = dtype or expert_rows.dtype
    out = torch.zeros(num_tokens, back.shape[-1], dtype=dtype, device=back.device)
    return out.index_add(0, plan.token_index, (back * weights[:, None]).to(dtype))


def all_to_all_bytes(plan: Dispatch, itemsize: int) -> int:
    """Bytes this rank sends to the other ranks of its group in one forward: the dispatched
    rows plus the combined rows sent back (rows kept for its own experts not counted);
    backward sends as many again.

    Args:
        plan: one :func:`dispatch`'s plan.
        itemsize: bytes per element of the hidden states (4 for fp32).
    """
    me = plan.group_rank
    rows = sum(plan.send_splits) - plan.send_splits[me] + sum(plan.recv_splits) \
        - plan.recv_splits[me]
    return rows * plan.hidden_size * itemsize
