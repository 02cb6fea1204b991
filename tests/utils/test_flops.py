"""The peak-FLOP/s table (looked up by device name, no GPU needed) and the PaLM count."""

from __future__ import annotations

from typing import Optional

import pytest
import torch

from cadence.utils.flops import (
    PEAK_FLOPS, device_key, device_peak_flops, peak_flops, precision_key,
    transformer_flops_per_token,
)

T = 1e12


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 80GB HBM2e", "h100-pcie"), ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200"), ("NVIDIA H200 NVL", "h200-nvl"), ("NVIDIA B200", "b200"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"), ("NVIDIA L40S", "l40s"), ("NVIDIA A10G", "a10g"),
    ("NVIDIA A10", "a10"), ("Tesla V100-SXM2-16GB", "v100-sxm"),
    ("Tesla V100-PCIE-32GB", "v100-pcie"), ("Tesla T4", "t4"), ("h100-sxm", "h100-sxm"),
    ("NVIDIA GeForce RTX 3090", None), ("AMD Instinct MI300X", None),
])
def test_device_names_map_to_table_keys(name: str, key: Optional[str]) -> None:
    assert device_key(name) == key


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "amp_bf16", 989.4 * T),
    ("NVIDIA H100 80GB HBM3", "tf32", 494.7 * T),
    ("NVIDIA H100 80GB HBM3", "fp32", 66.9 * T),
    ("NVIDIA H100 PCIe", "bf16", 756.0 * T),
    ("NVIDIA H100 PCIe", "fp8", 1513.0 * T),
    ("NVIDIA H200", "amp_fp16", 989.4 * T),
    ("NVIDIA H100 NVL", "bf16", 835.5 * T),
    ("NVIDIA B200", "bf16", 2250.0 * T),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0 * T),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156.0 * T),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5 * T),
    ("NVIDIA L40S", "bf16", 362.05 * T),
    ("NVIDIA A10G", "amp_bf16", 125.0 * T),
    ("Tesla T4", "amp_fp16", 65.0 * T),
    ("Tesla T4", "amp_bf16", None),  # no bf16 tensor cores: no figure, so no MFU
    ("Tesla V100-SXM2-16GB", "tf32", None),
    ("NVIDIA GeForce RTX 3090", "bf16", None),
])
def test_peak_lookup_by_name_and_precision(name: str, precision: str,
                                           peak: Optional[float]) -> None:
    assert peak_flops(name, precision) == peak


def test_table_is_dense_and_ordered() -> None:
    """Every device's figures fall with precision (fp8 >= bf16 = fp16 >= tf32 >= fp32) and
    the bf16 figure is half NVIDIA's sparse figure where a data sheet prints one."""
    order = ("fp8", "bf16", "fp16", "tf32", "fp32")
    for key, figures in PEAK_FLOPS.items():
        present = [figures[p] for p in order if p in figures]
        assert present == sorted(present, reverse=True), key
        if "bf16" in figures:
            assert figures["bf16"] == figures["fp16"], key
    assert PEAK_FLOPS["h200"]["bf16"] * 2 == pytest.approx(1979 * T, rel=1e-3)


def test_precision_keys() -> None:
    assert precision_key("amp_bf16") == "bf16" and precision_key("amp_fp16") == "fp16"
    assert precision_key("fp32", allow_tf32=False) == "fp32"
    assert precision_key("fp32", allow_tf32=True) == "tf32"
    with pytest.raises(ValueError, match="amp_bf16"):
        precision_key("int3")


def test_device_peak_reads_the_cuda_name_and_tf32_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert device_peak_flops("cpu", "fp32") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L40S")
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert device_peak_flops("cuda", "fp32") == 91.6 * T
        torch.backends.cuda.matmul.allow_tf32 = True
        assert device_peak_flops("cuda", "fp32") == 183.0 * T
    finally:
        torch.set_float32_matmul_precision(before)
    assert device_peak_flops("cuda:0", "amp_bf16") == 362.05 * T


def test_palm_count_for_gpt2_small() -> None:
    # GPT-2 124M: 123,653,376 parameters in matmuls (all but the 1024 x 768 position table).
    n, L, H, d, T_ = 123_653_376, 12, 12, 768, 1024
    assert transformer_flops_per_token(n, L, H, d // H, T_) == 6 * n + 12 * L * d * T_
    assert transformer_flops_per_token(n, L, H, d // H, T_) == 855_166_464
