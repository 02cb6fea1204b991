"""The accelerators ``cadence plan`` knows: memory, dense peak FLOP/s and link bandwidths.

Peak FLOP/s come from :data:`cadence.utils.flops.PEAK_FLOPS` (the table ``SpeedMonitor``
reads; its sources are there), except the MI300X, which that table (NVIDIA's parts only)
lacks. Memory is the data sheet's figure, read as GiB (``nvidia-smi`` shows 81,559 MiB on
an H100 80 GB: within 0.5 %). Bandwidths are per GPU and per direction, in GB/s (1e9
bytes/s): ``intra_node_gbps`` is what a collective among the GPUs of one node gets
(NVLink / Infinity Fabric, or PCIe without them), ``inter_node_gbps`` what a collective that
crosses nodes gets per GPU (one NIC per GPU, the usual cluster build-out).

Sources (per direction = the data sheet's bidirectional figure / 2):

- H100 SXM, H100 PCIe: NVIDIA H100 data sheet: 80 GB; NVLink 900 GB/s (SXM); the PCIe card
  without its 2-GPU bridge talks over PCIe Gen5 x16 (128 GB/s); one ConnectX-7 NDR 400 Gb/s
  (50 GB/s) per GPU in DGX H100, 200 Gb/s for a PCIe server.
- H200: NVIDIA H200 data sheet: 141 GB, NVLink 900 GB/s; 400 Gb/s per GPU.
- A100 40 GB / 80 GB (SXM4): NVIDIA A100 data sheet: NVLink 600 GB/s; DGX A100: one HDR
  200 Gb/s (25 GB/s) per GPU.
- B200: NVIDIA HGX B200 specifications: 1,440 GB for 8 GPUs (180 GB each), NVLink 5
  1.8 TB/s per GPU; 400 Gb/s per GPU.
- L40S: NVIDIA L40S data sheet: 48 GB GDDR6, no NVLink, PCIe Gen4 x16 (64 GB/s); 200 Gb/s.
- MI300X: AMD Instinct MI300X data sheet: 192 GB HBM3, 1,307.4 TFLOP/s dense bf16/fp16
  (653.7 tf32, 163.4 fp32, 2,614.9 fp8), 7 Infinity Fabric links of 128 GB/s
  (bidirectional) each to the node's 7 peers; 400 Gb/s per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cadence.utils.flops import PEAK_FLOPS

__all__ = ["Device", "DEVICES", "device_names", "get_device"]

_T = 1e12


@dataclass(frozen=True)
class Device:
    """One accelerator as the plan sees it.

    Attributes:
        name: the table key (``"h100-sxm"``) or ``"custom"``.
        memory_gib: device memory, GiB.
        peak_flops: dense peak FLOP/s by precision key (``"bf16"``, ``"tf32"``, ...).
        intra_node_gbps: per-GPU, per-direction bandwidth inside a node, GB/s.
        inter_node_gbps: per-GPU, per-direction bandwidth across nodes, GB/s.
        source: where the figures come from.
    """

    name: str
    memory_gib: float
    peak_flops: dict[str, float]
    intra_node_gbps: float
    inter_node_gbps: float
    source: str

    @property
    def memory_bytes(self) -> int:
        """Device memory in bytes."""
        return int(self.memory_gib * 2**30)

    def peak(self, precision_key: str) -> float:
        """Peak FLOP/s at ``precision_key``; a precision the device lacks falls back to the
        next slower one it has (bf16 -> fp16 -> tf32 -> fp32)."""
        for key in (precision_key, "bf16", "fp16", "tf32", "fp32"):
            if key in self.peak_flops:
                return self.peak_flops[key]
        raise ValueError(f"device {self.name!r} has no peak FLOP/s figure")


_MI300X = {"fp8": 2614.9 * _T, "bf16": 1307.4 * _T, "fp16": 1307.4 * _T,
           "tf32": 653.7 * _T, "fp32": 163.4 * _T}

#: The devices ``--gpu`` names.
DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("h100-sxm", 80, PEAK_FLOPS["h100-sxm"], 450, 50, "NVIDIA H100 data sheet; DGX H100"),
    Device("h100-pcie", 80, PEAK_FLOPS["h100-pcie"], 64, 25,
           "NVIDIA H100 data sheet (PCIe Gen5 x16, no bridge)"),
    Device("h200", 141, PEAK_FLOPS["h200"], 450, 50, "NVIDIA H200 data sheet"),
    Device("a100-40gb", 40, PEAK_FLOPS["a100"], 300, 25, "NVIDIA A100 data sheet; DGX A100"),
    Device("a100-80gb", 80, PEAK_FLOPS["a100"], 300, 25, "NVIDIA A100 data sheet; DGX A100"),
    Device("b200", 180, PEAK_FLOPS["b200"], 900, 50, "NVIDIA HGX B200 specifications"),
    Device("l40s", 48, PEAK_FLOPS["l40s"], 32, 25, "NVIDIA L40S data sheet (PCIe Gen4 x16)"),
    Device("mi300x", 192, _MI300X, 448, 50, "AMD Instinct MI300X data sheet"),
)}


def device_names() -> list[str]:
    """The names ``--gpu`` accepts."""
    return list(DEVICES)


def get_device(name: Optional[str] = None, *, peak_tflops: Optional[float] = None,
               memory_gib: Optional[float] = None, intra_node_gbps: Optional[float] = None,
               inter_node_gbps: Optional[float] = None) -> Device:
    """A device from the table, with any figure overridden; or a custom one.

    Args:
        name: a :data:`DEVICES` key (``h100-sxm``); ``None``: ``h100-sxm`` unless every
            figure is given (then a ``custom`` device).
        peak_tflops: dense peak TFLOP/s at the run's precision (replaces every precision's).
        memory_gib / intra_node_gbps / inter_node_gbps: as :class:`Device`.

    Raises:
        ValueError: an unknown name (listing the known ones), or a figure that is not
            positive.
    """
    for flag, value in (("--peak-tflops", peak_tflops), ("--memory-gib", memory_gib),
                        ("--intra-node-gbps", intra_node_gbps),
                        ("--inter-node-gbps", inter_node_gbps)):
        if value is not None and not value > 0:
            raise ValueError(f"{flag} must be positive, got {value}.")
    given = (peak_tflops, memory_gib, intra_node_gbps, inter_node_gbps)
    if name is None and all(v is not None for v in given):
        assert peak_tflops is not None and memory_gib is not None
        assert intra_node_gbps is not None and inter_node_gbps is not None
        return Device("custom", memory_gib, {"bf16": peak_tflops * _T}, intra_node_gbps,
                      inter_node_gbps, "given on the command line")
    key = (name or "h100-sxm").lower()
    if key not in DEVICES:
        raise ValueError(f"--gpu {name!r} is not a known device; known: "
                         f"{', '.join(DEVICES)} (or give --peak-tflops, --memory-gib, "
                         f"--intra-node-gbps and --inter-node-gbps for another one).")
    base = DEVICES[key]
    peak = base.peak_flops if peak_tflops is None else {
        k: peak_tflops * _T for k in base.peak_flops}
    return Device(base.name, base.memory_gib if memory_gib is None else memory_gib, peak,
                  base.intra_node_gbps if intra_node_gbps is None else intra_node_gbps,
                  base.inter_node_gbps if inter_node_gbps is None else inter_node_gbps,
                  base.source)
