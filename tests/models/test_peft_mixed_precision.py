"""LoRA adapters stay fp32 on a bf16 base (``peft``'s ``autocast_adapter_dtype``) under FSDP2,
with autocast (``amp_bf16`` and ``mixed_precision: DEFAULT``: computed in bf16, kept and
updated in fp32) and without (``fp32`` and ``mixed_precision: FULL``); the bf16 base is
sharded and never changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("peft")

from cadence import dist  # noqa: E402
from tests.models.test_peft import base_model, run  # noqa: E402


@pytest.mark.world_size(2)
@pytest.mark.parametrize("precision,mixed_precision", [("amp_bf16", "DEFAULT"),
                                                       ("fp32", "FULL")])
def test_adapters_stay_fp32_on_a_bf16_base_under_fsdp(tmp_path: Path, precision: str,
                                                       mixed_precision: str) -> None:
    from torch.distributed.tensor import DTensor

    from cadence.models.gpt import hf_pretrained

    folder = tmp_path / "base"
    if dist.get_global_rank() == 0:
        base_model(dropout=0.0).save_pretrained(folder)
    dist.barrier()
    model = hf_pretrained(folder, torch_dtype="bfloat16", peft={
        "peft_type": "LORA", "r": 4, "target_modules": ["c_attn"], "fan_in_fan_out": True})
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses, _ = run(tmp_path / "run", model, precision=precision,
                    parallelism_config={"fsdp": {"mixed_precision": mixed_precision}})
    assert len(losses) == 8 and all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    changed: list[str] = []
    for name, param in model.named_parameters():
        assert isinstance(param, DTensor), name  # sharded, adapters and base alike
        full: Any = param.full_tensor()
        if param.requires_grad:
            assert "lora_" in name and full.dtype == torch.float32, (name, full.dtype)
            if not torch.equal(full, before[name]):
                changed.append(name)
        else:
            assert full.dtype == torch.bfloat16 and torch.equal(full, before[name]), name
    assert any("lora_B" in name for name in changed), changed  # B starts at 0: it learned
