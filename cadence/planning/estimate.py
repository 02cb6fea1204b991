"""A step's time on paper: compute from the model's FLOPs, communication from the counted
collectives and the links they cross, and what overlaps with what.

The model, written out (each assumption is also returned in :attr:`StepEstimate.assumptions`):

- **compute** = hardware FLOPs / (device peak x ``matmul_efficiency``). Hardware FLOPs are the
  model FLOPs (the PaLM count ``SpeedMonitor`` uses, :mod:`cadence.utils.flops`) plus one
  more forward (``2N`` of the ``6N``: x 4/3) under activation checkpointing.
  ``matmul_efficiency`` (default 0.6) is the share of the data-sheet peak large bf16 GEMMs
  and attention kernels reach in a training step.
- **collectives**, ring algorithms: an all-gather or reduce-scatter of ``S`` bytes (the full,
  gathered size) over ``n`` ranks moves ``S (n-1)/n`` per rank, an all-reduce
  ``2 S (n-1)/n``; each call also costs a latency (10 us in a node, 30 us across nodes).
  A group whose ranks span more than one node runs at the inter-node bandwidth, else at
  the intra-node one (``tp`` is the innermost mesh dimension, so it stays in a node when it
  fits).
- **overlap**: the data-parallel collectives (FSDP2's all-gathers and reduce-scatters,
  prefetched one unit ahead; DDP's bucketed all-reduces during backward) overlap with
  compute: the step takes the longer of the two. Tensor parallelism's collectives are on
  the critical path and add to it.
- **pipeline** (``pp``): each rank computes its stages' share (the model FLOPs / ``pp``),
  and the step also runs the schedule's fill and drain: compute x ``(m + p - 1) / m`` for
  ``GPipe`` / ``1F1B``, x ``(m + (p - 1) / v) / m`` interleaved (``m`` microbatches, ``v``
  stages per rank; Narayanan et al. 2021, sec. 2.2). The stage boundaries' sends (counted
  once: a receive is the other end of a send, on a full-duplex link) are on the critical
  path, at the bandwidth of the link between neighbouring stages.
- **expert parallelism** (``ep``): the all-to-alls move ``S (n-1)/n`` per rank (balanced
  routing: what a rank keeps for its own experts does not cross a link) and are on the
  critical path (the experts wait for their tokens).
- **CPU offload** (FSDP2's ``CPUOffloadPolicy``): the sharded parameters cross PCIe to the
  device twice (forward and backward), the sharded gradients once back (at
  ``pcie_gbps``, default 25 GB/s per GPU), and the optimizer step runs on the host,
  reading and writing parameters, gradients and state (7 passes over the parameter bytes
  at ``host_gbps``, default 10 GB/s per GPU); none of it overlaps.

Sources: Chowdhery et al. 2022 ("PaLM", Appendix B) for the FLOPs; Thakur, Rabenseifner and
Gropp 2005 ("Optimization of Collective Communication Operations in MPICH") for the ring
costs; the FSDP2 design (``torch.distributed.fsdp.fully_shard``: implicit prefetching).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from cadence.planning.collectives import Collective
from cadence.planning.devices import Device

__all__ = ["StepEstimate", "estimate_step", "mesh_strides", "to_dict", "DATA_PARALLEL_DIMS"]

#: Mesh dimensions whose collectives overlap with compute.
DATA_PARALLEL_DIMS = ("dp_replicate", "dp_shard", "dp", "world")

_LATENCY_INTRA_S = 10e-6
_LATENCY_INTER_S = 30e-6


@dataclass
class StepEstimate:
    """One optimizer step's estimated time on one device.

    Attributes:
        compute_seconds: the step's compute.
        comm_seconds: collective time per mesh dimension.
        offload_seconds: CPU offload's transfers and host optimizer step (0 without it).
        step_seconds: the step, overlaps applied.
        tokens_per_second_per_device: tokens of the global batch per second, per device.
        mfu: model FLOPs per second per device / the device's peak.
        assumptions: the overlap and efficiency assumptions, as sentences.
    """

    compute_seconds: float
    comm_seconds: dict[str, float]
    offload_seconds: float
    step_seconds: float
    tokens_per_second_per_device: float
    mfu: float
    assumptions: list[str] = field(default_factory=list)


def _crosses_nodes(group_size: int, stride: int, ranks_per_node: int) -> bool:
    return group_size * stride > ranks_per_node


def _collective_seconds(entry: Collective, bandwidth_gbps: float, inter: bool) -> float:
    n = max(entry.group_size, 1)
    share = (n - 1) / n
    factor = {"all_reduce": 2 * share, "all_gather": share, "reduce_scatter": share,
              "all_to_all": share, "send": 1.0, "recv": 0.0}.get(entry.op, 1.0)
    latency = _LATENCY_INTER_S if inter else _LATENCY_INTRA_S
    calls = 0 if entry.op == "recv" else entry.count
    return entry.bytes * factor / (bandwidth_gbps * 1e9) + calls * latency


def estimate_step(collectives: Iterable[Collective], *, model_flops_per_device: float,
                  tokens_per_device: float, device: Device, precision_key: str,
                  activation_checkpointing: bool, mesh: dict[str, tuple[int, int]],
                  world_size: int, ranks_per_node: int, offload_bytes: int = 0,
                  matmul_efficiency: float = 0.6, pcie_gbps: float = 25.0,
                  host_gbps: float = 10.0, pipeline_bubble: float = 1.0) -> StepEstimate:
    """Estimate one step (see the module docstring for the model).

    Args:
        collectives: the step's collectives (one rank's).
        model_flops_per_device: model FLOPs of the step on one device.
        tokens_per_device: tokens of the global batch / world size.
        device: the accelerator.
        precision_key: ``bf16``, ``tf32``, ... (:func:`cadence.utils.flops.precision_key`).
        activation_checkpointing: whether blocks recompute their forward.
        mesh: ``{dimension: (size, stride in ranks)}``.
        world_size / ranks_per_node: the job's ranks, and per node.
        offload_bytes: bytes of sharded parameters kept on the host (0: no CPU offload).
        matmul_efficiency / pcie_gbps / host_gbps: see the module docstring.
        pipeline_bubble: the pipeline schedule's step time over its compute (1: no
            pipeline; :func:`cadence.planning.stages.bubble_factor`).
    """
    peak = device.peak(precision_key)
    hardware_flops = model_flops_per_device * (4 / 3 if activation_checkpointing else 1.0)
    compute = hardware_flops / (peak * matmul_efficiency) * pipeline_bubble
    comm: dict[str, float] = {}
    for entry in collectives:
        size, stride = mesh.get(entry.dim, (world_size if entry.dim == "world" else
                                            entry.group_size, 1))
        inter = _crosses_nodes(size, stride, ranks_per_node)
        bandwidth = device.inter_node_gbps if inter else device.intra_node_gbps
        comm[entry.dim] = comm.get(entry.dim, 0.0) + _collective_seconds(entry, bandwidth, inter)
    overlapped = sum(t for d, t in comm.items() if d in DATA_PARALLEL_DIMS)
    exposed = sum(t for d, t in comm.items() if d not in DATA_PARALLEL_DIMS)
    offload = 0.0
    if offload_bytes:
        offload = 3 * offload_bytes / (pcie_gbps * 1e9) + 7 * offload_bytes / (host_gbps * 1e9)
    step = max(compute, overlapped) + exposed + offload
    assumptions = [
        f"compute at {matmul_efficiency:.0%} of the {precision_key} peak "
        f"({peak / 1e12:.1f} TFLOP/s)"
        + ("; activation checkpointing recomputes the forward (x4/3 FLOPs)"
           if activation_checkpointing else ""),
        "data-parallel collectives (FSDP2 all-gather/reduce-scatter, DDP all-reduce) "
        "overlap with compute; tensor-parallel collectives do not",
        f"ring collectives at {device.intra_node_gbps:g} GB/s in a node, "
        f"{device.inter_node_gbps:g} GB/s per GPU across nodes",
    ]
    if pipeline_bubble > 1:
        assumptions.append(f"the pipeline's fill and drain add {pipeline_bubble - 1:.0%} to "
                           f"the compute; stage-boundary sends are not overlapped")
    if offload_bytes:
        assumptions.append(f"CPU offload: 3 PCIe passes over the sharded parameters at "
                           f"{pcie_gbps:g} GB/s and the optimizer step on the host at "
                           f"{host_gbps:g} GB/s, not overlapped")
    tokens_per_s = tokens_per_device / step if step > 0 else 0.0
    mfu = model_flops_per_device / step / peak if step > 0 else 0.0
    return StepEstimate(compute, comm, offload, step, tokens_per_s, mfu, assumptions)


def mesh_strides(shape: tuple[int, ...], names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """``{dimension: (size, stride)}`` of a row-major mesh (the last dimension innermost)."""
    out: dict[str, tuple[int, int]] = {}
    stride = 1
    for size, name in reversed(list(zip(shape, names))):
        out[name] = (size, stride)
        stride *= size
    return out


def to_dict(estimate: StepEstimate) -> dict[str, Any]:
    """The estimate as plain data."""
    return {"compute_seconds": estimate.compute_seconds, "comm_seconds": estimate.comm_seconds,
            "offload_seconds": estimate.offload_seconds,
            "step_seconds": estimate.step_seconds,
            "tokens_per_second_per_device": estimate.tokens_per_second_per_device,
            "mfu": estimate.mfu, "assumptions": estimate.assumptions}
