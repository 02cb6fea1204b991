"""Peak FLOP/s of accelerators, and the model-FLOPs count of a transformer, for MFU.

MFU (model FLOPs utilisation, Chowdhery et al. 2022, "PaLM", Appendix B) is the model
FLOPs a run does per second divided by the device's peak FLOP/s. This module holds both
halves in one place: :data:`PEAK_FLOPS` (dense peaks, keyed by device and precision), read
by :class:`~cadence.callbacks.SpeedMonitor` and ``benchmarks/gpu_throughput.py``, and
:func:`transformer_flops_per_token` (the PaLM count), used by
:meth:`cadence.models.HuggingFaceModel.flops_per_batch`.

Precision keys: ``"fp32"`` (plain fp32 matmuls, no tensor cores), ``"tf32"`` (fp32 tensors,
TF32 tensor-core matmuls), ``"bf16"``, ``"fp16"``, ``"fp8"``. A trainer precision maps to
one with :func:`precision_key` (``amp_bf16`` -> ``bf16``; ``fp32`` -> ``tf32`` when
PyTorch lets fp32 matmuls use TF32).
"""

from __future__ import annotations

import re
from typing import Optional, Union

import torch

__all__ = [
    "PEAK_FLOPS", "PRECISION_KEYS", "device_key", "peak_flops", "precision_key",
    "device_peak_flops", "transformer_flops_per_token",
]

_T = 1e12  # one TFLOP/s, in FLOP/s

#: Dense (no 2:4 sparsity) peak FLOP/s per device, by precision key. NVIDIA's data sheets
#: print tensor-core figures "with sparsity", twice the dense rate; those are halved here.
#: A precision a device has no tensor-core path for (bf16 on V100 and T4) is absent.
#:
#: Sources:
#:
#: - ``h100-sxm``, ``h100-pcie``: "NVIDIA H100 Tensor Core GPU Architecture" white paper
#:   (2022), Table 3 (dense figures: SXM5 bf16 989.4, tf32 494.7, fp8 1978.9, fp32 66.9;
#:   PCIe bf16 756, tf32 378, fp8 1513, fp32 51.2 TFLOP/s).
#: - ``h100-nvl``: NVIDIA H100 data sheet, H100 NVL column (per GPU, with sparsity: bf16
#:   1,671, tf32 835, fp8 3,341; fp32 60 TFLOP/s).
#: - ``h200``, ``h200-nvl``: NVIDIA H200 data sheet (SXM: the H100 SXM5 rates, bf16 1,979
#:   with sparsity; NVL: bf16 1,671, tf32 835, fp8 3,341 with sparsity, fp32 60 TFLOP/s).
#: - ``b200``: NVIDIA HGX B200 specifications (8 GPUs, with sparsity: bf16 36, tf32 18,
#:   fp8 72 PFLOP/s; fp32 600 TFLOP/s), divided by 8 GPUs and by 2.
#: - ``a100``: NVIDIA A100 data sheet (SXM4 and PCIe alike: bf16 312, tf32 156, fp32 19.5).
#: - ``l40s``: NVIDIA L40S data sheet (bf16 362.05, tf32 183, fp8 733, fp32 91.6 dense).
#: - ``a10``, ``a10g``: NVIDIA A10 data sheet (bf16 125, tf32 62.5, fp32 31.2); AWS's A10G
#:   (g5 instances) has no NVIDIA data sheet and is taken at the A10's rates, as Composer
#:   and Lightning do.
#: - ``v100-sxm``, ``v100-pcie``: NVIDIA V100 data sheet (fp16 125 / 112, fp32 15.7 / 14).
#: - ``t4``: NVIDIA T4 data sheet (fp16 65, fp32 8.1).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h100-sxm": {"fp8": 1978.9 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T,
                 "tf32": 494.7 * _T, "fp32": 66.9 * _T},
    "h100-pcie": {"fp8": 1513.0 * _T, "bf16": 756.0 * _T, "fp16": 756.0 * _T,
                  "tf32": 378.0 * _T, "fp32": 51.2 * _T},
    "h100-nvl": {"fp8": 1670.5 * _T, "bf16": 835.5 * _T, "fp16": 835.5 * _T,
                 "tf32": 417.5 * _T, "fp32": 60.0 * _T},
    "h200": {"fp8": 1978.9 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T,
             "tf32": 494.7 * _T, "fp32": 66.9 * _T},
    "h200-nvl": {"fp8": 1670.5 * _T, "bf16": 835.5 * _T, "fp16": 835.5 * _T,
                 "tf32": 417.5 * _T, "fp32": 60.0 * _T},
    "b200": {"fp8": 4500.0 * _T, "bf16": 2250.0 * _T, "fp16": 2250.0 * _T,
             "tf32": 1125.0 * _T, "fp32": 75.0 * _T},
    "a100": {"bf16": 312.0 * _T, "fp16": 312.0 * _T, "tf32": 156.0 * _T, "fp32": 19.5 * _T},
    "l40s": {"fp8": 733.0 * _T, "bf16": 362.05 * _T, "fp16": 362.05 * _T,
             "tf32": 183.0 * _T, "fp32": 91.6 * _T},
    "a10g": {"bf16": 125.0 * _T, "fp16": 125.0 * _T, "tf32": 62.5 * _T, "fp32": 31.2 * _T},
    "a10": {"bf16": 125.0 * _T, "fp16": 125.0 * _T, "tf32": 62.5 * _T, "fp32": 31.2 * _T},
    "v100-sxm": {"fp16": 125.0 * _T, "fp32": 15.7 * _T},
    "v100-pcie": {"fp16": 112.0 * _T, "fp32": 14.0 * _T},
    "t4": {"fp16": 65.0 * _T, "fp32": 8.1 * _T},
}

#: The precision keys of :data:`PEAK_FLOPS`.
PRECISION_KEYS = ("fp8", "bf16", "fp16", "tf32", "fp32")

# Device name -> table key: the first rule whose words all occur in the name's words (the
# name split at anything not a letter or digit, upper-cased, so "A10" never matches "A100").
# Examples of torch.cuda.get_device_name(): "NVIDIA H100 80GB HBM3" (SXM5), "NVIDIA H100
# PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA B200", "NVIDIA A100-SXM4-80GB",
# "NVIDIA A100 80GB PCIe", "NVIDIA L40S", "NVIDIA A10G", "Tesla V100-SXM2-16GB", "Tesla T4".
_NAME_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("h200-nvl", ("H200", "NVL")),
    ("h200", ("H200",)),  # the SXM part; its name does not say so
    ("h100-nvl", ("H100", "NVL")),
    ("h100-pcie", ("H100", "PCIE")),
    ("h100-pcie", ("H100", "HBM2E")),  # the 80 GB PCIe card's other name
    ("h100-sxm", ("H100",)),  # "NVIDIA H100 80GB HBM3"
    ("b200", ("B200",)),
    ("a100", ("A100",)),
    ("l40s", ("L40S",)),
    ("a10g", ("A10G",)),
    ("a10", ("A10",)),
    ("v100-pcie", ("V100", "PCIE")),
    ("v100-sxm", ("V100",)),
    ("t4", ("T4",)),
)

_PRECISION_ALIASES = {
    "amp_bf16": "bf16", "bf16": "bf16", "bfloat16": "bf16",
    "amp_fp16": "fp16", "fp16": "fp16", "float16": "fp16",
    "amp_fp8": "fp8", "fp8": "fp8",
    "tf32": "tf32", "fp32": "fp32", "float32": "fp32",
}


def device_key(device_name: str) -> Optional[str]:
    """The :data:`PEAK_FLOPS` key for a device name as ``torch.cuda.get_device_name()``
    returns it (``"NVIDIA H100 80GB HBM3"`` -> ``"h100-sxm"``), or a table key itself;
    ``None`` for a device not in the table."""
    if device_name.lower() in PEAK_FLOPS:
        return device_name.lower()
    words = set(re.split(r"[^0-9A-Z]+", device_name.upper()))
    for key, needles in _NAME_RULES:
        if all(needle in words for needle in needles):
            return key
    return None


def precision_key(precision: str, allow_tf32: Optional[bool] = None) -> str:
    """The :data:`PEAK_FLOPS` precision key for a trainer precision.

    Args:
        precision: ``"fp32"``, ``"amp_bf16"``, ``"amp_fp16"``, ``"amp_fp8"``, or a table key.
        allow_tf32: whether fp32 matmuls run on tensor cores; ``None`` reads PyTorch's
            setting: ``torch.get_float32_matmul_precision()`` other than ``"highest"``
            (``"high"``, which ``torch.backends.cuda.matmul.allow_tf32 = True`` also sets,
            or ``"medium"``) counts as TF32. Only used for ``fp32``.

    Raises:
        ValueError: an unknown precision (the message lists the known ones).
    """
    try:
        key = _PRECISION_ALIASES[str(precision).lower()]
    except KeyError:
        raise ValueError(f"Unknown precision {precision!r} for a peak-FLOP/s lookup; known: "
                         f"{', '.join(sorted(_PRECISION_ALIASES))}.") from None
    if key == "fp32":
        if allow_tf32 is None:
            allow_tf32 = torch.get_float32_matmul_precision() != "highest"
        if allow_tf32:
            return "tf32"
    return key


def peak_flops(device_name: str, precision: str = "bf16") -> Optional[float]:
    """The dense peak FLOP/s of a device at a precision, from :data:`PEAK_FLOPS`.

    Args:
        device_name: ``torch.cuda.get_device_name()`` output or a table key.
        precision: a precision key or trainer precision (``amp_bf16``); ``fp32`` means plain
            fp32 here (pass ``tf32`` for TF32 matmuls).

    Returns:
        FLOP/s (e.g. ``989.4e12`` for an H100 SXM in bf16), or ``None`` when the device is
        not in the table or has no figure for that precision.

    Raises:
        ValueError: an unknown precision.
    """
    key = device_key(device_name)
    if key is None:
        return None
    return PEAK_FLOPS[key].get(precision_key(precision, allow_tf32=False))


def device_peak_flops(device: Union[str, torch.device], precision: str) -> Optional[float]:
    """The dense peak FLOP/s of ``device`` (a CUDA device, read by its name) at a trainer
    ``precision`` (``fp32`` counts as ``tf32`` when PyTorch allows TF32 matmuls); ``None``
    for a CPU, an unknown GPU or a precision it has no figure for."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    key = device_key(torch.cuda.get_device_name(device))
    if key is None:
        return None
    return PEAK_FLOPS[key].get(precision_key(precision))


def transformer_flops_per_token(n_params: int, n_layer: int, n_heads: int, head_dim: int,
                                seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token of a decoder-only transformer.

    ``6 N + 12 L H Q T`` (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with
    Pathways", Appendix B): ``6 N`` for the matmuls of the ``N`` parameters (2 FLOPs per
    multiply-add forward, twice that backward), and ``12 L H Q T`` for the attention score
    (``Q K^T``) and value (``A V``) matmuls over ``T`` positions in ``L`` layers of ``H``
    heads of width ``Q``. Activation recomputation is not counted (MFU, not hardware
    FLOPs utilisation). nanoGPT's ``GPT.estimate_mfu`` uses the same count.

    Args:
        n_params: ``N``, parameters that take part in matmuls (embedding look-ups do not;
            an embedding tied to the output projection counts once, as that projection).
        n_layer: ``L``, transformer blocks.
        n_heads: ``H``, attention heads per block.
        head_dim: ``Q``, width of one head (``d_model / H`` for GPT-2).
        seq_len: ``T``, the sequence length attended over, in tokens.

    Returns:
        FLOPs per token.
    """
    return 6.0 * n_params + 12.0 * n_layer * n_heads * head_dim * seq_len
