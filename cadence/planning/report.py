"""A :class:`~cadence.planning.planner.Plan` as the table ``cadence plan`` prints."""

from __future__ import annotations

from cadence.planning.devices import DEVICES
from cadence.planning.planner import Plan

__all__ = ["format_plan", "format_bytes", "format_devices"]


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.50 KiB"`` (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def format_plan(plan: Plan) -> str:
    """The plan as text: per-rank memory, collectives, the step estimate, the verdict."""
    dev = plan.device
    lines = [f"cadence plan: {plan.world_size} ranks on {plan.nnodes} node(s) of {dev.name} "
             f"({dev.memory_gib:g} GiB), layout {plan.layout}", ""]
    head = ("rank", "params", "grads", "optimizer", "activations", "temporary", "peak")
    rows = [head] + [(str(r.rank), *(format_bytes(v) for v in (
        r.params_bytes, r.grads_bytes, r.optimizer_bytes, r.activations_bytes,
        r.temporary_bytes, r.peak_bytes))) for r in plan.ranks]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    shown: list[list] = []
    for r in plan.ranks:  # each rank whose collectives differ (a pipeline's stages)
        if any(r.collectives == other for other in shown):
            continue
        shown.append(r.collectives)
        lines += ["", f"collectives per optimizer step (rank {r.rank}'s):"]
        if not r.collectives:
            lines.append("  none")
        for c in r.collectives:
            seconds = plan.estimate.comm_seconds.get(c.dim, 0.0)
            lines.append(f"  {c.dim:<12} {c.op:<15} x{c.count:<6} {format_bytes(c.bytes):>12}"
                         f"  (group of {c.group_size}; {c.dim} total {seconds * 1e3:.1f} ms)")
    e = plan.estimate
    lines += ["", f"step: {e.step_seconds * 1e3:.1f} ms (compute {e.compute_seconds * 1e3:.1f} ms"
              + (f", offload {e.offload_seconds * 1e3:.1f} ms" if e.offload_seconds else "")
              + f"), {e.tokens_per_second_per_device:,.0f} tokens/s per device, "
              f"MFU {e.mfu:.1%}", "assuming:"]
    lines += [f"  - {a}" for a in e.assumptions]
    limit = plan.memory_limit_bytes
    verdict = "fits" if plan.fits else (
        f"does NOT fit: peak {format_bytes(plan.peak_bytes)} is "
        f"{format_bytes(plan.peak_bytes - limit)} over")
    lines += ["", f"memory: {verdict} (limit {format_bytes(limit)}, "
              f"{limit / dev.memory_bytes:.0%} of {dev.memory_gib:g} GiB)"]
    if not plan.fits:
        if plan.remedy is not None:
            r = plan.remedy
            lines += [f"first that fits: {' '.join(r.overrides)}",
                      f"  peak {format_bytes(r.peak_bytes)}, "
                      f"{r.tokens_per_second_per_device:,.0f} tokens/s per device "
                      f"({r.throughput_change:+.0%} throughput)"]
        elif plan.tried:
            lines.append("nothing tried fits (" + "; ".join(
                f"{' '.join(o)}: {format_bytes(p)}" for o, p in plan.tried)
                + "): more ranks or a larger device")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def format_devices() -> str:
    """The device table (``cadence plan --list-gpus``)."""
    lines = [f"{'name':<10} {'memory':>8} {'bf16 TFLOP/s':>13} {'intra GB/s':>11} "
             f"{'inter GB/s':>11}  source"]
    for d in DEVICES.values():
        lines.append(f"{d.name:<10} {d.memory_gib:>6g} G {d.peak('bf16') / 1e12:>13.1f} "
                     f"{d.intra_node_gbps:>11g} {d.inter_node_gbps:>11g}  {d.source}")
    return "\n".join(lines)
