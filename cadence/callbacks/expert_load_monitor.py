"""The :class:`ExpertLoadMonitor` callback: how evenly a mixture-of-experts model's routers
spread the tokens over the experts (the load balance expert parallelism runs at).

Source: the load-balance figures of Switch Transformer (Fedus et al., 2021) and torchtitan's
per-expert token counts (``tokens_per_expert``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cadence.core import Callback
from cadence.parallel.expert_parallel import expert_load
from cadence.registry import callbacks

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["ExpertLoadMonitor"]


@callbacks.register("expert_load_monitor")
class ExpertLoadMonitor(Callback):
    """Logs each experts module's routed (token, expert) pairs per expert at ``BATCH_END``,
    summed over the data-parallel ranks (a collective: every rank runs it), for the models
    run with expert parallelism (``parallelism_config.ep``; the counts are what the
    all-to-all dispatch sends, :func:`~cadence.parallel.expert_parallel.expert_load`).
    Without expert parallelism it logs nothing.

    The counts are the batch's last forward's (its last microbatch's; with activation
    checkpointing, its recomputation, which routes alike).

    Metrics (``E`` experts; ``mean`` = routed pairs / ``E``):

    - ``moe/<module>/max_over_mean``: the busiest expert's pairs over the mean (1.0: even);
    - ``moe/<module>/min_over_mean``: the idlest's (0.0: an expert received no token);
    - ``moe/max_over_mean``: the largest ``max_over_mean`` of all modules;
    - with ``per_expert``: ``moe/<module>/tokens/<e>`` for each expert.

    Args:
        per_expert: also log every expert's count; default False (one metric per expert and
            layer adds up: 64 experts x 48 layers).
    """

    def __init__(self, per_expert: bool = False) -> None:
        self.per_expert = bool(per_expert)

    def batch_end(self, state: State, logger: Any) -> None:
        dims = state.parallel_dims
        group = dims.data_parallel_group() if dims is not None and dims.tp_enabled else None
        load = expert_load(state.model, group)
        if not load:
            return
        metrics: dict[str, float] = {}
        for name, counts in load.items():
            mean = float(counts.sum()) / max(1, counts.numel())
            metrics[f"moe/{name}/max_over_mean"] = float(counts.max()) / mean if mean else 0.0
            metrics[f"moe/{name}/min_over_mean"] = float(counts.min()) / mean if mean else 0.0
            if self.per_expert:
                metrics.update({f"moe/{name}/tokens/{e}": float(c)
                                for e, c in enumerate(counts.tolist())})
        metrics["moe/max_over_mean"] = max(v for k, v in metrics.items()
                                           if k.endswith("/max_over_mean"))
        logger.log_metrics(metrics)
