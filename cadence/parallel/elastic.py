"""Elastic resume: continue a run from a checkpoint written on another mesh.

What carries over: DCP stores every DTensor by its global shape and reshards it on load,
and TP keeps the unsharded layout (GPT-2's fused ``c_attn`` is a plain ``Shard(1)``
DTensor; modules outside the plan are ``Replicate`` DTensors), so the model, the AdamW
state, EMA and child-tuning masks of a sharded checkpoint load onto any
``(dp_replicate, dp_shard, tp)`` mesh and any world size, one process included; each
rank's RNG state is restored where the rank existed. Measured: 2 x 2 (fsdp x tp) -> 2
ranks FSDP-only, 2 ranks TP=2 and one process; TP=2 -> one process; FSDP-only -> TP=2
continue the uninterrupted loss curve within 1.3e-7 relative
(``tests/parallel/test_tp_elastic.py``).

What does not: the data position. Mid-epoch, the timestamp says how many batches of the
epoch were consumed; a run whose global batch (per-rank batch x data-parallel ranks,
``world_size / tensor_parallel_degree``) differs from the checkpoint's would skip the
wrong number of samples, seeing some twice and others never. :func:`check_resume_layout`
refuses that before anything is loaded, naming both layouts and the batch size that
fits. At an epoch boundary, or with ``load_weights_only``, any batch size is fine.

Source: PyTorch ``torch.distributed.checkpoint`` (load-time resharding); torchtitan's
checkpointing notes on changing the parallelism between runs.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Optional, Sequence

from cadence.utils import dist
from cadence.parallel.config import ParallelismConfig
from cadence.parallel.mesh import mesh_dims
from cadence.parallel.parallel_dims import ParallelDims

__all__ = ["mesh_layout", "describe_layout", "check_resume_layout"]


def mesh_layout(config: ParallelismConfig, world_size: Optional[int] = None,
                local_world_size: Optional[int] = None) -> dict[str, int]:
    """This run's layout, as recorded in a checkpoint's metadata (``"mesh"``).

    Args:
        config: the parsed parallelism config.
        world_size: ranks; default the current world size.
        local_world_size: ranks per node; default the current one.

    Returns:
        ``{"world_size", "pp", "dp_replicate", "dp_shard", "tp"}`` (degrees; 1 where the
        dimension is absent). DDP (no fsdp, several ranks) counts as ``dp_replicate``.
    """
    world = dist.get_world_size() if world_size is None else world_size
    local = dist.get_local_world_size() if local_world_size is None else local_world_size
    shape, names = mesh_dims(config, world, local)
    sizes = dict(zip(names, shape))
    return {"world_size": world, "pp": int(sizes.get("pp", 1)),
            "dp_replicate": int(sizes.get("dp_replicate", 1)),
            "dp_shard": int(sizes.get("dp_shard", 1)), "tp": int(sizes.get("tp", 1))}


def describe_layout(layout: dict[str, Any]) -> str:
    """``layout`` in words, e.g. ``4 ranks (dp_replicate=1, dp_shard=2, tp=2)``."""
    world = layout.get("world_size", "?")
    dims = ", ".join(f"{k}={layout[k]}" for k in ("pp", "dp_replicate", "dp_shard", "tp")
                     if k in layout and (k != "pp" or layout[k] != 1))
    return f"{world} rank(s) ({dims or 'mesh not recorded'})"


def _saved_timestamp(path: Path) -> Optional[dict[str, Any]]:
    """The checkpoint's timestamp (``extra.pt`` of a sharded directory, or the full file
    memory-mapped), or None when it cannot be read here (loading reports why)."""
    from cadence.checkpoint.checkpoint import safe_torch_load
    from cadence.checkpoint.files import EXTRA_FILE
    from cadence.checkpoint.layout import to_flat

    try:
        if path.is_dir():
            return dict(safe_torch_load(path / EXTRA_FILE)["timestamp"])
        return dict(to_flat(safe_torch_load(path, mmap=True, composer=True), path)["timestamp"])
    except Exception:  # noqa: BLE001 - a corrupt file is load_checkpoint's to report
        return None


def _global_batch(state: Any, config: ParallelismConfig) -> Optional[int]:
    """Samples per optimizer step of this run (the train loader's per-rank ``batch_size``
    times the data-parallel size), or None when the loader does not say."""
    batch_size = getattr(state.train_dataloader, "batch_size", None)
    if not isinstance(batch_size, int) or batch_size <= 0:
        return None
    return batch_size * _dp_size(state, config)


def _dp_size(state: Any, config: ParallelismConfig) -> int:
    """This run's data-parallel size: its ``state.parallel_dims`` (a Trainer's), else the
    degrees ``config`` makes on this job."""
    dims = getattr(state, "parallel_dims", None)
    return (dims if dims is not None else ParallelDims.from_config(config)).dp_size


def _batches_per_epoch(state: Any) -> Optional[int]:
    """``len(train_dataloader)`` on this layout, or None when it has no length."""
    try:
        return len(state.train_dataloader)
    except TypeError:
        return None


def check_resume_layout(path: Any, state: Any, config: ParallelismConfig,
                        ignore_keys: Sequence[str] = ()) -> None:
    """Refuse, before anything is loaded, to resume ``path`` where the run cannot continue
    exactly on this layout (call on every rank: each reads the small timestamp itself).

    Resuming mid-epoch needs the checkpoint's global batch: the timestamp's
    ``sample_in_epoch`` consumed samples must fill its ``batch_in_epoch`` batches of this
    run's per-rank batch size times its data-parallel size (the epoch's last batch may be
    partial).
    Nothing is checked at an epoch boundary, for a loader without a ``batch_size``, or for
    a checkpoint whose timestamp cannot be read (loading then reports the damage).

    Args:
        path: the checkpoint (a full ``.pt`` file or a sharded directory).
        state: the run's state (its ``train_dataloader``).
        config: this run's parsed parallelism config.
        ignore_keys: the load's ``load_ignore_keys``; nothing is checked when they skip
            the ``timestamp`` (the run then starts its count afresh).

    Raises:
        ValueError: the global batch differs mid-epoch; the message names the checkpoint's
            layout (from its metadata) and this run's, and the per-rank batch size to use.
    """
    from cadence.checkpoint.checkpoint import read_metadata

    if any(fnmatch.fnmatchcase("timestamp", pattern) for pattern in ignore_keys):
        return
    path = Path(path)
    timestamp = _saved_timestamp(path)
    batches = int((timestamp or {}).get("batch_in_epoch", 0))
    if batches <= 0:
        return
    assert timestamp is not None  # batches > 0 came from it
    samples, epoch = int(timestamp.get("sample_in_epoch", 0)), int(timestamp.get("epoch", 0))
    current = _global_batch(state, config)
    if current is None or samples <= 0 or samples == batches * current:
        return  # full batches of this run's global batch
    if _batches_per_epoch(state) == batches and (batches - 1) * current < samples:
        return  # the epoch's last batch, partial (or short of the sampler's padding)
    saved_batch = -(-samples // batches)  # the checkpoint's global batch (rounded up)
    try:
        metadata = read_metadata(path)
    except Exception:  # noqa: BLE001 - the refusal below stands without it
        metadata = {}
    saved = metadata.get("mesh") or {"world_size": metadata.get("world_size", "?")}
    mine = mesh_layout(config)
    dp = _dp_size(state, config)
    fix = (f"set the train loader's per-rank batch_size to {saved_batch // dp} "
           f"({saved_batch} / {dp} data-parallel ranks)" if saved_batch % dp == 0 else
           f"use a data-parallel size that divides {saved_batch}")
    raise ValueError(
        f"Cannot resume {path} mid-epoch (after batch {batches} of epoch {epoch}) on this "
        f"layout: the checkpoint was written "
        f"by {describe_layout(saved)} with a global batch of {saved_batch} samples; this "
        f"run has {describe_layout(mine)} and a global batch of {current} "
        f"({current // dp} per rank x {dp} data-parallel ranks), so the rest of the epoch "
        f"would not be the samples the checkpoint has not seen. To resume, {fix}; or "
        f"start a new run from its weights (load_weights_only=True, or `cadence convert "
        f"--to full` first).")
