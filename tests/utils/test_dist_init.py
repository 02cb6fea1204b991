"""``dist.initialize_dist`` takes every form of device Composer's does: llm-foundry calls it
with a Device (``dist.initialize_dist(get_device(None), timeout=...)``), which once raised
``TypeError`` from ``torch.device(DeviceCPU())`` before the group was made."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cadence.devices import DeviceCPU
from cadence.utils import dist


class _CudaLike(DeviceCPU):
    """A Device whose ``torch_device`` is CUDA (no GPU is needed to read its type)."""

    def __init__(self) -> None:
        self._device = torch.device("cuda", 0)


@pytest.mark.parametrize("device, expected", [
    ("cpu", "cpu"), ("gpu", "cuda"), ("cuda:1", "cuda"), (torch.device("cpu"), "cpu"),
    (DeviceCPU(), "cpu"), (_CudaLike(), "cuda"),
    (None, "cuda" if torch.cuda.is_available() else "cpu")])
def test_device_forms_pick_the_backend_device(device: Any, expected: str) -> None:
    assert dist._device_type(device) == expected


def test_a_device_object_creates_a_gloo_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun's environment (2 ranks, no group yet), a DeviceCPU picks gloo."""
    made: list[dict[str, Any]] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist.torch_dist, "init_process_group", lambda **kw: made.append(kw))
    monkeypatch.setattr(dist, "destroy_process_group_at_exit", lambda: None)
    monkeypatch.setattr(dist, "_dist_timeout_s", dist._dist_timeout_s)  # put back after
    dist.initialize_dist(DeviceCPU(), timeout=30)
    assert made[0]["backend"] == "gloo"
    assert made[0]["timeout"].total_seconds() == 30
